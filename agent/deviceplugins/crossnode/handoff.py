"""The give-away gate: what must hold before this node stops advertising a slot it gives away.

The scheduler binds on the Node's ``status.allocatable``, which the kubelet lowers only some
time after a plugin stops advertising a slot; a pod bound in between fails admission.
``HandoffGate.clear`` lowers this Node's count of the slot's resources first
(``NodeAllocatable.set``), while the kubelet still has the slot, then reads consistently the
pods bound here that have not started and request them (``pods_awaiting_admission``), and
restores the count and keeps the slot if there is one. Once the caller stops advertising,
``settle`` waits for the kubelet to take that in (pod-resources ``GetAllocatableResources``),
lowers the count again if needed and reads the pods once more; ``keep_down`` lowers a count the
Node's watch shows above what is advertised. Without the ``nodes/status`` or ``pods list``
grant the gate is open, with one warning. Why no pod bound on the API's counts is refused:
docs/slots.md (C11).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from agent.deviceplugins.kubelet.podresources import PodResourcesClient
from agent.deviceplugins.slots.bound_pods import pods_bound_here
from agent.kube.client import as_dict, is_conflict, is_forbidden
from agent.kube.node_reads import NodeReads
from agent.settings import current
from crds.pinning import extended_requests

log = logging.getLogger(__name__)

#: The domain of every resource this project's plugins serve.
DEVICE_DOMAIN = "edgeplug.io/"

#: Re-read-and-retry rounds after a 409 (the kubelet writes node status concurrently).
MAX_CONFLICTS = 5


class NodeAllocatable:
    """Writes this Node's ``status.allocatable`` for device resources ahead of the kubelet."""

    def __init__(self, *, client: AsyncClient, node: str) -> None:
        self._client = client
        self.node = node
        #: False once the API server refused the write (no grant): the gate is then open.
        self.permitted = True
        #: The Node's allocatable of device resources as its watch last showed it.
        self.shown: dict[str, int] = {}

    def seen(self, node: Node) -> bool:
        """Note the Node's device allocatable from a watch event; True if it changed."""
        allocatable = (node.status.allocatable if node.status else None) or {}
        shown = {}
        for resource, value in allocatable.items():
            if resource.startswith(DEVICE_DOMAIN):
                with contextlib.suppress(ValueError):
                    shown[resource] = int(str(value))
        changed, self.shown = shown != self.shown, shown
        return changed

    def above(self, advertised: Mapping[str, int]) -> dict[str, int]:
        """The resources whose count the Node shows above what this node advertises healthy,
        with the advertised count: a kubelet that wrote its status after the lowering but
        before it took in the withdrawal put the old count back."""
        return {r: n for r, n in advertised.items() if self.shown.get(r, n) > n}

    async def set(self, counts: Mapping[str, int]) -> bool:
        """Make the Node's allocatable of each resource in ``counts`` that count, where the Node
        reports the resource and shows another value. Conditioned on the Node's
        ``resourceVersion`` (the kubelet may be writing its own status); True once written (or
        nothing to write), False if the API server refused or kept conflicting."""
        if not self.permitted:
            return False
        for _ in range(MAX_CONFLICTS):
            node = as_dict(await self._client.get(Node, self.node))
            allocatable: dict[str, Any] = (node.get("status") or {}).get("allocatable") or {}
            changes = {
                resource: str(count)
                for resource, count in counts.items()
                if resource in allocatable and str(allocatable[resource]) != str(count)
            }
            if not changes:
                return True
            patch = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "status": {"allocatable": changes},
            }
            try:
                await self._client.patch(Node.Status, self.node, patch, patch_type=PatchType.MERGE)
            except ApiError as error:
                if is_conflict(error):
                    continue
                if is_forbidden(error):
                    self.permitted = False
                    log.warning(
                        "this agent may not write its Node's allocatable (%s): slots are given "
                        "away without lowering it first, and a pod bound meanwhile may fail "
                        "admission; apply deploy/manifests/agent-rbac.yaml and "
                        "agent-node-policy.yaml of this release", error.status.message)
                    return False
                raise
            log.info("set the scheduler's count ahead of the kubelet node=%s allocatable=%s",
                     self.node, changes)
            return True
        return False


def _requested(pod: Mapping[str, Any], resources: Iterable[str]) -> bool:
    requests = extended_requests(pod.get("spec") or {})
    return any(requests.get(resource) for resource in resources)


async def pods_awaiting_admission(
    client: AsyncClient, node: str, resources: Iterable[str]
) -> list[str]:
    """``namespace/name`` of the pods bound to ``node`` that have not started and request any of
    ``resources`` (``pods_bound_here``): its kubelet may be admitting them."""
    wanted = list(resources)
    awaiting = []
    for obj in await pods_bound_here(client, node):
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" or not _requested(obj, wanted):
            continue
        meta = obj.get("metadata") or {}
        awaiting.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return awaiting


