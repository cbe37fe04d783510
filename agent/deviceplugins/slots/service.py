"""The agent's device-plugin side: Instances in, kubelet plugins and slot bookkeeping out.

``serve_device_plugins`` is ``agent.main``'s one entry point. ``DevicePluginService`` wires the
parts and runs the loop: on every change (and every ``settings.slots.resync_s`` as a safety net) a
reconcile pass serves one plugin per Instance this node serves and one per Configuration
(``agent.deviceplugins.slots.plugins``), moves reservations
(``agent.deviceplugins.slots.reservations``), frees slots of vanished pods
(``agent.deviceplugins.slots.freeing``) and keeps display fields
(``agent.deviceplugins.slots.display``). What it knows of the Instances is
``agent.deviceplugins.slots.instance_cache``'s; when the loop runs,
``agent.deviceplugins.slots.schedule``'s. It is also the ``SlotWorld`` the plugins' backends answer
the kubelet from, and the ``PluginWorld`` of the compatibility mode's cross-node protocol, loaded
the first time a shared device is served here (docs/slots.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightkube import AsyncClient

from agent.deviceplugins.kubelet.backend import PluginBackend
from agent.deviceplugins.kubelet.feed import DeviceFeed
from agent.deviceplugins.kubelet.manager import PluginManager
from agent.deviceplugins.kubelet.podresources import PodDevices, PodResourcesClient
from agent.deviceplugins.pod_annotations import PodAnnotator, devices_of
from agent.deviceplugins.separated_devices import SeparatedDeviceEvictor
from agent.deviceplugins.slots.backends import ConfigurationBackend, InstanceBackend
from agent.deviceplugins.slots.bound_pods import BoundPodsReader
from agent.deviceplugins.slots.display import DisplayFields
from agent.deviceplugins.slots.freeing import OrphanFreer
from agent.deviceplugins.slots.instance_cache import InstanceCache, InstanceWatch, Key, key_of
from agent.deviceplugins.slots.ledger import SlotLedger
from agent.deviceplugins.slots.plugins import PluginRegistry, socket_name
from agent.deviceplugins.slots.reservations import PASS_YIELD_EVERY, ReservationMover, unserved
from agent.deviceplugins.slots.rules import slot_counts
from agent.deviceplugins.slots.schedule import PassSchedule
from agent.deviceplugins.slots.world import NodeSlots
from agent.deviceplugins.volcano_allocation import VolcanoPins
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube.node_reads import NodeReads
from agent.metrics import AgentMetrics
from agent.settings import current
from crds.instance import Instance

if TYPE_CHECKING:
    from agent.deviceplugins.crossnode.coordinator import CrossNode

__all__ = ["DevicePluginService", "serve_device_plugins", "socket_name"]

log = logging.getLogger(__name__)


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
        dra: bool = False,
        reads: NodeReads | None = None,
    ) -> None:
        """``dra``: this agent also serves DRA, so shared devices whose Configuration has no
        allocator yet wait for one instead of being served by device plugins meanwhile.
        ``reads``: how the pods bound here are listed (by default with ``client``)."""
        self.node = node_name
        self._reads = reads or NodeReads(client)
        self.metrics = metrics
        self._client = client
        self._devices = devices
        self._wake = asyncio.Event()
        self.instances = InstanceCache(node_name, on_copy=self._copy_taken,
                                       on_forget=self._forgotten)
        self.plugins = PluginRegistry(client=client, node=node_name,
                                      manager=PluginManager(plugin_dir=plugin_dir,
                                                            metrics=metrics))
        self.slots = NodeSlots(client=client, node=node_name, metrics=metrics,
                               instances=self.instances, devices=devices, plugins=self.plugins,
                               dra=dra, wake=self.wake)
        self._watch = InstanceWatch(client, self.instances, wake=self.wake,
                                    on_restart=self.slots.forget_latest_writes,
                                    on_unchanged=self._correct_display)
        self.reservations = ReservationMover(client=client, node=node_name,
                                             cache=self.instances, ledger=self.slots.ledger,
                                             cross=lambda: self._cross, wake=self.wake)
        self._display = DisplayFields(
            ledger=self.slots.ledger,
            served=lambda: [(k, i) for k, i in self.instances.items() if self.slots.serves(k, i)],
        )
        self.schedule = PassSchedule()
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
            return devices_of(resource, ids, node=node_name, instances=self.instances,
                              configuration_resources=self.plugins.ever_config_resources,
                              table=devices)

        self._annotator = PodAnnotator(client=client, resolve=resolve)
        # Pods holding a device its handler separated are evicted, from the same List.
        self._evictor = SeparatedDeviceEvictor(reads=self._reads, resolve=resolve,
                                               devices=devices)
        if self._pod_resources is not None:
            self._pod_resources.on_pods = self._offer_pods
        self._freer = self.slots.freer = (
            OrphanFreer(
                client=self._pod_resources, node=node_name, ledger=self.slots.ledger,
                bound_pods=BoundPodsReader(reads=self._reads, node=node_name),
                on_listed=lambda ok: metrics.pod_resources_lists.labels(
                    outcome="ok" if ok else "error").inc(),
            )
            if self._pod_resources
            else None
        )

    @property
    def manager(self) -> PluginManager:
        return self.plugins.manager

    def ledger(self, namespace: str, instance: str) -> SlotLedger:
        return self.slots.ledger(namespace, instance)

    def wake(self) -> None:
        self._wake.set()

    # -- what the parts hear of each other -----------------------------------------------------

    def _copy_taken(self, key: Key, instance: Instance, obj: Mapping[str, Any]) -> None:
        self._display.seen(key, obj.get("status") or {})
        # Every Instance's ledger hears of each copy: a first reservation write refused as
        # stale retries on the newest one without a read (SlotLedger.seen).
        self.slots.ledger(*key).seen(instance)

    def _forgotten(self, key: Key) -> None:
        self.slots.forget_ledger(key)
        self._display.forget(key)

    def _correct_display(self, obj: Mapping[str, Any]) -> None:
        """A copy that wakes no pass may still carry display fields someone else wrote wrong:
        those are put right as a pass would (DisplayFields.correct), without the pass."""
        key = key_of(obj)
        instance = self.instances.get(key)
        if instance is not None and self.slots.serves(key, instance):
            self._display.correct({key: instance})

    def _offer_pods(self, pods: Sequence[PodDevices]) -> None:
        """A pod-resources ``List`` answered: to the annotator and the evictor."""
        self._annotator.offer(pods)
        self._evictor.offer(pods)

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                tasks.create_task(self.manager.run(), name="plugin-manager")
                tasks.create_task(self._watch.run(), name="watch-instances")
                tasks.create_task(self._watch_table(), name="watch-node-devices")
                tasks.create_task(self._reconcile_loop(), name="reconcile-plugins")
                if self._pod_resources is not None:
                    tasks.create_task(self._annotator.run(), name="annotate-pods")
                    tasks.create_task(self._evictor.run(), name="evict-off-separated")
        finally:
            self._tasks = None
            # Promises still unrecorded are recorded by the next start's pod-resources sweep.
            await self.slots.recorder.close()
            await self._display.close()
            if self._pod_resources is not None:
                await self._pod_resources.close()

    async def _watch_table(self) -> None:
        version = self._devices.version
        while True:
            version = await self._devices.wait_changed(version)
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        resync_at = loop.time() + current().slots.resync_s
        while True:
            awaited = self._freer is not None and self._freer.awaited
            idle = self.schedule.idle_seconds(loop.time(), resync_at - loop.time(),
                                              awaited=awaited)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that lands as the event fires, and this loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(idle):
                    await self._wake.wait()
            full = self._wake.is_set() or self.schedule.retry or loop.time() >= resync_at
            self._wake.clear()
            self.schedule.retry = False
            try:
                if full:
                    resync_at = loop.time() + current().slots.resync_s
                    await self.reconcile()
                else:  # only the sweep was due
                    await self._sweep()
            except Exception:
                # One bad pass (API hiccup, lost races, a socket error) must not stop the
                # plugins; the retry, the next event or the resync tries again.
                self.schedule.retry = True
                log.exception("device-plugin reconcile failed; retrying")

    async def _sweep(self, *, adopt: bool = False) -> None:
        if self._freer is not None:
            now = asyncio.get_running_loop().time()
            holding = await self._freer.sweep(
                list(self.instances.values()), self.plugins.ever_config_resources, adopt=adopt)
            self.schedule.swept(now, holding=holding)

    def pass_starts(self) -> None:
        """The copies this pass decides from (InstanceCache.pass_starts)."""
        self.instances.pass_starts(self.slots.own_writes())

    async def reconcile(self) -> None:
        """One pass: plugins, reservations, usage and display as the Instances now say."""
        self.pass_starts()
        served = {k: i for k, i in self.instances.items() if self.slots.serves(k, i)}
        await self.plugins.learn_held(self.instances.values())
        if self._freer is not None and not served.keys() <= self.slots.checked:
            # Before a plugin first serves an Instance: slots that live pods hold and a crash
            # left unrecorded are recorded (raises, and is retried, while pod-resources does
            # not answer).
            await self._sweep(adopt=True)
        self.slots.checked = set(served)
        if self._cross is None and any(i.spec.shared for i in served.values()):
            await self._cross_node()
        if self._cross is not None:
            for key, instance in served.items():
                if instance.spec.shared:
                    self._cross.serving(key[0], instance.spec.configuration_name)
        self.metrics.set_slots(self.node, slot_counts(served, self.node))
        self.reservations.retry = False
        if new := unserved(served, self.plugins.serves_resource):
            await self.reservations.reserve_before_serving(
                served, new, self.reservations.needs(served, self.plugins.config_resources))
        await self._serve_plugins(served)
        await self.reservations.move(
            served, needs=self.reservations.needs(served, self.plugins.config_resources))
        await self.reservations.keep_node_count_down()
        await self.reservations.withdraw_from_unlisted()
        self.schedule.retry = self.schedule.retry or self.reservations.retry
        await asyncio.sleep(0)
        self._display.correct(served)
        now = asyncio.get_running_loop().time()
        if self.schedule.sweep_after_pass(now, can_sweep=self._freer is not None):
            await self._sweep()

    async def _serve_plugins(self, served: Mapping[Key, Instance]) -> None:
        """Every served Instance's plugin and its Configuration's run; the others go."""
        wanted: set[str] = set()
        groups: dict[Key, list[Instance]] = {}
        for count, (key, instance) in enumerate(served.items(), start=1):
            device = self._devices.get(*key)
            if device is None:
                # Gone from the table since the pass began (its awaits let the discovery run
                # go on): not advertised, so its plugin is withdrawn below.
                continue
            wanted.add(await self.plugins.ensure_instance(key, instance, device, partial(
                self._instance_backend, key, instance.spec.configuration_name)))
            groups.setdefault((key[0], instance.spec.configuration_name), []).append(instance)
            if count % PASS_YIELD_EVERY == 0:
                # Unchanged plugins never yield: without this a pass over hundreds of
                # Instances holds the loop for milliseconds while Allocates wait behind it.
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        for (namespace, configuration), instances in groups.items():
            devices = {i.name: self._devices.get(namespace, i.name) for i in instances}
            wanted.add(await self.plugins.ensure_configuration(
                namespace, configuration, instances, devices,
                partial(self._configuration_backend, namespace, configuration)))
        await self.plugins.withdraw_all_but(wanted)
        await asyncio.sleep(0)

    def _instance_backend(self, key: Key, configuration: str, _feed: DeviceFeed
                          ) -> PluginBackend:
        return InstanceBackend(world=self.slots, namespace=key[0], instance=key[1],
                               configuration=configuration)

    def _configuration_backend(self, namespace: str, configuration: str, feed: DeviceFeed
                               ) -> PluginBackend:
        return ConfigurationBackend(world=self.slots, namespace=namespace,
                                    configuration=configuration, feed=feed,
                                    pins=self._volcano_pins(namespace, configuration))

    def _volcano_pins(self, namespace: str, configuration: str) -> VolcanoPins:
        """Where the Configuration's plugin reads Volcano's choice of chips (it answers
        nothing unless they are Ascend chips with Huawei's metadata on)."""

        def devices() -> list[tuple[str, NodeDevice]]:
            return [(i.name, d)
                    for i in self.slots.configuration_instances(namespace, configuration)
                    if (d := self.slots.device(namespace, i.name)) is not None]

        pod_resources = self._pod_resources

        async def holding() -> set[tuple[str, str]]:
            assert pod_resources is not None
            return {(p.namespace, p.name) for p in await pod_resources.pods()
                    if any(ids for _, ids in p.devices)}

        return VolcanoPins(reads=self._reads, node=self.node, devices=devices,
                           holding=holding if pod_resources is not None else None)

    async def _cross_node(self) -> None:
        """Load and start the compatibility mode's cross-node protocol: this node now serves a
        shared device through device plugins. Once loaded it runs until the agent stops."""
        from agent.deviceplugins.crossnode.coordinator import (
            CrossNode,  # lazily: the seam (docs/slots.md)
        )

        log.info("serving a shared device through device plugins: the cross-node protocol "
                 "(compatibility mode) starts node=%s", self.node)
        cross = CrossNode(client=self._client, node=self.node, world=self.slots,
                          pod_resources=self._pod_resources, reads=self._reads)
        await cross.check_rights()
        self._cross = cross
        if self._tasks is not None:
            self._tasks.create_task(self._cross.run(), name="cross-node-protocol")


async def serve_device_plugins(
    *,
    client: AsyncClient,
    node_name: str,
    plugin_dir: Path,
    pod_resources_socket: Path | None,
    devices: NodeDeviceTable,
    metrics: AgentMetrics,
    orphan_grace: float | None = None,
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
        dra=dra,
        reads=reads,
    )
    await service.run()
