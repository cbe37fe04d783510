"""The agent's device-plugin side: Instances in, kubelet plugins and slot bookkeeping out.

Why this exists: ``agent.main`` needs one entry point, ``serve_device_plugins``, that keeps the
kubelet's view in line with the API server and with what this node can serve. It watches
the Instances labelled for this node (``agent.node_instances``), reacts to the
``NodeDeviceTable``, and on every change (and, as a safety net, every ``RESYNC_SECONDS``)
reconciles: one plugin per Instance that is in the table and lists this node, one
configuration-level plugin per Configuration with such Instances, advertised lists computed by
``agent.slots.rules``, reservations kept through ``agent.slots.ledger``, this node's usage
freed when an Instance stops listing it, slots of vanished pods freed by
``agent.slots.freeing``, display fields kept by ``agent.slots.display``. The lifecycle
(sockets, registration, kubelet restarts) is ``PluginManager``'s.

Local devices (one listed node) need nothing more: that node reserves every free slot. The
first time a pass serves a shared device through device plugins (its Configuration's allocator
is ``devicePlugin``, or this agent runs without DRA), it loads the compatibility mode's
cross-node protocol, ``agent.slots.compat``: reservations moved by the demand of Pending pods
pinned here (published as ``status.demand``), released only once its gate has lowered this
Node's counts, and those counts kept down. The DRA default never loads it.

At rest the loop sleeps: a pass that failed in part is retried after ``RETRY_SECONDS``, and
pod-resources is swept every ``SWEEP_SECONDS`` only while this node holds a slot; with nothing
held and nothing changing, nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightkube import ApiError, AsyncClient

from agent import node_instances, watching
from agent.deviceplugin.backend import PluginBackend, PluginSpec
from agent.deviceplugin.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugin.manager import PluginManager
from agent.kube import ConfigurationResource, as_dict, is_not_found
from agent.metrics import AgentMetrics
from agent.node_devices import NodeDevice, NodeDeviceTable
from agent.node_reads import NodeReads
from agent.pod_annotations import PodAnnotator, devices_of
from agent.podresources import PodDevices, PodResourcesClient
from agent.separated_devices import SeparatedDeviceEvictor
from agent.slots.backends import ConfigurationBackend, InstanceBackend
from agent.slots.bound_pods import BoundPodsReader
from agent.slots.display import DisplayFields
from agent.slots.freeing import ORPHAN_GRACE_SECONDS, SWEEP_AWAITED_SECONDS, OrphanFreer
from agent.slots.ledger import InstanceGone, SlotLedger, TooManyConflicts
from agent.slots.recording import PromiseRecorder
from agent.slots.rules import (
    SlotRef,
    configuration_devices,
    held_virtual_ids,
    instance_devices,
    is_held_by,
    reservation_plan,
    slot_counts,
    usage_of,
)
from agent.volcano_allocation import VolcanoPins
from crds.configuration import Allocator, Configuration
from crds.instance import Instance, SlotUsage
from crds.naming import configuration_resource_name, instance_resource_name

if TYPE_CHECKING:
    from agent.slots.compat.crossnode import CrossNode

log = logging.getLogger(__name__)

#: Reconcile at least this often even without events: a safety net only, since every change
#: that matters (Instances, the node's devices, pods, claims) wakes the loop itself.
RESYNC_SECONDS = 300.0
#: After a pass that failed in part (an API error, a lost race), the next one comes this soon.
RETRY_SECONDS = 1.0
#: While this node holds slots, pod-resources is asked this often which live pods hold them
#: (the kubelet never says that a pod has gone); every ``SWEEP_AWAITED_SECONDS`` while another
#: node's pods wait for such a slot. Holding nothing, it is never asked.
SWEEP_SECONDS = 1.0
#: A reconcile pass lets waiting calls (Allocate) run after this many Instances, and between
#: its phases.
PASS_YIELD_EVERY = 16
#: New Instances' reservations written at once before their plugins start (as many as the
#: discovery side keeps Instance writes in flight).
RESERVE_IN_FLIGHT = 8
#: Socket names longer than this are replaced by a digest (Unix socket paths are short).
MAX_SOCKET_NAME = 60

_Key = tuple[str, str]


def socket_name(resource: str) -> str:
    """``edgeplug.io/cam-1a2b3c`` → ``edgeplug.io_cam-1a2b3c.sock`` (digest when too long)."""
    name = resource.replace("/", "_") + ".sock"
    if len(name) > MAX_SOCKET_NAME:
        name = "ep-" + hashlib.blake2b(resource.encode(), digest_size=8).hexdigest() + ".sock"
    return name


@dataclass
class _Served:
    """A plugin this service runs, and what it was built from."""

    spec: PluginSpec
    key: tuple[str, str, str]  # ("instance"|"configuration", namespace, name)


class DevicePluginService:
    """Everything behind ``serve_device_plugins``; also the ``SlotWorld`` backends use."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        node_name: str,
        plugin_dir: Path,
        pod_resources_socket: Path | None,
        devices: NodeDeviceTable,
        metrics: AgentMetrics,
        orphan_grace: float = ORPHAN_GRACE_SECONDS,
        dra: bool = False,
        reads: NodeReads | None = None,
    ) -> None:
        """``dra``: this agent also serves DRA, so shared devices whose Configuration has no
        allocator yet wait for one instead of being served by device plugins meanwhile.
        ``reads``: how the pods bound here are listed (by default with ``client``)."""
        self.node = node_name
        self._reads = reads or NodeReads(client)
        self._dra = dra
        self._warned_no_dra: set[_Key] = set()
        self.metrics = metrics
        self._client = client
        self._devices = devices
        self.manager = PluginManager(plugin_dir=plugin_dir, metrics=metrics)
        self._instances: dict[_Key, Instance] = {}
        #: The copies the last reconcile pass started from (``_seen`` wakes a pass only for a
        #: copy that says something else).
        self._passed: dict[_Key, Instance] = {}
        #: Instances known from a read after this node's label went (agent.node_instances):
        #: no watch event brings their changes; forgotten once nothing of this node's is left.
        self._unlabelled: set[_Key] = set()
        self._relists: set[asyncio.Task[None]] = set()
        self._ledgers: dict[_Key, SlotLedger] = {}
        self._served: dict[str, _Served] = {}
        self._config_resources: dict[_Key, str] = {}
        #: Every configuration-level resource this agent has served, kept after its plugin
        #: goes (its Configuration switched to DRA, its devices left this node): pods the kubelet
        #: allocated virtual ids of it still hold their slots, and the orphan freer and the pod
        #: annotator must still read their pod-resources entries as those slots.
        self._ever_config_resources: dict[_Key, str] = {}
        self._display = DisplayFields(
            ledger=self.ledger,
            served=lambda: [(k, i) for k, i in self._instances.items() if self._serves(k, i)],
        )
        self._wake = asyncio.Event()
        #: A pass failed in part: the next one is due after ``RETRY_SECONDS``.
        self._retry = False
        #: This node held a slot at the last sweep: the next one is due after ``SWEEP_SECONDS``.
        self._holding = False
        #: When the last sweep ran (loop time), and whether one is owed: a pass right after
        #: a sweep leaves its own to the loop, at most ``SWEEP_AWAITED_SECONDS`` later, so a
        #: burst of events (each recording's watch event wakes a pass) costs one pod-resources
        #: ``List`` per interval instead of one per event.
        self._last_sweep = float("-inf")
        self._sweep_owed = False
        #: Served Instances whose slots pod-resources has been asked about since start (slots
        #: a crash left unrecorded are recorded): no plugin serves an Instance's slots before.
        #: Per Instance, not once at start: an Instance the watch brings only after the first
        #: pass would otherwise be served with a slot a live pod holds showing free.
        self._checked: set[_Key] = set()
        self._recorder = PromiseRecorder(world=self)
        self._pod_resources = (
            PodResourcesClient(pod_resources_socket) if pod_resources_socket else None
        )
        #: The compatibility mode's cross-node protocol, loaded the first time this node
        #: serves a shared device through device plugins (``_cross_node``); None until then.
        self._cross: CrossNode | None = None
        self._tasks: asyncio.TaskGroup | None = None
        # Pods holding devices of an AnnotatingHandler get its annotations, from the same
        # pod-resources List the sweep asks.
        def resolve(resource: str, ids: Sequence[str]) -> list[NodeDevice] | None:
            return devices_of(resource, ids, node=node_name, instances=self._instances,
                              configuration_resources=self._ever_config_resources,
                              table=devices)

        self._annotator = PodAnnotator(client=client, resolve=resolve)
        # Pods holding a device its handler separated are evicted, from the same List.
        self._evictor = SeparatedDeviceEvictor(reads=self._reads, resolve=resolve)
        if self._pod_resources is not None:
            self._pod_resources.on_pods = self._offer_pods
        self._freer = (
            OrphanFreer(
                client=self._pod_resources, node=node_name, ledger=self.ledger, grace=orphan_grace,
                bound_pods=BoundPodsReader(reads=self._reads, node=node_name),
                on_listed=lambda ok: metrics.pod_resources_lists.labels(
                    outcome="ok" if ok else "error").inc(),
            )
            if self._pod_resources
            else None
        )

    # -- SlotWorld ---------------------------------------------------------------------------

    def ledger(self, namespace: str, instance: str) -> SlotLedger:
        key = (namespace, instance)
        if key not in self._ledgers:
            self._ledgers[key] = SlotLedger(
                client=self._client, node=self.node, namespace=namespace, name=instance
            )
        return self._ledgers[key]

    def instance(self, namespace: str, instance: str) -> Instance | None:
        return self._instances.get((namespace, instance))

    def remember(self, instance: Instance) -> None:
        """Keep the copy a write of ours returned, ahead of its watch event.

        Only for Instances still known: one the watch has meanwhile deleted stays deleted. An
        older watch event may later overwrite it; that costs a conditioned write a retry only.
        """
        key = (instance.namespace, instance.name)
        if key in self._instances:
            self._instances[key] = instance

    def device(self, namespace: str, instance: str) -> NodeDevice | None:
        return self._devices.get(namespace, instance)

    def configuration_instances(self, namespace: str, configuration: str) -> list[Instance]:
        """The Configuration's Instances this node serves, once pod-resources has been asked
        about them: the configuration plugin maps ids onto their slots, so an Instance whose
        device appeared after the last check (a crash may have left one of its slots held by a
        live pod and unrecorded) joins only after the next pass has checked it."""
        return [
            i
            for k, i in self._instances.items()
            if k[0] == namespace
            and i.spec.configuration_name == configuration
            and self._serves(k, i)
            and (self._freer is None or k in self._checked)
        ]

    def slots_changed(self, refs: Iterable[SlotRef]) -> None:
        # No reconcile for this: the write's watch event (or, for a promise, its recording's)
        # brings one, and a pass per Allocate would make a burst of them wait on each other.
        if self._freer is not None:
            self._freer.claimed(refs)

    @property
    def answers_before_recording(self) -> bool:
        return self._freer is not None

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        self._recorder.record_later(namespace, instance, wanted)

    # -- PluginWorld (agent.slots.compat.crossnode) --------------------------------------------

    def feeds(self) -> Mapping[str, DeviceFeed]:
        return {resource: served.spec.feed for resource, served in self._served.items()}

    def configuration_resource(self, namespace: str, configuration: str) -> str | None:
        return self._config_resources.get((namespace, configuration))

    def wake(self) -> None:
        self._wake.set()

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                tasks.create_task(self.manager.run(), name="plugin-manager")
                tasks.create_task(self._watch_instances(), name="watch-instances")
                tasks.create_task(self._watch_table(), name="watch-node-devices")
                tasks.create_task(self._reconcile_loop(), name="reconcile-plugins")
                if self._pod_resources is not None:
                    tasks.create_task(self._annotator.run(), name="annotate-pods")
                    tasks.create_task(self._evictor.run(), name="evict-off-separated")
        finally:
            self._tasks = None
            # Promises still unrecorded are recorded by the next start's pod-resources sweep.
            await self._recorder.close()
            await self._display.close()
            if self._pod_resources is not None:
                await self._pod_resources.close()

    def _forget_unseen_later(self) -> None:
        """The Instance watch starts over: relist, so Instances deleted meanwhile go."""
        for ledger in self._ledgers.values():
            ledger.forget_latest()
        task = asyncio.create_task(self._relist_instances(), name="relist-instances")
        self._relists.add(task)
        task.add_done_callback(self._relists.discard)

    async def _relist_instances(self) -> None:
        before = dict(self._instances)
        try:
            listed = {
                (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
                async for obj in node_instances.list_instances(self._client, self.node)
            }
            missed = watching.missed_deletions(before, self._instances, listed)
            # Not listed may mean only that the label went: read each before forgetting it.
            found = {key: await node_instances.still_there(
                self._client, self.node, *key, before[key].uid) for key in missed}
        except Exception as error:  # ApiError, or the API server unreachable: the next
            # watch restart relists again, and the periodic reconcile carries on meanwhile
            log.warning("relist of Instances failed (%s)", watching.describe(error))
            return
        for key, obj in found.items():
            if self._instances.get(key) is not before[key]:
                continue  # the watch brought a newer copy meanwhile
            if obj is None:
                self._forget(key)
            else:
                self._seen(obj)
        self._wake.set()

    def _forget(self, key: _Key) -> None:
        self._instances.pop(key, None)
        self._passed.pop(key, None)
        self._ledgers.pop(key, None)
        self._display.forget(key)
        self._unlabelled.discard(key)

    def _seen(self, obj: dict[str, Any]) -> bool:
        """Take in a copy of an Instance; whether it tells a pass anything new.

        A copy that differs only in its ``resourceVersion`` from the one the last pass started
        from (the echo of a slot write that pass already decided from, or of a display write:
        ``status.used`` and ``status.nodes`` are not part of ``Instance``) changes no
        decision: it is kept, for the next conditioned write, but wakes no pass. The echo of a
        write no pass has started from (an Allocate's recording, kept by ``remember``) wakes
        one.
        """
        instance = Instance.from_object(obj)
        key = (instance.namespace, instance.name)
        self._display.seen(key, obj.get("status") or {})
        # Every Instance's ledger hears of each copy: a first reservation write refused as
        # stale retries on the newest one without a read (SlotLedger.seen).
        self.ledger(*key).seen(instance)
        known = self._passed.get(key)
        was_unlabelled = key in self._unlabelled
        # Older than our own last write while the watch lags it: a pass starts from
        # that write instead (_own_writes_first).
        self._instances[key] = instance
        if node_instances.is_labelled(obj, self.node):
            self._unlabelled.discard(key)
        else:  # read after its label went: no watch event brings its changes
            self._unlabelled.add(key)
        return (known is None or was_unlabelled != (key in self._unlabelled)
                or replace(known, resource_version=instance.resource_version) != instance)

    async def _watch_instances(self) -> None:
        # Only the Instances labelled for this node: a write to another node's never comes.
        stream = node_instances.watch(
            self._client, self.node, what="instances", on_restart=self._forget_unseen_later,
        )
        async for op, obj in stream:
            if op == "DELETED":
                self._forget((obj["metadata"].get("namespace") or "", obj["metadata"]["name"]))
            elif not self._seen(obj):
                self._correct_display(obj)
                continue
            self._wake.set()

    def _correct_display(self, obj: dict[str, Any]) -> None:
        """A copy that wakes no pass may still carry display fields someone else wrote wrong:
        those are put right as a pass would (DisplayFields.correct), without the pass."""
        key = (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
        instance = self._instances.get(key)
        if instance is not None and self._serves(key, instance):
            self._display.correct({key: instance})

    def _volcano_pins(self, namespace: str, configuration: str) -> VolcanoPins:
        """Where the Configuration's plugin reads Volcano's choice of chips (it answers
        nothing unless they are Ascend chips with Huawei's metadata on)."""

        def devices() -> list[tuple[str, NodeDevice]]:
            return [(i.name, d) for i in self.configuration_instances(namespace, configuration)
                    if (d := self.device(namespace, i.name)) is not None]

        pod_resources = self._pod_resources

        async def holding() -> set[tuple[str, str]]:
            assert pod_resources is not None
            return {(p.namespace, p.name) for p in await pod_resources.pods()
                    if any(ids for _, ids in p.devices)}

        return VolcanoPins(reads=self._reads, node=self.node, devices=devices,
                           holding=holding if pod_resources is not None else None)

    def _offer_pods(self, pods: Sequence[PodDevices]) -> None:
        """A pod-resources ``List`` answered: to the annotator and the evictor."""
        self._annotator.offer(pods)
        self._evictor.offer(pods)

    async def _watch_table(self) -> None:
        version = self._devices.version
        while True:
            version = await self._devices.wait_changed(version)
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        resync_at = loop.time() + RESYNC_SECONDS
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that lands as the event fires, and this loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._idle_seconds(resync_at - loop.time())):
                    await self._wake.wait()
            full = self._wake.is_set() or self._retry or loop.time() >= resync_at
            self._wake.clear()
            self._retry = False
            try:
                if full:
                    resync_at = loop.time() + RESYNC_SECONDS
                    await self.reconcile()
                else:  # only the sweep was due
                    await self._sweep()
            except Exception:
                # One bad pass (API hiccup, lost races, a socket error) must not stop the
                # plugins; the retry, the next event or the resync tries again.
                self._retry = True
                log.exception("device-plugin reconcile failed; retrying")

    def _idle_seconds(self, until_resync: float) -> float:
        """How long the loop may sleep without an event."""
        if self._retry:
            return RETRY_SECONDS
        if self._sweep_owed:
            loop = asyncio.get_running_loop()
            return max(0.0, self._last_sweep + SWEEP_AWAITED_SECONDS - loop.time())
        if self._holding:
            awaited = self._freer is not None and self._freer.awaited
            return min(SWEEP_AWAITED_SECONDS if awaited else SWEEP_SECONDS, until_resync)
        return max(0.0, until_resync)

    async def _sweep(self, *, adopt: bool = False) -> None:
        if self._freer is not None:
            self._last_sweep = asyncio.get_running_loop().time()
            self._sweep_owed = False
            self._holding = await self._freer.sweep(
                list(self._instances.values()), self._ever_config_resources, adopt=adopt
            )

    def _serves(self, key: _Key, instance: Instance) -> bool:
        """Whether a device plugin of this node serves the Instance: it lists this node, this
        node finds it, and its Configuration's allocator is the kubelets' (one allocator per
        device, local or shared: a device the scheduler allocates is served through DRA
        alone, docs/slots.md)."""
        if self.node not in instance.spec.nodes or self._devices.get(*key) is None:
            return False
        configuration = instance.spec.configuration_name
        allocator = self._devices.allocator(key[0], configuration)
        if allocator is None:
            # Undecided (the controller has not said yet): an agent that can serve DRA waits
            # rather than hand out slots it may have to take back; one that cannot serves
            # the only way it can.
            return not self._dra
        if allocator == Allocator.DRA and not self._dra:
            self._warn_no_dra((key[0], configuration))
        return allocator == Allocator.DEVICE_PLUGIN

    def _warn_no_dra(self, configuration: _Key) -> None:
        if configuration not in self._warned_no_dra:
            self._warned_no_dra.add(configuration)
            log.error("Configuration %s/%s: its devices are allocated through DRA, but this "
                      "agent runs with DRA=off: this node serves them to nobody (turn DRA on, "
                      "or pin spec.allocator: devicePlugin)", *configuration)

    def _own_writes_first(self) -> None:
        """Instances as this agent's own last slot write left them, where the watch has not
        delivered that write yet: a pass must not advertise a slot this node just released
        (or withdraw one it just reserved) from the older copy."""
        for key, ledger in self._ledgers.items():
            if key in self._instances and ledger.latest is not None:
                self._instances[key] = ledger.latest

    def _pass_starts(self) -> None:
        """The copies this pass decides from: an echo of one of them wakes no later pass."""
        self._own_writes_first()
        self._passed = dict(self._instances)

    async def reconcile(self) -> None:
        self._pass_starts()
        served = {k: i for k, i in self._instances.items() if self._serves(k, i)}
        await self._learn_held_config_resources()
        if self._freer is not None and not served.keys() <= self._checked:
            # Before a plugin first serves an Instance: slots that live pods hold and a crash
            # left unrecorded are recorded (raises, and is retried, while pod-resources does
            # not answer).
            await self._sweep(adopt=True)
        self._checked = set(served)
        if self._cross is None and any(i.spec.shared for i in served.values()):
            await self._cross_node()
        if self._cross is not None:
            for key, instance in served.items():
                if instance.spec.shared:
                    self._cross.serving(key[0], instance.spec.configuration_name)
        self.metrics.set_slots(self.node, slot_counts(served, self.node))
        await self._reserve_before_serving(served)
        wanted: set[str] = set()
        groups: dict[_Key, list[Instance]] = {}
        for count, (key, instance) in enumerate(served.items(), start=1):
            device = self._devices.get(*key)
            if device is None:
                # Gone from the table since the pass began (its awaits let the discovery run
                # go on): not advertised, so its plugin is withdrawn below.
                continue
            wanted.add(await self._ensure_instance_plugin(key, instance, device))
            groups.setdefault((key[0], instance.spec.configuration_name), []).append(instance)
            if count % PASS_YIELD_EVERY == 0:
                # Unchanged plugins never yield: without this a pass over hundreds of
                # Instances holds the loop for milliseconds while Allocates wait behind it.
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        for (namespace, configuration), instances in groups.items():
            wanted.add(await self._ensure_configuration_plugin(namespace, configuration, instances))
        gone = sorted(set(self._served) - wanted)
        for resource in gone:
            served_plugin = self._served.pop(resource)
            if served_plugin.key[0] == "configuration":
                self._config_resources.pop(served_plugin.key[1:], None)
        await self.manager.remove(*gone)
        await asyncio.sleep(0)
        await self._move_reservations(served)
        await self._keep_node_count_down()
        await self._withdraw_from_unlisted()
        await asyncio.sleep(0)
        self._display.correct(served)
        if asyncio.get_running_loop().time() - self._last_sweep >= SWEEP_AWAITED_SECONDS:
            await self._sweep()
        else:
            self._sweep_owed = self._freer is not None

    async def _learn_held_config_resources(self) -> None:
        """The configuration-level resource of every Configuration whose slots this node holds
        through virtual ids, served or not (an agent restarted after its Configuration moved to
        DRA): the orphan freer reads its pods' pod-resources entries by that name."""
        for (namespace, _), instance in list(self._instances.items()):
            key = (namespace, instance.spec.configuration_name)
            if key not in self._ever_config_resources and held_virtual_ids([instance], self.node):
                self._ever_config_resources[key] = await self._configuration_resource(*key)

    async def _cross_node(self) -> None:
        """Load and start the compatibility mode's cross-node protocol: this node now serves a
        shared device through device plugins. Once loaded it runs until the agent stops."""
        from agent.slots.compat.crossnode import CrossNode  # lazily: the seam (docs/slots.md)

        log.info("serving a shared device through device plugins: the cross-node protocol "
                 "(compatibility mode) starts node=%s", self.node)
        cross = CrossNode(client=self._client, node=self.node, world=self,
                          pod_resources=self._pod_resources, reads=self._reads)
        await cross.check_rights()
        self._cross = cross
        if self._tasks is not None:
            self._tasks.create_task(self._cross.run(), name="cross-node-protocol")

    async def _ensure_instance_plugin(self, key: _Key, instance: Instance,
                                      device: NodeDevice) -> str:
        resource = instance_resource_name(instance.name)
        advertised = instance_devices(instance, self.node, healthy=device.healthy)
        await self._ensure(
            resource,
            ("instance", *key),
            advertised,
            pre_start=device.needs_prepare,
            backend_for=lambda feed: InstanceBackend(
                world=self, namespace=key[0], instance=key[1],
                configuration=instance.spec.configuration_name,
            ),
        )
        return resource

    async def _ensure_configuration_plugin(
        self, namespace: str, configuration: str, instances: list[Instance]
    ) -> str:
        devices = {i.name: self._devices.get(namespace, i.name) for i in instances}
        resource = self._config_resources.get((namespace, configuration))
        if resource is None:
            # The discovery side read the Configuration to publish these devices: its resource
            # name comes with them (a GET only for a device recorded without it).
            known = {d.configuration_resource for d in devices.values() if d is not None}
            known.discard("")
            resource = (known.pop() if len(known) == 1
                        else await self._configuration_resource(namespace, configuration))
            self._config_resources[(namespace, configuration)] = resource
            self._ever_config_resources[(namespace, configuration)] = resource
        advertised = configuration_devices(
            configuration,
            instances,
            self.node,
            healthy=[name for name, d in devices.items() if d is not None and d.healthy],
        )
        await self._ensure(
            resource,
            ("configuration", namespace, configuration),
            advertised,
            pre_start=any(d is not None and d.needs_prepare for d in devices.values()),
            backend_for=lambda feed: ConfigurationBackend(
                world=self,
                namespace=namespace,
                configuration=configuration,
                feed=feed,
                pins=self._volcano_pins(namespace, configuration),
            ),
        )
        return resource

    async def _ensure(
        self,
        resource: str,
        key: tuple[str, str, str],
        advertised: list[AdvertisedDevice],
        *,
        pre_start: bool,
        backend_for: Callable[[DeviceFeed], PluginBackend],
    ) -> None:
        served = self._served.get(resource)
        if served is not None and served.key == key and served.spec.pre_start_required == pre_start:
            served.spec.feed.publish(advertised)
            return
        feed = DeviceFeed(advertised)
        spec = PluginSpec(
            resource_name=resource,
            socket_name=socket_name(resource),
            backend=backend_for(feed),
            feed=feed,
            pre_start_required=pre_start,
        )
        await self.manager.add(spec)
        self._served[resource] = _Served(spec=spec, key=key)

    async def _configuration_resource(self, namespace: str, configuration: str) -> str:
        override = None
        try:
            obj = await self._client.get(ConfigurationResource, configuration, namespace=namespace)
            override = Configuration.from_object(as_dict(obj)).spec.resource_name
        except ApiError as error:
            if not is_not_found(error):
                raise
        return configuration_resource_name(configuration, override)

    async def _reserve_before_serving(self, served: dict[_Key, Instance]) -> None:
        """Reservations for Instances no plugin serves yet, written before their plugins
        start, so that a new device's first ``ListAndWatch`` already offers the slots reserved
        for this node (one pass and its watch round trip fewer per new device).
        Only reservations: nothing is advertised yet that a release would have to take back;
        releases and demand stay with ``_move_reservations``, after the plugins. ``served``
        takes the copies written."""
        new = {key: instance for key, instance in served.items()
               if instance_resource_name(instance.name) not in self._served}
        if not new:
            return
        # Each Instance's write is its own (its ledger's lock, conditioned on its copy): up to
        # RESERVE_IN_FLIGHT of them at once, as the discovery side writes the Instances.
        # What pinned pods want is split over all of a Configuration's Instances: judged on
        # the whole pass, not on each lane's share of it.
        needs = self._needs(served)
        keys = list(new)
        await asyncio.gather(*(
            self._move_reservations({key: new[key] for key in keys[lane::RESERVE_IN_FLIGHT]},
                                    reserve_only=True, needs=needs)
            for lane in range(min(RESERVE_IN_FLIGHT, len(keys)))
        ))
        for key in new:
            if (current := self._instances.get(key)) is not None:
                served[key] = self.ledger(*key).latest or current

    def _needs(self, served: Mapping[_Key, Instance]) -> tuple[dict[_Key, int], set[_Key]]:
        """Slots pinned pods want of each Instance, and Instances a starting pod may need.
        Without the cross-node protocol (local devices only) no pod's demand is followed: the
        one listed node reserves every free slot and never gives one away."""
        if self._cross is None:
            return {}, set()
        return self._cross.needs(served, self._config_resources)

    async def _move_reservations(
        self, served: dict[_Key, Instance], *, reserve_only: bool = False,
        needs: tuple[dict[_Key, int], set[_Key]] | None = None,
    ) -> None:
        wanted, holding = needs if needs is not None else self._needs(served)
        for count, key in enumerate(served, start=1):
            if count % PASS_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            # The newest copy known, not the pass's: the watch (or a write of ours) may have
            # brought a newer one since the pass began, and the write is conditioned on it.
            if (watched := self._instances.get(key)) is None:
                continue  # deleted while the pass yielded: nothing left to move
            instance = self.ledger(*key).latest or watched
            plan = reservation_plan(
                instance, self.node, wanted=wanted.get(key, 0), hold=key in holding
            )
            if reserve_only:
                if not plan.reserve:
                    continue
                plan = replace(plan, release=(), demand=instance.demand.get(self.node, 0))
            published = instance.demand.get(self.node, 0)
            if not plan and published == plan.demand:
                continue
            if plan.release and not await self._give_away_or_retry(key, set(plan.release)):
                plan = replace(plan, release=())
                if not plan and published == plan.demand:
                    continue
            ledger = self.ledger(*key)
            try:
                async with ledger.lock:
                    if plan.release:
                        await ledger.release(list(plan.release), known=ledger.current(instance))
                    if plan.reserve:
                        # The demand these reservations meet goes in the same write.
                        await ledger.reserve(list(plan.reserve), demand=plan.demand,
                                             known=ledger.current(instance))
                    elif published != plan.demand:
                        await ledger.publish_demand(plan.demand)
            except (ApiError, TooManyConflicts, InstanceGone) as error:
                self._retry = True
                log.warning("moving reservations of %s/%s failed: %s", *key, error)
            else:
                if not reserve_only:
                    # This pass's plugins advertised from the copy before the move: the next
                    # pass advertises from the write itself (_own_writes_first) without waiting
                    # for its watch event, whose echo then wakes nothing (_seen).
                    self._wake.set()

    async def _give_away_or_retry(self, key: _Key, slots: set[str]) -> bool:
        """Stop advertising ``slots`` so that their reservations can be released, once the
        cross-node protocol's gate clears them; False (still advertised) if it does not."""
        if self._cross is None:
            return False  # only a shared device moves slots between nodes
        try:
            if await self._cross.give_away(key, slots):
                return True
            self._retry = self._retry or self._cross.retry
        except ApiError as error:
            self._retry = True
            log.warning("giving slots %s of %s/%s away failed: %s", sorted(slots), *key, error)
        return False

    async def _keep_node_count_down(self) -> None:
        """The Node's counts no higher than what this node advertises healthy (compatibility
        mode only: ``agent.slots.compat.crossnode.CrossNode.keep_down``)."""
        if self._cross is None:
            return
        try:
            await self._cross.keep_down()
        except ApiError as error:
            self._retry = True
            log.warning("lowering the Node's device counts failed: %s", error)

    async def _withdraw_from_unlisted(self) -> None:
        """Free this node's usage on Instances that no longer list it; once none is left,
        the Instance concerns this node no more: its label goes and it is forgotten."""
        for key, instance in list(self._instances.items()):
            if self.node in instance.spec.nodes:
                continue
            mine = {
                slot: usage_of(instance, slot)
                for slot in instance.spec.device_usage
                if is_held_by(usage_of(instance, slot), self.node)
            }
            if mine:
                ledger = self.ledger(*key)
                async with ledger.lock:
                    await ledger.free(mine)
                continue
            if key not in self._unlabelled:
                meta = {"name": key[1], "namespace": key[0],
                        "resourceVersion": instance.resource_version}
                try:
                    # Refused as stale (409): it changed since, and its event comes.
                    await node_instances.drop_label(self._client, self.node, {"metadata": meta})
                except ApiError as error:
                    self._retry = True
                    log.warning("dropping this node's label from %s/%s failed: %s", *key, error)
                    continue
            self._forget(key)


async def serve_device_plugins(
    *,
    client: AsyncClient,
    node_name: str,
    plugin_dir: Path,
    pod_resources_socket: Path | None,
    devices: NodeDeviceTable,
    metrics: AgentMetrics,
    orphan_grace: float = ORPHAN_GRACE_SECONDS,
    dra: bool = False,
    reads: NodeReads | None = None,
) -> None:
    """Serve a kubelet device plugin for every Instance this node can serve; runs until
    cancelled, then removes every plugin socket."""
    service = DevicePluginService(
        client=client,
        node_name=node_name,
        plugin_dir=plugin_dir,
        pod_resources_socket=pod_resources_socket,
        devices=devices,
        metrics=metrics,
        orphan_grace=orphan_grace,
        dra=dra,
        reads=reads,
    )
    await service.run()