class HandoffGate:
    """The gate itself, and the watch on this Node's counts that keeps them down."""

    def __init__(
        self, *, client: AsyncClient, node: str, pod_resources: PodResourcesClient | None = None,
        reads: NodeReads | None = None,
    ) -> None:
        """``reads``: how the pods bound here are listed (by default with ``client``)."""
        self._client = client
        self._reads = reads or NodeReads(client)
        self.node = node
        self.allocatable = NodeAllocatable(client=client, node=node)
        self._pod_resources = pod_resources
        #: The last ``clear`` failed for a reason that may pass (a conflict): pass again soon.
        self.retry = False

    async def clear(
        self, instance: str, slots: Iterable[str], before: Mapping[str, int],
        after: Mapping[str, int],
    ) -> bool:
        """Whether ``slots`` of ``instance`` may stop being advertised, their resources'
        counts going from ``before`` to ``after``: the Node's count lowered to ``after``, then
        no pod bound here awaiting admission for those resources (if one is, the count is
        restored to ``before``). Without the grant to write the Node, True (ungated, as
        before)."""
        self.retry = False
        try:
            awaiting = await self._lowered_then_awaiting(after)
        except ApiError:
            await self.allocatable.set(before)  # not left lowered while the pass is retried
            raise
        if awaiting is None:
            return not self.allocatable.permitted
        if awaiting:
            log.info("keeping slots a pod bound here may be admitted with instance=%s "
                     "slots=%s pods=%s", instance, sorted(slots), awaiting)
            await self.allocatable.set(before)
            return False
        return True

    async def _lowered_then_awaiting(self, after: Mapping[str, int]) -> list[str] | None:
        """The Node's counts set to ``after``, then the pods bound here that await admission
        for those resources (in that order: a binding written before the count dropped is in
        the read). None when the count could not be written (``retry`` set if that may pass;
        without the grant, the gate is open); [] without the grant."""
        if not self.allocatable.permitted:
            return []
        if not await self.allocatable.set(after):
            self.retry = self.allocatable.permitted
            return None
        try:
            return await pods_awaiting_admission(await self._reads.client(), self.node, after)
        except ApiError as error:
            if not is_forbidden(error):
                raise
            # Granted the Node's count but not the pods (a partial install): the gate cannot
            # see a binding, so it stays open, as without the grant, and says so once.
            log.warning("this agent may not list the pods bound to its node as %s (%s): slots "
                        "are given away without the check for a pod being admitted; give it the "
                        "kubelet's certificate (KUBELET_CLIENT_CERT) or apply "
                        "deploy/token-reads of this release", self._reads.identity,
                        error.status.message)
            self.allocatable.permitted = False
            return []

    async def settle(
        self, withdrawn: Mapping[str, frozenset[str]], after: Mapping[str, int]
    ) -> bool:
        """After the caller stopped advertising the ``withdrawn`` device ids: whether the
        slots may now be released. The kubelet must have taken the withdrawal in (its
        pod-resources ``GetAllocatableResources`` no longer lists them, within
        ``settings.cross_node.withdrawn_within_s``): from then on every node status it computes has
        the lower count. A status it computed before and wrote after the lowering put the old count
        back (the scheduler may have bound a pod here on it): the count is lowered again and the
        pods bound here are read once more; one that awaits admission keeps the slots (the
        caller advertises them again, so that the kubelet admits it with one)."""
        if self._pod_resources is not None and not await self._kubelet_took_in(withdrawn):
            log.info("the kubelet has not taken in the withdrawal of %s within %.0f s; "
                     "keeping the slots", dict(withdrawn), current().cross_node.withdrawn_within_s)
            self.retry = True
            return False
        awaiting = await self._lowered_then_awaiting(after)
        if awaiting is None:
            return not self.allocatable.permitted
        if awaiting:
            log.info("a pod was bound here on the old count; keeping its slots pods=%s",
                     awaiting)
            return False
        return True

    async def _kubelet_took_in(self, withdrawn: Mapping[str, frozenset[str]]) -> bool:
        assert self._pod_resources is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + current().cross_node.withdrawn_within_s
        pause = current().cross_node.first_poll_s
        while True:
            try:
                healthy = await self._pod_resources.allocatable()
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # a kubelet before 1.23
                    log.warning("the kubelet cannot say which devices it holds healthy: slots "
                                "are given away without waiting for it to take a withdrawal in")
                    self._pod_resources = None
                    return True
                log.info("pod-resources GetAllocatableResources failed: %s", error)
                return False
            if not any(ids & healthy.get(r, frozenset()) for r, ids in withdrawn.items()):
                return True
            if loop.time() + pause > deadline:
                return False
            await asyncio.sleep(pause)  # polling the kubelet's state, with a deadline
            pause = min(2 * pause, current().cross_node.max_poll_s)

    async def keep_down(self, advertised: Mapping[str, int]) -> None:
        """Lower the Node's count of a resource again where it shows more than this node
        advertises healthy: the kubelet's own status write raced a give-away's lowering (it
        computed the count before it took in the withdrawal). Never raises one (the kubelet
        does that)."""
        if self.allocatable.permitted and (over := self.allocatable.above(advertised)):
            await self.allocatable.set(over)

