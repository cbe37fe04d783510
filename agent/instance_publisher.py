"""Turn one Configuration's device lists into Instances, for this node.

Why this exists: this is where discovery meets the API. Every full device list a handler yields
becomes Instances (one per shared device, listing every node that sees it; one per node for a
local device), entries in the ``NodeDeviceTable`` the device plugins serve, this node's labels
and the instances gauge.

How the Instance is written, and why slots are safe:

- Agents on several nodes write one shared Instance. Each uses server-side apply with its own
  field manager (``edgeplug-agent-<node>``) and applies ``nodes: [<node>]``: ``nodes`` is a set
  list, so the API server merges every agent's element and each agent owns exactly its own.
  The other applied fields (configurationName, cdiName, capacity, shared, brokerProperties,
  owner reference) are a pure function of the Configuration and the device, so agents apply
  identical values and share ownership. ``force=True`` only settles the short window in which
  agents disagree because a Configuration change has not reached all of them; it cannot touch a
  field this node does not apply.
- ``deviceUsage`` is never in an apply. Were it applied, this node's manager would own the slot
  values and a later apply could reset a slot the device-plugin side claimed. Instead the
  Instance is *created* (plain POST, ``409 AlreadyExists`` means another agent won the race)
  with every slot ``crds.naming.slot_id(instance, i)`` set to ``""`` (a local one already naming
  this node in ``nodes``, as the agents' Instance policy requires), and slots that are missing
  afterwards (capacity raised, or an Instance re-created by apply) are added by a merge patch
  that carries the read ``resourceVersion``: an optimistic-concurrency write that fails instead
  of overwriting a claim made in between, and names only missing keys.
- Leaving a shared Instance is an apply of the same body without ``nodes``: the API server drops
  the element this manager owned and nothing else. The node that finds ``nodes`` empty
  afterwards deletes the Instance; a node that reads itself alone in ``nodes`` deletes it at
  once. (Between that read and the delete another agent can join; it re-creates the Instance
  at its next resync, ``RESYNC_INTERVAL`` in ``discovery_run``.)
- A local device that goes is deleted at once; a shared one keeps this node (marked unhealthy in
  the table) for ``offlineGracePeriodSeconds`` and is left only if it does not come back. A
  device the handler reports present but unhealthy keeps its Instance (local or shared): only
  its health changes (``agent.device_health``), never through deletion.
- CDI: before the table hears of a device, the Configuration's CDI spec on this node is
  rewritten to hold it (``agent.cdi_specs``); the record carries its CDI name only if that
  write succeeded.
- Pace: ``WRITES_IN_FLIGHT`` Instances at once, each new shared device's first verdict written
  as soon as its own Instance is (the controller builds its slice from that), and the devices
  handed to the table in batches, one CDI write each.
- Every Instance this node writes carries its label (``agent.node_instances``), applied with
  ``nodes``; leaving drops it with the node, or keeps it while this node still holds a slot.
- Restart adoption: ``adopt`` lists the Configuration's Instances labelled for this node
  and keeps them untouched; reconciliation waits for the first device list, so an agent restart
  deletes and re-creates nothing and every slot (and uid) survives.
- Every Instance records its device (``spec.deviceDigest``, ``crds.naming.device_digest``; the
  CRD keeps it once set), so the API server settles which device a name is: the device whose
  create won it. A device takes the first of its ``crds.naming.instance_names`` that is free or
  records it: its Akri name; for a local device, its fallback name ``<name>.<node>``, which the
  agents' Instance policy lets no other node create (a stolen token can squat an Akri name:
  it is predictable); then its collision name ``<configuration>-<deviceDigest>``, the same
  on every node for a shared device (and its fallback, for a local one). Two devices of one
  list with one Akri name are placed one after the other: the one publishing a name already
  first, then the smaller digest (``crds.naming.plan_names``). A shared device not published
  here yet first joins an Instance another node made under a later name of its own (one GET;
  one list for all of a list's new devices, ``agent.name_records``), so a node that sees it
  after its Akri name was freed does not publish it twice. An
  Instance without a record (written before records were kept) is taken for the device of
  this list whose properties it carries, else for any that may take its name.
- A name once published stays while the device is served, across restarts too (an owned
  name is preferred to an earlier one), even once the other Instance is gone: moving a served
  device would end the pods that hold its slots. Each collision is said once (a Warning Event
  on the Configuration naming both devices' digests and names); the
  ``edgeplug_instance_name_collisions`` gauge counts the devices served under another name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent import node_instances, watching
from agent.cdi_specs import CdiSpecs
from agent.device_health import HealthReporter
from agent.events import emit_event
from agent.kube import (
    InstanceResource,
    as_dict,
    field_manager,
    is_conflict,
    is_not_found,
)
from agent.metrics import AgentMetrics
from agent.name_records import LIST_FROM, recorded_digests
from agent.node_devices import NodeDevice, NodeDeviceTable
from agent.node_labels import NodeLabels
from crds.api import API_VERSION, CONFIGURATION_KIND, INSTANCE_KIND
from crds.configuration import Configuration
from crds.instance import Instance
from crds.naming import (
    cdi_name,
    configuration_resource_name,
    device_digest,
    instance_name,
    instance_names,
    name_digest,
    slot_id,
)
from discovery_handlers.contract import Device, DiscoveryHandler, Health, LabellingHandler

log = logging.getLogger(__name__)

#: Instance writes a publish (or a withdrawal) has in flight at once (the controller's too).
WRITES_IN_FLIGHT = 16
#: Seconds a publish gathers reported devices before one CDI write hands them to the table.
SERVE_BATCH_S = 0.25
#: ... and until they are at least this share of the devices served (each CDI write renders
#: every device served: batches of a fixed size made the writes quadratic in the devices).
SERVE_BATCH_SHARE = 0.25
_T = TypeVar("_T")
LEAVE_ATTEMPTS = 5  # conditional leave retries when the Instance changes under us
OFFLINE_REASON = "not seen by discovery; kept for offlineGracePeriodSeconds"
#: The Warning Event's reason when a device's Instance name is another node's.
REASON_NAME_TAKEN = "InstanceNameTaken"
#: The Warning Event's reason when two devices would share one Instance name.
REASON_NAME_COLLISION = "InstanceNameCollision"
HTTP_UNPROCESSABLE = 422  # the CRD's rules refused a write (another device's deviceDigest)


@dataclass(frozen=True)
class _Holder:
    """Who holds a name this device may not take: said in words, and the device it records
    (``""``: none recorded, or not a device of this Configuration's kind)."""

    description: str
    digest: str = ""


@dataclass(frozen=True)
class _Wanted:
    """One device of a list, with what names it by: its digest and its names in order."""

    device: Device
    digest: str
    names: tuple[str, ...]


class LeaveFailed(Exception):
    """A conditioned leave lost every race; the caller tries again later."""


class InstancePublisher:
    """Instances of one Configuration as this node sees them. Not shared between runs."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        node_name: str,
        configuration: Configuration,
        devices: NodeDeviceTable,
        labels: NodeLabels,
        metrics: AgentMetrics,
        cdi: CdiSpecs | None = None,
    ) -> None:
        self._client = client
        self._node = node_name
        self._cfg = configuration
        self._table = devices
        self._labels = labels
        self._metrics = metrics
        self._manager = field_manager(node_name)
        self._owned: dict[str, bool] = {}  # Instance name → shared, for Instances naming us
        #: Instance name → the deviceDigest it records (``""``: none), for those owned.
        self._records: dict[str, str] = {}
        #: Owned Instances that record no device (written before records were kept) → their
        #: brokerProperties, which tell which device of a colliding pair they were.
        self._unrecorded: dict[str, dict[str, str]] = {}
        self._applied: dict[str, dict[str, Any]] = {}  # last body applied per Instance
        self._grace: dict[str, asyncio.Task[None]] = {}
        self._last: tuple[DiscoveryHandler, Any, Sequence[Device], bool] | None = None
        self._served: dict[str, NodeDevice] = {}  # what this node serves, CDI name included
        self._cdi = cdi if cdi is not None else CdiSpecs(None)
        self._health = HealthReporter(
            client=client, node_name=node_name, namespace=configuration.namespace
        )
        self._lock = asyncio.Lock()
        #: Akri names found held by another node's Instance or device (said once each).
        self._taken: set[str] = set()
        #: Devices of the running publish whose first verdict is written, not yet in the table.
        self._ready: list[NodeDevice] = []
        self._batch_started = 0.0

    @property
    def owned(self) -> Mapping[str, bool]:
        return dict(self._owned)

    async def adopt(self) -> None:
        """Take over the Instances an earlier run or agent left naming this node."""
        cfg = self._cfg
        async for obj in node_instances.list_instances(self._client, self._node, cfg.namespace):
            instance = Instance.from_object(obj)
            spec = instance.spec
            if spec.configuration_name == cfg.name and self._node in spec.nodes:
                self._owned[instance.name] = spec.shared
                self._records[instance.name] = spec.device_digest
                if not spec.device_digest:
                    self._unrecorded[instance.name] = dict(spec.broker_properties)
        log.info(
            "adopted %d Instances", len(self._owned),
            extra={"configuration": f"{cfg.namespace}/{cfg.name}", "node": self._node},
        )

    async def publish(
        self, handler: DiscoveryHandler, details: Any, devices: Sequence[Device], *, shared: bool
    ) -> None:
        """Make the API and the table say what the latest full device list says."""
        async with self._lock:
            self._last = (handler, details, devices, shared)
            groups = self._groups(devices, shared=shared)
            desired = {name for group in groups for name in self._kept(group)}
            # Grace timers first, writes after: a write that fails (the API server away) ends
            # the pass, and a shared device gone meanwhile must still leave one grace period
            # after it went, not one grace period after the server came back.
            for name in desired:
                task = self._grace.pop(name, None)
                if task is not None:
                    task.cancel()
            for name, was_shared in list(self._owned.items()):
                if was_shared and name not in desired and name not in self._grace:
                    served = self._served.get(name)
                    if served is not None:
                        self._served[name] = replace(
                            served, health=Health.unhealthy(OFFLINE_REASON)
                        )
                    self._grace[name] = asyncio.create_task(
                        self._leave_after_grace(name), name=f"grace-{name}"
                    )
            # Several Instances in flight at once: one at a time, 200 devices waited on 400
            # API round trips in a row before the first plugin. The devices of one Akri name
            # go one after the other (each takes a name the one before did not). Each device's
            # first verdict follows its own Instance, not the last one's.
            records = await self._lookups(groups) if shared else None
            self._ready = []
            self._batch_started = asyncio.get_running_loop().time()
            placed = await _bounded([
                self._place_and_report(group, handler, details, shared=shared, records=records)
                for group in groups])
            failed: BaseException | None = None
            published: set[str] = set()
            for outcome in placed:
                if isinstance(outcome, BaseException):
                    failed = failed or outcome
                    continue
                published.update(name for _wanted, name in outcome if name is not None)
            if failed is not None:
                await self._serve_ready(now=True)  # those reported are served all the same
                raise failed  # as before, a failed write ends the pass
            for name, was_shared in list(self._owned.items()):
                if name not in desired and name not in published and not was_shared:
                    await self._leave(name, shared=False)
            await self._serve()
            await self._report()

    async def resync(self) -> None:
        """Re-apply every visible device (heals Instances deleted behind our back)."""
        if self._last is None:
            return
        self._applied.clear()
        handler, details, devices, shared = self._last
        await self.publish(handler, details, devices, shared=shared)

    async def withdraw(self) -> None:
        """This node stops serving the Configuration: leave (or delete) all its Instances."""
        await self.close()
        async with self._lock:
            owned = list(self._owned.items())
            # This node stops serving every one of them before any API write (each _leave
            # does that for its own first): the plugins go at once, not one API round trip
            # apart each (issue 36).
            # The CDI spec is written once for all of them (one write per Instance rendered
            # the remaining devices each time: 200 devices, 20,000 renders).
            for name, _shared in owned:
                self._forget(name)
            self._write_cdi()
            for name, _shared in owned:
                await self._table.remove(self._cfg.namespace, name)
            outcomes = await _bounded([self._leave(name, shared=shared) for name, shared in owned])
            for (name, _shared), outcome in zip(owned, outcomes, strict=True):
                if isinstance(outcome, Exception):  # the ownerReference still collects it
                    log.warning("could not leave Instance %s: %s", name,
                                watching.describe(outcome), extra=self._extra(name))
                elif isinstance(outcome, BaseException):
                    raise outcome
            await self._report()

    async def close(self) -> None:
        """Stop grace timers; the Instances stay as they are (a restart adopts them)."""
        tasks = list(self._grace.values())
        self._grace.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- writing -------------------------------------------------------------------------

    def _body(self, name: str, wanted: _Wanted, *, shared: bool) -> dict[str, Any]:
        cfg = self._cfg
        return {
            "apiVersion": API_VERSION,
            "kind": INSTANCE_KIND,
            "metadata": {
                "name": name,
                "namespace": cfg.namespace,
                "labels": {node_instances.serves_label(self._node): node_instances.LABEL_VALUE},
                "ownerReferences": [cfg.owner_reference()],
            },
            "spec": {
                "configurationName": cfg.name,
                "cdiName": cdi_name(cfg.name, name_digest(name)),
                "capacity": cfg.spec.capacity,
                "brokerProperties": self._properties(wanted.device),
                "shared": shared,
                "nodes": [self._node],
                "deviceDigest": wanted.digest,
            },
        }

    def _properties(self, device: Device) -> dict[str, str]:
        return {**device.properties, **self._cfg.spec.broker_properties}

    def _groups(self, devices: Sequence[Device], *, shared: bool) -> list[list[_Wanted]]:
        """The list's devices by Akri name, each group in the order its devices are placed:
        those this node publishes under one of their names first, then by digest."""
        groups: dict[str, list[_Wanted]] = {}
        seen: set[str] = set()
        for device in devices:
            if device.id in seen:
                continue
            seen.add(device.id)
            wanted = _Wanted(
                device, device_digest(device.id, shared=shared, node=self._node),
                instance_names(self._cfg.name, device.id, shared=shared, node=self._node))
            groups.setdefault(wanted.names[0], []).append(wanted)
        return [sorted(group, key=lambda w: (not any(self._is_mine(n, w, group)
                                                     for n in w.names), w.digest))
                for group in groups.values()]

    def _kept(self, group: Sequence[_Wanted]) -> list[str]:
        """Names this node publishes that the group's devices keep (one each, first first)."""
        kept: list[str] = []
        for wanted in group:
            for name in wanted.names:
                if name not in kept and self._is_mine(name, wanted, group):
                    kept.append(name)
                    break
        return kept

    def _is_mine(self, name: str, wanted: _Wanted, group: Sequence[_Wanted]) -> bool:
        """This node publishes ``name`` for ``wanted``. An Instance that records no device is
        the device of ``group`` with its properties, else any that may take its name."""
        if name not in self._owned:
            return False
        record = self._records.get(name, "")
        if record:
            return record == wanted.digest
        properties = self._unrecorded.get(name)
        if properties is None or properties == self._properties(wanted.device):
            return True
        return not any(properties == self._properties(w.device) for w in group
                       if name in w.names)

    async def _lookups(self, groups: Sequence[Sequence[_Wanted]]) -> Mapping[str, str] | None:
        """The digests the API server's Instances of this list's later names record, read in
        one list when at least ``LIST_FROM`` devices are new to this node (else None: each
        new device's ``_place`` reads its own)."""
        new = [w for group in groups for w in group
               if not any(self._is_mine(n, w, group) for n in w.names)]
        if len(new) < LIST_FROM:
            return None
        later = {name for group in groups for w in group for name in w.names[1:]}
        found = await recorded_digests(self._client, self._cfg.namespace, later)
        return {name: found.get(name, "") for name in later}

    async def _place_and_report(
        self, group: Sequence[_Wanted], handler: DiscoveryHandler, details: Any, *,
        shared: bool, records: Mapping[str, str] | None,
    ) -> list[tuple[_Wanted, str | None]]:
        """Place one Akri name's devices, record each as this node's, write each new shared
        device's first verdict at once and hand it to the table with the next batch."""
        placed = await self._place_group(group, shared=shared, records=records)
        for wanted, name in placed:
            if name is None:
                continue  # every name it may take is held (said once)
            self._owned[name] = shared
            self._records[name] = wanted.digest
            self._unrecorded.pop(name, None)
            served = self._node_device(name, handler, details, wanted.device, shared=shared)
            self._served[name] = served
            if self._health.first_verdict_due(name, shared=shared):
                await self._report_health(name, served)
                self._ready.append(served)
        await self._serve_ready()
        return placed

    async def _serve_ready(self, *, now: bool = False) -> None:
        """Put the devices whose first verdict is written in the table, after one CDI write
        for all of them: a batch at least ``SERVE_BATCH_S`` long and ``SERVE_BATCH_SHARE`` of
        the devices served (``now``: at once)."""
        loop = asyncio.get_running_loop()
        if not self._ready:
            return
        if not now and (loop.time() - self._batch_started < SERVE_BATCH_S
                        or len(self._ready) < SERVE_BATCH_SHARE * len(self._served)):
            return
        ready, self._ready = self._ready, []
        self._batch_started = loop.time()
        with_cdi = self._write_cdi()
        for served in ready:
            await self._table.put(served if with_cdi else replace(served, cdi_name=""))

    async def _place_group(self, group: Sequence[_Wanted], *, shared: bool,
                           records: Mapping[str, str] | None = None,
                           ) -> list[tuple[_Wanted, str | None]]:
        """Each device of one Akri name with the name it is published under (None: none)."""
        taken: dict[str, str] = {}  # name → digest of the device of this list given it
        placed: list[tuple[_Wanted, str | None]] = []
        for wanted in group:
            name = await self._place(wanted, taken, group, shared=shared, records=records)
            if name is not None:
                taken[name] = wanted.digest
            placed.append((wanted, name))
        return placed

    async def _place(self, wanted: _Wanted, taken: Mapping[str, str],
                     group: Sequence[_Wanted], *, shared: bool,
                     records: Mapping[str, str] | None = None) -> str | None:
        """Publish ``wanted`` under the first of its names that is this node's already, or
        (shared) another node's for this device, or free; the name, or None."""
        for name in wanted.names:
            if name in taken or not self._is_mine(name, wanted, group):
                continue
            refused = await self._ensure(name, wanted, shared=shared)
            if refused is None:
                return name
            # Another device's Instance (an Instance made before digests were recorded, which
            # a node with that device recorded first): this node leaves it.
            log.warning("Instance %s is %s: leaving it", name, refused.description,
                        extra=self._extra(name))
            await self._leave(name, shared=shared)
        if shared:
            for name in wanted.names[1:]:
                if (name not in taken
                        and await self._records_device(name, wanted.digest, records)
                        and await self._ensure(name, wanted, shared=shared) is None):
                    return name
        akri = wanted.names[0]
        why: _Holder | None = None
        for name in wanted.names:
            if name in taken:
                holder = _Holder("in this node's list too", taken[name])
            else:
                held = await self._ensure(name, wanted, shared=shared)
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
        (this pass's list, ``_lookups``) says where it has the name, else one GET."""
        if records is not None and name in records:
            return records[name] == digest
        existing = await self._read(name)
        return existing is not None and (existing.get("spec") or {}).get("deviceDigest") == digest

    async def _read(self, name: str) -> dict[str, Any] | None:
        """The API server's Instance ``name``; None where there is none."""
        try:
            return as_dict(
                await self._client.get(InstanceResource, name, namespace=self._cfg.namespace))
        except ApiError as exc:
            if is_not_found(exc):
                return None
            raise

    async def _ensure(self, name: str, wanted: _Wanted, *, shared: bool) -> _Holder | None:
        """Create or apply ``name`` for ``wanted``; who holds it instead when it is not this
        device's to write, else None."""
        body = self._body(name, wanted, shared=shared)
        if self._applied.get(name) == body:
            return None
        if name not in self._owned:
            holder = await self._create(name, body, wanted.digest, shared=shared)
            if holder is not None:
                return holder
        try:
            applied = await self._client.patch(
                InstanceResource, name, body, namespace=self._cfg.namespace,
                patch_type=PatchType.APPLY, field_manager=self._manager, force=True,
            )
        except ApiError as exc:
            if exc.status.code != HTTP_UNPROCESSABLE:
                raise
            holder = await self._holder(name, wanted.digest, shared=shared)
            if holder is None or not holder.digest:
                raise  # refused for another reason
            return holder
        await self._fill_slots(as_dict(applied))
        self._applied[name] = body
        return None

    async def _create(self, name: str, body: dict[str, Any], digest: str, *,
                      shared: bool) -> _Holder | None:
        """Create ``name``, owned from before the request is sent: a run stopped while the
        create (or the apply after it) is in flight must still withdraw what the API server may
        have made, or a Node relabelled right after a device appeared keeps its Instance.
        Who holds ``name`` when it is not this node's to write (``_holder``), else None."""
        # A shared Instance is created without nodes (each agent then owns its own element
        # through its apply); a local one names this node from the start, since the agents'
        # Instance policy lets a node create a local Instance only for itself.
        spec = {k: v for k, v in body["spec"].items() if k != "nodes" or not shared}
        spec["deviceUsage"] = {slot_id(name, i): "" for i in range(self._cfg.spec.capacity)}
        # Likewise the label of a shared one: created by this manager, the label would stay
        # after the apply that leaves drops it.
        metadata = {k: v for k, v in body["metadata"].items() if k != "labels" or not shared}
        created = {**body, "metadata": metadata, "spec": spec}
        self._owned[name] = shared
        try:
            await self._client.create(
                InstanceResource.from_dict(created), field_manager=self._manager
            )
            log.info("created Instance %s", name, extra=self._extra(name))
        except ApiError as exc:
            if not is_conflict(exc):
                self._owned.pop(name, None)  # refused: nothing was made, the next pass creates
                raise
            holder = await self._holder(name, digest, shared=shared)
            if holder is not None:
                self._owned.pop(name, None)
                return holder
        return None

    async def _holder(self, name: str, digest: str, *, shared: bool) -> _Holder | None:
        """Who holds ``name`` when it is not this node's to write, else None: an Instance of the
        other kind (``spec.shared`` is immutable), or a local one naming other nodes.

        Names are a 3-byte digest of the device id (and node, for a local device: Akri's), so
        another device's Instance can hold this device's name: a collision (the holder records
        another ``deviceDigest``), or a node's token that created it first. The device then
        takes its next name (``_place``).
        """
        existing = await self._read(name)
        if existing is None:
            return None  # gone meanwhile: the apply that follows makes it
        spec = existing.get("spec") or {}
        nodes = [str(n) for n in spec.get("nodes") or []]
        listed = ", ".join(nodes) or "none"
        if bool(spec.get("shared")) != shared:
            kind = "shared" if spec.get("shared") else "local"
            return _Holder(f"a {kind} Instance of node(s) {listed}")
        recorded = str(spec.get("deviceDigest") or "")
        if recorded and recorded != digest:
            return _Holder(f"listing node(s) {listed}", recorded)
        if shared or nodes in ([], [self._node]):
            return None
        return _Holder(f"an Instance of node(s) {listed}")

    async def _say_taken(self, akri: str, wanted: _Wanted, holder: _Holder,
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
        log.warning("%s", message, extra=self._extra(akri))
        cfg = self._cfg
        try:
            await emit_event(
                self._client, node=self._node, kind=CONFIGURATION_KIND, name=cfg.name,
                namespace=cfg.namespace, uid=cfg.uid, reason=reason, message=message,
                warning=True)
        except Exception as error:  # the log line stands
            log.warning("could not post the Event: %s", watching.describe(error),
                        extra=self._extra(akri))

    async def _fill_slots(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        usage = obj.get("spec", {}).get("deviceUsage") or {}
        missing = {
            slot_id(name, i): ""
            for i in range(self._cfg.spec.capacity)
            if slot_id(name, i) not in usage
        }
        if not missing:
            return
        patch = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"deviceUsage": missing},
        }
        try:
            await self._client.patch(
                InstanceResource, name, patch, namespace=self._cfg.namespace,
                patch_type=PatchType.MERGE, field_manager=self._manager,
            )
        except ApiError as exc:
            if not is_conflict(exc):
                raise
            self._applied.pop(name, None)  # someone wrote in between: fill at the next pass

    async def _leave(self, name: str, *, shared: bool) -> None:
        """Remove this node from ``name``; delete it when local or when no node is left.

        This node stops serving it first; ``name`` stays owned until the API agrees, so a
        failed leave (the API server away) is derived again by the next publish or resync.
        """
        await self._stop_serving(name)
        if not shared:
            await self._delete(name)
        else:
            await self._leave_shared(name)
        self._owned.pop(name, None)
        self._records.pop(name, None)
        self._unrecorded.pop(name, None)

    async def _stop_serving(self, name: str) -> None:
        """This node no longer serves ``name`` (its plugin goes); the API is not written."""
        if self._forget(name):
            self._write_cdi()
        await self._table.remove(self._cfg.namespace, name)

    def _forget(self, name: str) -> bool:
        """Drop ``name`` from what this node serves (the table is the caller's); whether it
        was served (its CDI spec entry must go)."""
        self._applied.pop(name, None)
        self._health.forget(name)
        return self._served.pop(name, None) is not None

    async def _leave_shared(self, name: str) -> None:
        if await self._delete_if_alone(name):
            self._health.forget(name)
            return
        await self._health.unreport(name)
        for _attempt in range(LEAVE_ATTEMPTS):
            try:
                current = as_dict(
                    await self._client.get(InstanceResource, name, namespace=self._cfg.namespace)
                )
                # The read resourceVersion makes the apply conditional: it can neither
                # re-create an Instance deleted meanwhile nor race another writer.
                # The label stays while this node still holds a slot there: the device-plugin
                # side frees it, then drops the label (agent.node_instances).
                body = self._leave_body(
                    name, current["metadata"]["resourceVersion"],
                    keep_label=node_instances.holds_usage(current, self._node))
                left = await self._client.patch(
                    InstanceResource, name, body, namespace=self._cfg.namespace,
                    patch_type=PatchType.APPLY, field_manager=self._manager, force=True,
                )
            except ApiError as exc:
                if is_not_found(exc):
                    return
                if is_conflict(exc):
                    continue
                raise
            stored = as_dict(left)
            nodes = stored.get("spec", {}).get("nodes") or []
            log.info("left Instance %s (nodes now %s)", name, nodes, extra=self._extra(name))
            if not nodes:
                await self._delete(name, str(stored["metadata"].get("uid") or ""))
            elif (node_instances.is_labelled(stored, self._node)
                  and not node_instances.wants_label(stored, self._node)):
                # Labelled by a merge patch too (agent.node_instances.relabel): the apply
                # does not own it alone.
                await node_instances.drop_label(self._client, self._node, stored)
            return
        raise LeaveFailed(f"could not leave Instance {name}: it kept changing")

    async def _delete_if_alone(self, name: str) -> bool:
        """Delete ``name`` at once where this node alone is listed (its verdict's mark taken
        back, then the leave, then the delete: three writes where one does); whether it is
        gone. Another node that joins between the read and the delete re-creates it, as after
        a leave."""
        current = await self._read(name)
        if current is None:
            return True
        if (current.get("spec") or {}).get("nodes") != [self._node]:
            return False
        await self._delete(name, str(current["metadata"].get("uid") or ""))
        return True

    def _leave_body(self, name: str, resource_version: str, *, keep_label: bool) -> dict[str, Any]:
        cfg = self._cfg
        metadata: dict[str, Any] = {
            "name": name, "namespace": cfg.namespace, "resourceVersion": resource_version,
        }
        if keep_label:
            label = node_instances.serves_label(self._node)
            metadata["labels"] = {label: node_instances.LABEL_VALUE}
        return {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": metadata}

    async def _delete(self, name: str, uid: str = "") -> None:
        """Delete ``name`` (``uid``: the object read, which this node's watches then take for
        gone without reading it)."""
        try:
            await self._client.delete(InstanceResource, name, namespace=self._cfg.namespace)
            log.info("deleted Instance %s", name, extra=self._extra(name))
        except ApiError as exc:
            if not is_not_found(exc):
                raise
        if uid:
            node_instances.deleted_here(uid)

    async def _leave_after_grace(self, name: str) -> None:
        """Leave ``name`` once its grace is over; retried until done or superseded (the device
        came back, the run stopped): a failure here must not leave this node listed for good."""
        await asyncio.sleep(self._cfg.spec.offline_grace_period_seconds)
        failures = 0
        while True:
            async with self._lock:
                if self._grace.get(name) is not asyncio.current_task():
                    return
                try:
                    await self._leave(name, shared=True)
                except Exception as exc:  # ApiError, or the API server unreachable
                    failures += 1
                    log.warning("could not leave Instance %s (%s); retrying", name,
                                watching.describe(exc), extra=self._extra(name))
                else:
                    del self._grace[name]
                    await self._report()
                    return
            await asyncio.sleep(watching.retry_delay(failures))

    # -- the node's view -------------------------------------------------------------------

    def _node_device(
        self, name: str, handler: DiscoveryHandler, details: Any, device: Device, *, shared: bool
    ) -> NodeDevice:
        return NodeDevice(
            instance=name,
            namespace=self._cfg.namespace,
            configuration=self._cfg.name,
            device=device,
            broker_properties=self._cfg.spec.broker_properties,
            cdi_name=cdi_name(self._cfg.name, name_digest(name)),
            configuration_resource=configuration_resource_name(
                self._cfg.name, self._cfg.spec.resource_name),
            health=device.health,
            shared=shared,
            handler=handler,
            details=details,
        )

    def _write_cdi(self) -> bool:
        return self._cdi.write(self._cfg.namespace, self._cfg.name, list(self._served.values()))

    async def _serve(self) -> None:
        """Spec on disk first, then the table (CDI names only if the spec was written), then
        each device's health reported where it changed; a shared device's first verdict is
        written before the table hears of it."""
        self._ready = []  # the table gets every device below
        with_cdi = self._write_cdi()
        # A new shared device's first verdict (status.reported) is a status write the slot
        # service's first reservation write would otherwise race, and lose (a 409 and a
        # re-read, issue 36): the table, which starts that service's pass, comes after it.
        # ``_place_and_report`` wrote those of the devices this pass placed; these are the
        # ones whose write failed before.
        first = {name: served for name, served in self._served.items()
                 if self._health.first_verdict_due(name, shared=served.shared)}
        # Each report and warning handles its own errors; up to WRITES_IN_FLIGHT at once (a
        # shared device's first verdict is always a write: 200 in a row held 200 devices).
        await _bounded([self._report_health(name, served) for name, served in first.items()])
        for served in self._served.values():
            await self._table.put(served if with_cdi else replace(served, cdi_name=""))
        await _bounded([self._report_health(name, served)
                        for name, served in self._served.items() if name not in first])

    async def _report_health(self, name: str, served: NodeDevice) -> None:
        await self._health.report(name, served.health, shared=served.shared)
        await self._health.warn(name, served.device.warning)

    async def _report(self) -> None:
        cfg = self._cfg
        self._metrics.instances.labels(cfg.namespace, cfg.name).set(len(self._owned))
        self._metrics.set_devices(cfg.namespace, cfg.name, self._node,
                                  [d.healthy for d in self._served.values()])
        renamed = sum(1 for name, served in self._served.items() if name != instance_name(
            cfg.name, served.device.id, shared=served.shared, node=self._node))
        self._metrics.instance_name_collisions.labels(cfg.namespace, cfg.name, self._node).set(
            renamed)
        handler_labels: Mapping[str, str] = {}
        if self._last is not None and self._owned:
            handler, details = self._last[0], self._last[1]
            if isinstance(handler, LabellingHandler):
                try:
                    handler_labels = handler.node_labels(
                        details, [s.device for s in self._served.values()]
                    )
                except Exception:  # a handler's bug must not stop publishing
                    log.exception("handler %s: node_labels failed", handler.name)
        await self._labels.set(
            namespace=cfg.namespace, configuration=cfg.name, has_devices=bool(self._owned),
            handler_labels=handler_labels,
        )

    def _extra(self, name: str) -> dict[str, str]:
        return {
            "configuration": f"{self._cfg.namespace}/{self._cfg.name}",
            "instance": name,
            "node": self._node,
        }


async def _bounded(calls: Sequence[Coroutine[Any, Any, _T]]) -> list[_T | BaseException]:
    """Await ``calls``, at most ``WRITES_IN_FLIGHT`` at a time; each one's result or exception,
    in order (every call runs to its end, as the loop they replace let each one before)."""
    gate = asyncio.Semaphore(WRITES_IN_FLIGHT)

    async def one(call: Coroutine[Any, Any, _T]) -> _T:
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
