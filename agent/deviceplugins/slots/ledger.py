"""Writes to one Instance's slots from this node: claims, frees and reservations.

A ``SlotLedger`` holds the one lock per Instance that ``Allocate``, freeing and reservation
moves all take, and writes JSON merge patches carrying ``metadata.resourceVersion``, so each
write lands only on the object it was judged on (409 otherwise: re-read and judge again, at
most ``MAX_WRITE_ATTEMPTS`` times). A claim of a free, unreserved slot writes ``deviceUsage``
only; the reservation follows the use at the next reconcile. In memory it keeps what the
``Allocate`` fast path and the orphan freer need: ``latest`` (our last write, until the watch
delivers it), ``promised``, ``releasing`` and ``freeing`` (each set before the operation's first
``await``), and ``handouts``. Why these keep a slot to one pod: docs/slots.md (C2, C6, C8).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.deviceplugins.slots.rules import Verdict, judge_claim, reservation_of, usage_of
from agent.kube.client import InstanceResource, as_dict, is_conflict, is_not_found
from crds.instance import Instance, SlotUsage

log = logging.getLogger(__name__)

#: Bound on re-read-and-retry rounds after 409 Conflicts, per operation.
MAX_WRITE_ATTEMPTS = 8
#: How many resourceVersions the watch delivered are remembered, to tell whether it has
#: already delivered one of our writes when the write's response comes in.
SEEN_VERSIONS = 16


class SlotUnavailable(Exception):
    """A slot cannot be claimed: held by or reserved for another, or not a slot at all."""

    def __init__(self, slot: str, verdict: Verdict, detail: str) -> None:
        super().__init__(f"slot {slot}: {verdict.value} ({detail})")
        self.slot = slot
        self.verdict = verdict


class InstanceGone(Exception):
    """The Instance no longer exists."""


class TooManyConflicts(Exception):
    """Every write attempt lost a race; the caller reports it and may try again later."""


class SlotLedger:
    """One Instance's slot writes for ``node``; all serialised by ``lock``."""

    def __init__(self, *, client: AsyncClient, node: str, namespace: str, name: str) -> None:
        self._client = client
        self.node = node
        self.namespace = namespace
        self.name = name
        self.lock = asyncio.Lock()
        #: The Instance as our last slot write returned it, while the watch has not delivered
        #: that version yet (None once it has).
        self.latest: Instance | None = None
        self._seen: deque[str] = deque(maxlen=SEEN_VERSIONS)
        #: The newest copy the watch delivered: after a 409 it may already be the version that
        #: refused the write, and a reservation move retries on it instead of reading.
        self._watched: Instance | None = None
        #: Slots answered to the kubelet by the fast path and not yet recorded, with the usage.
        self.promised: dict[str, SlotUsage] = {}
        #: Slots whose reservation a release in flight gives back, and slots a free in flight
        #: sets free.
        self.releasing: set[str] = set()
        self.freeing: set[str] = set()
        #: Slot → how many times this agent has handed it to a pod (any ``Allocate`` that
        #: answered with it, a re-used virtual id or a held slot confirmed again included).
        #: The orphan freer frees a slot only if this count has not moved since the
        #: pod-resources ``List`` it judged on (docs/slots.md, C8).
        self.handouts: dict[str, int] = {}

    def handed_out(self, slots: Iterable[str]) -> None:
        """``slots`` were just handed to a pod: any evidence taken before is stale for them."""
        for slot in slots:
            self.handouts[slot] = self.handouts.get(slot, 0) + 1

    def handouts_of(self, slot: str) -> int:
        return self.handouts.get(slot, 0)

    def current(self, watched: Instance | None) -> Instance | None:
        """The newest state of this Instance we know: our last write until the watch has it."""
        return self.latest if self.latest is not None else watched

    def seen(self, instance: Instance) -> None:
        """The watch delivered ``instance``; from our last write on, its copies are current."""
        self._seen.append(instance.resource_version)
        self._watched = instance
        if self.latest is not None and instance.resource_version == self.latest.resource_version:
            self.latest = None

    def forget_latest(self) -> None:
        """The watch starts over (a relist follows): its copies are current again."""
        self.latest = None

    def _wrote(self, instance: Instance) -> Instance:
        # The watch may deliver our write before its HTTP response is read.
        self.latest = None if instance.resource_version in self._seen else instance
        return instance

    async def read(self) -> Instance:
        try:
            obj = await self._client.get(InstanceResource, self.name, namespace=self.namespace)
        except ApiError as error:
            if is_not_found(error):
                raise InstanceGone(f"Instance {self.namespace}/{self.name} is gone") from error
            raise
        return Instance.from_object(as_dict(obj))

    async def claim(
        self, wanted: Mapping[str, SlotUsage], *, known: Instance | None = None,
        held_by_pod: bool = False,
    ) -> Instance:
        """Put ``wanted`` (slot → usage by this node) into deviceUsage, all or nothing.

        The caller holds ``lock``. Raises ``SlotUnavailable`` naming the first slot that is not
        ours to take, ``InstanceGone``, or ``TooManyConflicts``. ``held_by_pod``: the slots are
        a pod's already (a promise being recorded, a live pod's slot adopted), so claims
        counted since do not withhold them (docs/slots.md, C16).

        ``known`` is the Instance as the caller's watch last saw it. When it says a write is
        needed, the first attempt writes on its ``resourceVersion`` without reading: the write
        is conditioned, so a stale copy costs a 409 and a re-read, never a wrong claim. Any
        other verdict from it (a refusal, or "held already" for every slot, which writes
        nothing and so proves nothing) is confirmed on a fresh read first.
        """
        for _ in range(MAX_WRITE_ATTEMPTS):
            if known is not None:
                instance, known = known, None
                verdicts = self._judge(instance, wanted)
                if not _confirmed_by_write(verdicts):
                    instance = await self.read()
                    verdicts = self._judge(instance, wanted)
            else:
                instance = await self.read()
                verdicts = self._judge(instance, wanted)
            for slot, verdict in verdicts.items():
                promise = self.promised.get(slot)
                if promise is not None and promise != wanted[slot]:
                    # Handed to a pod by the fast path, not recorded yet: it is not free.
                    verdict = verdicts[slot] = Verdict.HELD_ELSEWHERE
                elif held_by_pod and verdict is Verdict.HELD_BY_CLAIMS:
                    verdict = verdicts[slot] = Verdict.CLAIM  # the pod has it: record that
                if verdict.refused:
                    detail = (
                        f"deviceUsage={instance.spec.device_usage.get(slot, '')!r}, "
                        f"reserved for {reservation_of(instance, slot)!r}, "
                        f"claims={instance.claims}"
                    )
                    raise SlotUnavailable(slot, verdict, detail)
            to_write = {
                s: wanted[s].format() for s, v in verdicts.items() if v is not Verdict.HELD_ALREADY
            }
            if not to_write:
                return instance
            try:
                return await self._patch_usage(instance.resource_version, to_write)
            except ApiError as error:
                if not is_conflict(error):
                    raise
                log.info("slot claim lost a race; re-reading", extra={"instance": self.name})
        raise TooManyConflicts(f"claiming {sorted(wanted)} on {self.namespace}/{self.name}")

    @staticmethod
    def _judge(instance: Instance, wanted: Mapping[str, SlotUsage]) -> dict[str, Verdict]:
        return {slot: judge_claim(instance, slot, want) for slot, want in wanted.items()}

    async def free(self, slots: Mapping[str, SlotUsage]) -> Instance | None:
        """Set each slot free if it still carries the given usage. The caller holds ``lock``.

        Returns None when the Instance is gone (before or during the write): nothing to free.
        The slots are marked ``freeing`` meanwhile, so the fast path leaves them alone. A
        caller freeing on evidence (the orphan freer) checks ``handouts_of`` first, with no
        ``await`` between that check and this call.
        """
        self.freeing.update(slots)
        try:
            return await self._free(slots)
        finally:
            self.freeing.difference_update(slots)

    async def _free(self, slots: Mapping[str, SlotUsage]) -> Instance | None:
        for _ in range(MAX_WRITE_ATTEMPTS):
            try:
                instance = await self.read()
            except InstanceGone:
                return None
            to_free = {s: "" for s, u in slots.items() if usage_of(instance, s) == u}
            if not to_free:
                return instance
            try:
                return await self._patch_usage(instance.resource_version, to_free)
            except ApiError as error:
                if is_not_found(error):
                    return None
                if not is_conflict(error):
                    raise
        raise TooManyConflicts(f"freeing {sorted(slots)} on {self.namespace}/{self.name}")

    async def reserve(
        self, slots: list[str], *, demand: int | None = None, known: Instance | None = None
    ) -> None:
        """Reserve free slots that nobody (still listed) holds in reserve. Holds ``lock``.

        With ``demand``, this node's ``status.demand`` is set in the same conditioned write, so
        no other node acts on a demand these reservations have just met. ``known``: as for
        ``claim``, the first attempt writes on that copy's ``resourceVersion`` without a read.
        """
        await self._move_reservations(slots, release=False, demand=demand, known=known)

    async def release(self, slots: list[str], *, known: Instance | None = None) -> None:
        """Give back reservations of ours on slots we do not use. Holds ``lock``.

        Slots the fast path has promised are kept; the others are marked ``releasing`` from
        now until the write is done, so the fast path leaves them to a conditioned claim.
        ``known`` as for ``reserve``.
        """
        slots = [s for s in slots if s not in self.promised]
        self.releasing.update(slots)
        try:
            await self._move_reservations(slots, release=True, known=known)
        finally:
            self.releasing.difference_update(slots)

    async def publish_demand(self, demand: int) -> None:
        """Set this node's key of ``status.demand`` (removed when zero). Only this node writes
        its key, so the merge patch needs no condition; it only steers reservations."""
        await self._client.patch(
            InstanceResource.Status,
            self.name,
            {"status": {"demand": {self.node: demand or None}}},
            namespace=self.namespace,
            patch_type=PatchType.MERGE,
        )
        log.info("demand published", extra={"instance": self.name, "demand": demand})

    def _reservation_changes(
        self, instance: Instance, slots: list[str], *, release: bool
    ) -> dict[str, str | None]:
        changes: dict[str, str | None] = {}
        for slot in slots:
            usage, holder = usage_of(instance, slot), reservation_of(instance, slot)
            if release and holder == self.node and usage.is_free:
                changes[slot] = None  # JSON merge patch: null deletes the key
            elif not release and holder is None and (usage.is_free or usage.node == self.node):
                changes[slot] = self.node
            elif not release and holder != self.node and usage.node == self.node:
                changes[slot] = self.node  # we hold it: the reservation follows the use
        return changes

    async def _move_reservations(
        self, slots: list[str], *, release: bool, demand: int | None = None,
        known: Instance | None = None,
    ) -> None:
        for _ in range(MAX_WRITE_ATTEMPTS):
            # The caller's copy spares the read (a GET before every reservation write): the write is
            # conditioned on its resourceVersion, so a stale copy costs a 409 and a re-read, never a
            # wrong move. "Nothing to change" on it writes nothing and so proves nothing: a fresh
            # read decides that.
            if known is not None:
                instance, known = known, None
                changes = self._reservation_changes(instance, slots, release=release)
                if not changes:
                    instance = await self.read()
                    changes = self._reservation_changes(instance, slots, release=release)
            else:
                instance = await self.read()
                changes = self._reservation_changes(instance, slots, release=release)
            if not changes:
                return
            version = instance.resource_version
            status: dict[str, Any] = {"reservations": changes}
            if demand is not None:
                status["demand"] = {self.node: demand or None}
            try:
                self._wrote(await self._patch_status(instance.resource_version, status))
                log.info(
                    "reservations changed",
                    extra={"instance": self.name, "node": self.node, "changes": changes},
                )
                return
            except ApiError as error:
                if not is_conflict(error):
                    raise
            # Refused as stale: a copy the watch has delivered since is newer, and judging on it
            # costs no read (the write stays conditioned on it).
            if self._watched is not None and self._watched.resource_version != version:
                known = self._watched
        raise TooManyConflicts(f"moving reservations {slots} on {self.namespace}/{self.name}")

    async def _patch_status(self, version: str, status: dict[str, Any]) -> Instance:
        obj = await self._client.patch(
            InstanceResource.Status,
            self.name,
            {"metadata": {"resourceVersion": version}, "status": status},
            namespace=self.namespace,
            patch_type=PatchType.MERGE,
        )
        return Instance.from_object(as_dict(obj))

    async def _patch_usage(self, version: str, usage: Mapping[str, str]) -> Instance:
        obj = await self._client.patch(
            InstanceResource,
            self.name,
            {"metadata": {"resourceVersion": version}, "spec": {"deviceUsage": dict(usage)}},
            namespace=self.namespace,
            patch_type=PatchType.MERGE,
        )
        # status.used is left to the service's reconcile (woken by this write's watch event),
        # keeping a claim to one conditioned write.
        return self._wrote(Instance.from_object(as_dict(obj)))

    async def write_used(self, instance: Instance) -> None:
        """Best effort: ``status.used`` and ``status.nodes`` for ``kubectl get instances``
        (display fields), conditioned on the object they were computed from."""
        try:
            await self._client.patch(
                InstanceResource.Status,
                self.name,
                {
                    "metadata": {"resourceVersion": instance.resource_version},
                    "status": {"used": instance.spec.used, "nodes": instance.spec.nodes_shown},
                },
                namespace=self.namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            # A newer write won; the next reconcile writes the count from the newer object.
            log.debug("status.used not written", extra={"instance": self.name, "error": str(error)})


def _confirmed_by_write(verdicts: Mapping[str, Verdict]) -> bool:
    """A claim a conditioned write will confirm: no refusal, and at least one slot to write.

    If that write succeeds, the object had not changed since the copy it was judged on, so
    every verdict (including "held already" for the other slots) held at the moment of writing.
    """
    writes = {Verdict.CLAIM, Verdict.RESERVE_AND_CLAIM}
    values = set(verdicts.values())
    return bool(values & writes) and values <= writes | {Verdict.HELD_ALREADY}
