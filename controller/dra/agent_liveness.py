"""Which nodes' agents are gone: their liveness Lease not renewed within a grace (``--dra``).

``AgentLiveness.run`` watches the agents' Leases and tells its listeners the whole set of gone
nodes each time it changes (the shared pools drop them, ``agent_gone_taints`` taints their local
pools). How a loss is confirmed and why an outage takes no agent for gone: docs/architecture.md,
"The controller's DRA side"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final

import msgspec

from controller.kube.rest import ApiFailure, Rest, status_message
from controller.kube.watching import Kind, Watcher
from controller.settings import DraSettings
from crds import agent_liveness, dra_slices

log = logging.getLogger(__name__)

HTTP_OK: Final = 200
HTTP_FORBIDDEN: Final = 403
#: A taint value says which node's agent is gone (label value rules: at most 63 characters).
_TAINT_VALUE_MAX: Final = 63


class _LeaseSpec(msgspec.Struct):
    renewTime: str = ""
    leaseDurationSeconds: int = 0


class _LeaseMeta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""


class _Lease(msgspec.Struct):
    metadata: _LeaseMeta = msgspec.field(default_factory=_LeaseMeta)
    spec: _LeaseSpec = msgspec.field(default_factory=_LeaseSpec)


class _LeaseList(msgspec.Struct):
    items: list[_Lease] = msgspec.field(default_factory=list)


_decode_lease = msgspec.json.Decoder(_Lease).decode
_decode_list = msgspec.json.Decoder(_LeaseList).decode


@dataclass(frozen=True)
class AgentLease:
    """What the controller keeps of one agent's Lease."""

    node: str
    renewed: str  # spec.renewTime as the agent wrote it: only its changes count
    duration_s: int


def _record(lease: _Lease) -> AgentLease | None:
    node = agent_liveness.node_of(lease.metadata.name)
    if node is None:
        return None
    return AgentLease(node=node, renewed=lease.spec.renewTime,
                      duration_s=max(0, lease.spec.leaseDurationSeconds))


def decode_lease(raw: bytes) -> tuple[AgentLease | None, str]:
    lease = _decode_lease(raw)
    return _record(lease), lease.metadata.resourceVersion


def without_gone(plan: dra_slices.PoolPlan, gone: frozenset[str]) -> dra_slices.PoolPlan:
    """A shared pool's plan with the nodes in ``gone`` left out of its selector; when every
    node is gone, its nodes kept and its devices tainted ``TAINT_AGENT_GONE:NoSchedule``
    (a selector must name a node), so no new claim gets it anywhere."""
    if not gone or not gone.intersection(plan.nodes):
        return plan
    left = tuple(n for n in plan.nodes if n not in gone)
    if left:
        return replace(plan, nodes=left)
    taint = {"key": agent_liveness.TAINT_AGENT_GONE, "value": "every-node",
             "effect": "NoSchedule"}
    return replace(plan, devices=tuple(
        {**d, "taints": [*(d.get("taints") or ()), taint]} for d in plan.devices))


