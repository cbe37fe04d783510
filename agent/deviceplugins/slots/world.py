"""What the device plugins' backends (``agent.deviceplugins.slots.claiming.SlotWorld``) and the
compatibility mode's cross-node protocol (``agent.deviceplugins.crossnode.coordinator.PluginWorld``)
may read and do: each Instance's ledger and newest copy, the node's devices, the running plugins'
feeds, and a reconcile pass asked for; and whether a plugin of this node serves an Instance at all.

``NodeSlots`` holds the ledgers (one ``SlotLedger`` per Instance, made on first use) and answers
from the parts ``agent.deviceplugins.slots.service`` wires it to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from lightkube import AsyncClient

from agent.deviceplugins.kubelet.feed import DeviceFeed
from agent.deviceplugins.slots.freeing import OrphanFreer
from agent.deviceplugins.slots.instance_cache import InstanceCache, Key
from agent.deviceplugins.slots.ledger import SlotLedger
from agent.deviceplugins.slots.plugins import PluginRegistry
from agent.deviceplugins.slots.recording import PromiseRecorder
from agent.deviceplugins.slots.rules import SlotRef, served_by_plugins
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.metrics import AgentMetrics
from crds.configuration import Allocator
from crds.instance import Instance, SlotUsage

log = logging.getLogger(__name__)


class NodeSlots:
    """The world the backends and the cross-node protocol act in."""

    def __init__(self, *, client: AsyncClient, node: str, metrics: AgentMetrics,
                 instances: InstanceCache, devices: NodeDeviceTable, plugins: PluginRegistry,
                 dra: bool, wake: Callable[[], None]) -> None:
        """``dra``: this agent also serves DRA (``serves``); ``wake``: ask for a reconcile
        pass."""
        self._client = client
        self.node = node
        self.metrics = metrics
        self._instances = instances
        self._devices = devices
        self._plugins = plugins
        self._dra = dra
        self._warned_no_dra: set[Key] = set()
        self.wake = wake
        self._ledgers: dict[Key, SlotLedger] = {}
        #: Frees orphaned slots (None without pod-resources); set once made from ``ledger``.
        self.freer: OrphanFreer | None = None
        #: Served Instances whose slots pod-resources has been asked about since start (slots
        #: a crash left unrecorded are recorded): no plugin serves an Instance's slots before.
        #: Per Instance, not once at start: an Instance the watch brings only after the first
        #: pass would otherwise be served with a slot a live pod holds showing free.
        self.checked: set[Key] = set()
        self.recorder = PromiseRecorder(world=self)

    def serves(self, key: Key, instance: Instance) -> bool:
        """Whether a device plugin of this node serves the Instance (``served_by_plugins``);
        a Configuration the scheduler allocates on an agent without DRA is logged once."""
        configuration = instance.spec.configuration_name
        allocator = self._devices.allocator(key[0], configuration)
        present = self._devices.get(*key) is not None
        if (allocator == Allocator.DRA and not self._dra and present
                and self.node in instance.spec.nodes
                and (key[0], configuration) not in self._warned_no_dra):
            self._warned_no_dra.add((key[0], configuration))
            log.error("Configuration %s/%s: its devices are allocated through DRA, but this "
                      "agent runs with DRA=off: this node serves them to nobody (turn DRA on, "
                      "or pin spec.allocator: devicePlugin)", key[0], configuration)
        return served_by_plugins(instance, self.node, present=present, allocator=allocator,
                                 dra=self._dra)

    # -- the ledgers -----------------------------------------------------------------------

    def ledger(self, namespace: str, instance: str) -> SlotLedger:
        key = (namespace, instance)
        if key not in self._ledgers:
            self._ledgers[key] = SlotLedger(
                client=self._client, node=self.node, namespace=namespace, name=instance
            )
        return self._ledgers[key]

    def own_writes(self) -> dict[Key, Instance | None]:
        """Each ledger's last write not yet seen back from the watch (None: none)."""
        return {key: ledger.latest for key, ledger in self._ledgers.items()}

    def forget_ledger(self, key: Key) -> None:
        self._ledgers.pop(key, None)

    def forget_latest_writes(self) -> None:
        """The Instance watch starts over: no write of ours is taken as newer than it."""
        for ledger in self._ledgers.values():
            ledger.forget_latest()

    # -- SlotWorld -------------------------------------------------------------------------

    def instance(self, namespace: str, instance: str) -> Instance | None:
        return self._instances.get((namespace, instance))

    def remember(self, instance: Instance) -> None:
        self._instances.remember(instance)

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
            and self.serves(k, i)
            and (self.freer is None or k in self.checked)
        ]

    def slots_changed(self, refs: Iterable[SlotRef]) -> None:
        # No reconcile for this: the write's watch event (or, for a promise, its recording's)
        # brings one, and a pass per Allocate would make a burst of them wait on each other.
        if self.freer is not None:
            self.freer.claimed(refs)

    @property
    def answers_before_recording(self) -> bool:
        return self.freer is not None

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        self.recorder.record_later(namespace, instance, wanted)

    # -- PluginWorld -----------------------------------------------------------------------

    def feeds(self) -> Mapping[str, DeviceFeed]:
        return self._plugins.feeds()

    def configuration_resource(self, namespace: str, configuration: str) -> str | None:
        return self._plugins.configuration_resource(namespace, configuration)
