"""The device plugins this node runs: one per served Instance, one per Configuration with such
Instances, each advertising what ``agent.deviceplugins.slots.rules`` computes.

``PluginRegistry`` starts a plugin the first time a resource is wanted (``PluginManager`` owns
sockets, registration and kubelet restarts), publishes a new device list to a running one, and
withdraws those a pass no longer wants. It also knows each Configuration's resource name,
including those it served once and no longer does: pods the kubelet allocated virtual ids of
such a resource still hold their slots.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lightkube import ApiError, AsyncClient

from agent.deviceplugins.kubelet.backend import PluginBackend, PluginSpec
from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.kubelet.manager import PluginManager
from agent.deviceplugins.slots.rules import (
    configuration_devices,
    held_virtual_ids,
    instance_devices,
)
from agent.discovery.node_devices import NodeDevice
from agent.kube.client import ConfigurationResource, as_dict, is_not_found
from crds.configuration import Configuration
from crds.instance import Instance
from crds.naming import configuration_resource_name, instance_resource_name

#: Socket names longer than this are replaced by a digest (Unix socket paths are short).
MAX_SOCKET_NAME = 60

Key = tuple[str, str]
#: ("instance"|"configuration", namespace, name): what a plugin was built from.
PluginKey = tuple[str, str, str]


def socket_name(resource: str) -> str:
    """``edgeplug.io/cam-1a2b3c`` → ``edgeplug.io_cam-1a2b3c.sock`` (digest when too long)."""
    name = resource.replace("/", "_") + ".sock"
    if len(name) > MAX_SOCKET_NAME:
        name = "ep-" + hashlib.blake2b(resource.encode(), digest_size=8).hexdigest() + ".sock"
    return name


@dataclass
class _Served:
    """A plugin this registry runs, and what it was built from."""

    spec: PluginSpec
    key: PluginKey


class PluginRegistry:
    """The running plugins by resource name, and every Configuration's resource name."""

    def __init__(self, *, client: AsyncClient, node: str, manager: PluginManager) -> None:
        self._client = client
        self.node = node
        self.manager = manager
        self._served: dict[str, _Served] = {}
        self._config_resources: dict[Key, str] = {}
        #: Every configuration-level resource this agent has served, kept after its plugin
        #: goes (its Configuration switched to DRA, its devices left this node): pods the kubelet
        #: allocated virtual ids of it still hold their slots, and the orphan freer and the pod
        #: annotator must still read their pod-resources entries as those slots.
        self.ever_config_resources: dict[Key, str] = {}

    # -- reading ---------------------------------------------------------------------------

    def serves_resource(self, resource: str) -> bool:
        return resource in self._served

    def feeds(self) -> Mapping[str, DeviceFeed]:
        return {resource: served.spec.feed for resource, served in self._served.items()}

    def configuration_resource(self, namespace: str, configuration: str) -> str | None:
        """The resource of the Configuration's plugin while one runs."""
        return self._config_resources.get((namespace, configuration))

    @property
    def config_resources(self) -> Mapping[Key, str]:
        return self._config_resources

    # -- a pass ----------------------------------------------------------------------------

    async def ensure_instance(self, key: Key, instance: Instance, device: NodeDevice,
                              backend_for: Callable[[DeviceFeed], PluginBackend]) -> str:
        """The Instance's plugin runs and advertises its slots; its resource name."""
        resource = instance_resource_name(instance.name)
        advertised = instance_devices(instance, self.node, healthy=device.healthy)
        await self._ensure(resource, ("instance", *key), advertised,
                           pre_start=device.needs_prepare, backend_for=backend_for)
        return resource

    async def ensure_configuration(
        self, namespace: str, configuration: str, instances: list[Instance],
        devices: Mapping[str, NodeDevice | None],
        backend_for: Callable[[DeviceFeed], PluginBackend],
    ) -> str:
        """The Configuration's plugin runs and advertises the virtual ids of ``instances``
        (``devices``: each one's device by Instance name); its resource name."""
        resource = self._config_resources.get((namespace, configuration))
        if resource is None:
            # The discovery side read the Configuration to publish these devices: its resource
            # name comes with them (a GET only for a device recorded without it).
            known = {d.configuration_resource for d in devices.values() if d is not None}
            known.discard("")
            resource = (known.pop() if len(known) == 1
                        else await self.read_configuration_resource(namespace, configuration))
            self._config_resources[(namespace, configuration)] = resource
            self.ever_config_resources[(namespace, configuration)] = resource
        advertised = configuration_devices(
            configuration, instances, self.node,
            healthy=[name for name, d in devices.items() if d is not None and d.healthy],
        )
        await self._ensure(
            resource, ("configuration", namespace, configuration), advertised,
            pre_start=any(d is not None and d.needs_prepare for d in devices.values()),
            backend_for=backend_for,
        )
        return resource

    async def withdraw_all_but(self, wanted: set[str]) -> None:
        """Stop every plugin whose resource is not ``wanted``."""
        gone = sorted(set(self._served) - wanted)
        for resource in gone:
            served = self._served.pop(resource)
            if served.key[0] == "configuration":
                self._config_resources.pop(served.key[1:], None)
        await self.manager.remove(*gone)

    async def learn_held(self, instances: Iterable[Instance]) -> None:
        """The configuration-level resource of every Configuration whose slots this node holds
        through virtual ids, served or not (an agent restarted after its Configuration moved to
        DRA): the orphan freer reads its pods' pod-resources entries by that name."""
        for instance in list(instances):
            key = (instance.namespace, instance.spec.configuration_name)
            if key not in self.ever_config_resources and held_virtual_ids([instance], self.node):
                self.ever_config_resources[key] = await self.read_configuration_resource(*key)

    async def read_configuration_resource(self, namespace: str, configuration: str) -> str:
        """The Configuration's resource name, read from the API server."""
        override = None
        try:
            obj = await self._client.get(ConfigurationResource, configuration, namespace=namespace)
            override = Configuration.from_object(as_dict(obj)).spec.resource_name
        except ApiError as error:
            if not is_not_found(error):
                raise
        return configuration_resource_name(configuration, override)

    async def _ensure(self, resource: str, key: PluginKey, advertised: list[AdvertisedDevice], *,
                      pre_start: bool,
                      backend_for: Callable[[DeviceFeed], PluginBackend]) -> None:
        served = self._served.get(resource)
        if served is not None and served.key == key and served.spec.pre_start_required == pre_start:
            served.spec.feed.publish(advertised)
            return
        feed = DeviceFeed(advertised)
        spec = PluginSpec(resource_name=resource, socket_name=socket_name(resource),
                          backend=backend_for(feed), feed=feed, pre_start_required=pre_start)
        await self.manager.add(spec)
        self._served[resource] = _Served(spec=spec, key=key)