class AgentLiveness:
    """Follows the agents' Leases in ``namespace``; ``gone`` is the set of nodes whose agent is
    gone, and each of ``listeners`` is called with it whenever it changes. ``grace_s`` 0:
    never gone."""

    def __init__(self, http: Rest, *, namespace: str, grace_s: float,
                 listeners: Sequence[Callable[[frozenset[str]], None]],
                 forbidden_retry_s: float = DraSettings.liveness_forbidden_retry_s) -> None:
        """``grace_s``: how long a Lease may go unrenewed before its node's agent is taken
        for gone (at least the Lease's own ``leaseDurationSeconds``)."""
        self._forbidden_retry_s = forbidden_retry_s
        self._http = http
        self._grace_s = grace_s
        self._listeners = tuple(listeners)
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._selector = f"{agent_liveness.LABEL_COMPONENT}={agent_liveness.COMPONENT}"
        self._watcher: Watcher[str, AgentLease] = Watcher(
            http=http, on_change=self._changed, kind=Kind(
                name="agent leases", path=self._path, decode=decode_lease,
                key=lambda r: r.node, label_selector=self._selector))
        #: node → when this controller last saw its Lease renewed (monotonic).
        self._seen: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.gone: frozenset[str] = frozenset()
        #: The last confirming read failed: the next one that succeeds starts every grace anew.
        self._blind = False
        self.confirmations = 0  # lists made to confirm a loss, for tests

    def _changed(self, node: str, old: AgentLease | None, new: AgentLease | None) -> None:
        if new is None:
            self._seen.pop(node, None)
            self._set_gone(self.gone - {node})
        elif old is None or old.renewed != new.renewed:
            self._seen[node] = time.monotonic()
            if node in self.gone:
                self._set_gone(self.gone - {node})
        self._wake.set()

    def _set_gone(self, gone: frozenset[str]) -> None:
        if gone == self.gone:
            return
        for node in sorted(gone - self.gone):
            log.warning("node %s's agent is gone (liveness Lease not renewed): its devices "
                        "are no longer offered", node)
        for node in sorted(self.gone - gone):
            log.info("node %s's agent is back: its devices are offered again", node)
        self.gone = gone
        for listener in self._listeners:
            listener(gone)

    def _deadline(self, node: str) -> float:
        record = self._watcher.store.get(node)
        duration = record.duration_s if record is not None else 0
        return self._seen.get(node, time.monotonic()) + max(self._grace_s, duration)

    async def run(self) -> None:
        if self._grace_s <= 0:
            log.info("agent liveness off (grace 0): no node is taken for gone")
            return
        await self._until_allowed()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._watcher.run(), name="agent-leases")
            tasks.create_task(self._time(), name="agent-liveness")

    async def _until_allowed(self) -> None:
        """Wait, saying so once, while this controller may not list the Leases (deploy/dra
        of an earlier release): the watch would otherwise log every retry."""
        said = False
        while True:
            try:
                code, _ = await self._http.request(
                    "GET", self._path, params={"labelSelector": self._selector, "limit": "1"})
            except Exception:  # API away: the watch rides it out and says so
                return
            if code != HTTP_FORBIDDEN:
                return
            if not said:
                log.warning("the controller may not list Leases at %s (apply this release's "
                            "deploy/dra): no node is taken for gone until it may", self._path)
                said = True
            await asyncio.sleep(self._forbidden_retry_s)

    async def _time(self) -> None:
        await self._watcher.synced.wait()
        # Once every Lease seen at start has had its grace, the listeners are told the set even
        # if it did not change: what an earlier controller left (a rule of an agent back
        # since) is then put right.
        first = max([self._deadline(n) for n in self._seen], default=time.monotonic())
        told = False
        while True:
            now = time.monotonic()
            expired = [n for n in self._seen if n not in self.gone and self._deadline(n) <= now]
            if expired:
                await self._confirm(expired)
            if not told and time.monotonic() >= first:
                told = True
                for listener in self._listeners:
                    listener(self.gone)
            live = [self._deadline(n) for n in self._seen if n not in self.gone]
            if not told:
                live.append(first)
            timeout = max(0.0, min(live) - time.monotonic()) if live else None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _confirm(self, expired: list[str]) -> None:
        """Read the Leases once: a node whose renewal the watch had not shown yet is seen
        renewed; the others are gone. Unreadable: every grace starts again once the Leases are
        readable again, so only a grace the controller could watch whole counts."""
        self.confirmations += 1
        try:
            code, body = await self._http.request(
                "GET", self._path, params={"labelSelector": self._selector})
            if code != HTTP_OK:
                raise ApiFailure(code, status_message(code, body))
            listed = {r.node: r for r in map(_record, _decode_list(body).items) if r}
        except Exception as error:  # cut off from the API server: no agent is judged
            log.warning("agent leases not readable (%s): no agent is taken for gone until "
                        "they are", error)
            self._blind = True
            self._restart_graces()
            return
        if self._blind:
            # Readable again: agents that could not renew meanwhile get a whole grace, counted
            # from now, before any is judged.
            self._blind = False
            self._restart_graces()
            return
        gone = set(self.gone)
        for node in expired:
            seen = self._watcher.store.get(node)
            now_listed = listed.get(node)
            if now_listed is None:
                continue  # deleted: the watch forgets it
            if seen is None or now_listed.renewed != seen.renewed:
                self._seen[node] = time.monotonic()  # renewed; the watch will say so too
            else:
                gone.add(node)
        self._set_gone(frozenset(gone))

    def _restart_graces(self) -> None:
        now = time.monotonic()
        self._seen = dict.fromkeys(self._seen, now)


def taint_value(node: str) -> str:
    """The taint's value naming ``node`` (a digest where the name is no label value)."""
    return node if len(node) <= _TAINT_VALUE_MAX else dra_slices.node_label(node)
