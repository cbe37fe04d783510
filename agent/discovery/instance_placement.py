"""Place each device of a list under one Instance name: the first of its names this node
publishes already, or (shared) one another node made for the same device, or one that is free;
a name held by another device or node is said once, in the log and a Warning Event on the
Configuration. The naming rules: docs/naming.md."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from lightkube import AsyncClient

from agent.discovery.events import emit_event
from agent.discovery.instance_ownership import Holder, Ownership, Wanted, log_extra
from agent.discovery.instance_writes import InstanceWrites
from agent.discovery.name_records import LIST_FROM, recorded_digests
from agent.kube import watching
from crds.api import CONFIGURATION_KIND

log = logging.getLogger(__name__)

#: The Warning Event's reason when a device's Instance name is another node's.
REASON_NAME_TAKEN = "InstanceNameTaken"
#: The Warning Event's reason when two devices would share one Instance name.
REASON_NAME_COLLISION = "InstanceNameCollision"

#: Leave (or delete) an Instance this node owns: (name, shared).
Leave = Callable[[str, bool], Awaitable[None]]


class NamePlacer:
    """Chooses and writes the Instance name of each device of one Configuration's lists."""

    def __init__(self, *, client: AsyncClient, ownership: Ownership, writes: InstanceWrites,
                 leave: Leave) -> None:
        self._client = client
        self._own = ownership
        self._cfg = ownership.cfg
        self._node = ownership.node
        self._writes = writes
        self._leave = leave
        #: Akri names found held by another node's Instance or device (said once each).
        self._taken: set[str] = set()

    async def lookups(self, groups: Sequence[Sequence[Wanted]]) -> Mapping[str, str] | None:
        """The digests the API server's Instances of this list's later names record, read in
        one list when at least ``LIST_FROM`` devices are new to this node (else None: each
        new device's placement reads its own)."""
        new = [w for group in groups for w in group if not self._own.publishes_any(w, group)]
        if len(new) < LIST_FROM:
            return None
        later = {name for group in groups for w in group for name in w.names[1:]}
        found = await recorded_digests(self._client, self._cfg.namespace, later)
        return {name: found.get(name, "") for name in later}

    async def place_group(self, group: Sequence[Wanted], *, shared: bool,
                          records: Mapping[str, str] | None = None,
                          ) -> list[tuple[Wanted, str | None]]:
        """Each device of one Akri name with the name it is published under (None: none)."""
        taken: dict[str, str] = {}  # name → digest of the device of this list given it
        placed: list[tuple[Wanted, str | None]] = []
        for wanted in group:
            name = await self._place(wanted, taken, group, shared=shared, records=records)
            if name is not None:
                taken[name] = wanted.digest
            placed.append((wanted, name))
        return placed

    async def _place(self, wanted: Wanted, taken: Mapping[str, str],
                     group: Sequence[Wanted], *, shared: bool,
                     records: Mapping[str, str] | None = None) -> str | None:
        """Publish ``wanted`` under the first of its names that is this node's already, or
        (shared) another node's for this device, or free; the name, or None."""
        for name in wanted.names:
            if name in taken or not self._own.is_mine(name, wanted, group):
                continue
            refused = await self._writes.ensure(name, wanted, shared=shared)
            if refused is None:
                return name
            # Another device's Instance (an Instance made before digests were recorded, which
            # a node with that device recorded first): this node leaves it.
            log.warning("Instance %s is %s: leaving it", name, refused.description,
                        extra=log_extra(self._cfg, self._node, name))
            await self._leave(name, shared)
        if shared:
            for name in wanted.names[1:]:
                if (name not in taken
                        and await self._records_device(name, wanted.digest, records)
                        and await self._writes.ensure(name, wanted, shared=shared) is None):
                    return name
        akri = wanted.names[0]
        why: Holder | None = None
        for name in wanted.names:
            if name in taken:
                holder = Holder("in this node's list too", taken[name])
            else:
                held = await self._writes.ensure(name, wanted, shared=shared)
                if held is None:
                    if why is not None:
                        await self._say_taken(akri, wanted, why, name, shared=shared)
                    return name
                holder = held
            if name == akri:
                why = holder
        if why is not None:
            await self._say_taken(akri, wanted, why, None, shared=shared)
        return None

    async def _records_device(self, name: str, digest: str,
                              records: Mapping[str, str] | None = None) -> bool:
        """Whether the API server's ``name`` records the device ``digest``: as ``records``
        (this pass's list, ``lookups``) says where it has the name, else one GET."""
        if records is not None and name in records:
            return records[name] == digest
        existing = await self._writes.read(name)
        return existing is not None and (existing.get("spec") or {}).get("deviceDigest") == digest

    async def _say_taken(self, akri: str, wanted: Wanted, holder: Holder,
                         published: str | None, *, shared: bool) -> None:
        """Once per Akri name and device, in the log and a Warning Event on the Configuration:
        ``akri`` is held by ``holder``, and where the device went."""
        key = f"{akri}/{wanted.digest}"
        if key in self._taken:
            return
        self._taken.add(key)
        where = (f"published as {published} instead" if published is not None
                 else "the device is not published on this node until that Instance is "
                      "deleted")
        kind = "shared" if shared else "local"
        if holder.digest:
            reason = REASON_NAME_COLLISION
            message = (f"node {self._node}: {kind} devices {holder.digest} and {wanted.digest} "
                       f"(spec.deviceDigest) share the Instance name {akri}: {akri} stays "
                       f"{holder.digest}'s ({holder.description}); {wanted.digest} is "
                       f"{where}")
        else:
            reason = REASON_NAME_TAKEN
            message = (f"node {self._node}: a {kind} device's Instance name {akri} is held by "
                       f"{holder.description}; {where}")
        extra = log_extra(self._cfg, self._node, akri)
        log.warning("%s", message, extra=extra)
        cfg = self._cfg
        try:
            await emit_event(
                self._client, node=self._node, kind=CONFIGURATION_KIND, name=cfg.name,
                namespace=cfg.namespace, uid=cfg.uid, reason=reason, message=message,
                warning=True)
        except Exception as error:  # the log line stands
            log.warning("could not post the Event: %s", watching.describe(error), extra=extra)
