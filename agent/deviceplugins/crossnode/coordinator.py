"""``CrossNode``: what the agent adds to its device plugins when a shared device is served by
several nodes' kubelets.

It follows the Pending pods pinned to this node and this Node's object (``demand.PendingPods``),
tells the reconcile pass how many slots of each served Instance those pods want and which
Instances a pod bound here may still need (``needs``), stops advertising slots this node gives
away only once ``handoff.HandoffGate`` clears them (``give_away``), and lowers this Node's counts
where they show more than this node advertises healthy (``keep_down``). At start it asks which
of the mode's rights it lacks (``rights``): it logs them once, runs without them, and gives each
Configuration it serves this way one Warning Event naming them (``serving``). The plugins'
feeds and Instances are the service's, reached through ``PluginWorld``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from agent.deviceplugins.crossnode import rights
from agent.deviceplugins.crossnode.demand import PendingPods, instance_needs
from agent.deviceplugins.crossnode.handoff import HandoffGate
from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.kubelet.podresources import PodResourcesClient
from agent.deviceplugins.slots.rules import configuration_devices
from agent.discovery.events import emit_event
from agent.discovery.node_devices import NodeDevice
from agent.kube import watching
from agent.kube.node_reads import NodeReads
from crds.api import CONFIGURATION_KIND
from crds.instance import Instance
from crds.naming import instance_resource_name

log = logging.getLogger(__name__)

_Key = tuple[str, str]
#: The Warning Event a Configuration gets from a node that serves it without the mode's rights.
MISSING_RIGHTS_REASON = "CompatibilityRightsMissing"


class PluginWorld(Protocol):
    """What ``CrossNode`` reads of the service that runs the plugins."""

    def feeds(self) -> Mapping[str, DeviceFeed]:
        """Resource name -> the feed of the plugin serving it."""
        ...

    def instance(self, namespace: str, instance: str) -> Instance | None: ...

    def device(self, namespace: str, instance: str) -> NodeDevice | None: ...

    def configuration_resource(self, namespace: str, configuration: str) -> str | None: ...

    def configuration_instances(self, namespace: str, configuration: str) -> list[Instance]: ...

    def wake(self) -> None:
        """Ask for a reconcile pass."""
        ...


class CrossNode:
    """The cross-node protocol of one agent; ``run`` follows the pods and the Node."""

    def __init__(
        self, *, client: AsyncClient, node: str, world: PluginWorld,
        pod_resources: PodResourcesClient | None, reads: NodeReads | None = None,
    ) -> None:
        self.node = node
        self._world = world
        self._pods = PendingPods(client=client, node=node, on_change=world.wake,
                                 on_node=self._node_seen)
        self._gate = HandoffGate(client=client, node=node, pod_resources=pod_resources,
                                 reads=reads)
        self._client = client
        #: The mode's rights the API server refuses this agent (``rights``), once asked.
        self.missing: list[rights.Right] = []
        #: Configurations served this way, and those whose Event is still to be sent.
        self._reported: set[_Key] = set()
        self._to_report: list[_Key] = []
        self._report_due = asyncio.Event()
        #: The last give-away was kept for a reason that may pass: pass again soon.
        self.retry = False

    async def check_rights(self) -> None:
        """Ask which of the mode's rights this agent lacks (before the first pass uses them),
        and say so once: without ``watch`` on pods, ``run`` follows the Node's demand count
        alone; without ``nodes/status``, the gate is open (as before the gate existed)."""
        self.missing = await rights.missing_rights(self._client, self.node)
        if self.missing:
            log.error("this agent serves shared devices through device plugins (compatibility "
                      "mode) without rights that mode needs: %s. Grant them (%s). Meanwhile: "
                      "%s", ", ".join(map(str, self.missing)), rights.GRANTED_BY,
                      "; ".join(r.without for r in self.missing))
            if rights.NODE_STATUS in self.missing:
                self._gate.allocatable.permitted = False

    async def run(self) -> None:
        """Follow the pods and the Node (``check_rights`` first), and send the Events."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._pods.run(pods=rights.PODS_WATCH not in self.missing))
            tasks.create_task(self._report_missing())

    def serving(self, namespace: str, configuration: str) -> None:
        """This node serves the Configuration's shared devices through device plugins: if this
        agent lacks the mode's rights, the Configuration gets one Warning Event saying so."""
        if (namespace, configuration) not in self._reported:
            self._reported.add((namespace, configuration))
            self._to_report.append((namespace, configuration))
            self._report_due.set()

    async def _report_missing(self) -> None:
        while self.missing:
            await self._report_due.wait()
            self._report_due.clear()
            while self._to_report:
                namespace, configuration = self._to_report.pop()
                try:
                    await self._emit_missing(namespace, configuration)
                except Exception as error:  # ApiError, or the API server away: the log said it
                    log.info("the Event on Configuration %s/%s about missing rights failed: %s",
                             namespace, configuration, watching.describe(error))

    async def _emit_missing(self, namespace: str, configuration: str) -> None:
        await emit_event(
            self._client, node=self.node, kind=CONFIGURATION_KIND, name=configuration,
            namespace=namespace, uid="", reason=MISSING_RIGHTS_REASON, warning=True,
            message=f"node {self.node} serves this Configuration's shared devices through "
                    f"device plugins (compatibility mode) without "
                    f"{', '.join(map(str, self.missing))}: "
                    f"{'; '.join(r.without for r in self.missing)}. "
                    f"Grant them: {rights.GRANTED_BY}")

    def needs(
        self, served: Mapping[_Key, Instance], config_resources: Mapping[_Key, str]
    ) -> tuple[dict[_Key, int], set[_Key]]:
        """``demand.instance_needs`` from the pods this node follows."""
        return instance_needs(served, self.node, config_resources=config_resources,
                              wanted=self._pods.wanted(), starting=self._pods.starting())

    def advertised_counts(self) -> dict[str, int]:
        """Per resource served, the healthy devices advertised: what its kubelet counts."""
        return {r: len(_healthy_ids(feed.devices)) for r, feed in self._world.feeds().items()}

    def _node_seen(self, node: Node) -> None:
        # A pass only where the Node shows more than is advertised (keep_down's case): not
        # for the echo of our own lowering, nor for every kubelet status write.
        allocatable = self._gate.allocatable
        if allocatable.seen(node) and allocatable.above(self.advertised_counts()):
            self._world.wake()

    async def keep_down(self) -> None:
        """The Node's counts no higher than what this node advertises healthy
        (``HandoffGate.keep_down``); raises the API's error."""
        await self._gate.keep_down(self.advertised_counts())

    async def give_away(self, key: _Key, slots: set[str]) -> bool:
        """Stop advertising ``slots`` of Instance ``key`` so that their reservations can be
        released, once the gate clears them; False (still advertised) if it does not, with
        ``retry`` set where trying again soon may succeed. Raises the API's error."""
        self.retry = False
        feeds = self._advertised_without(key, slots)
        if feeds is None:
            return False  # the Instance went meanwhile: nothing to give away
        before = {resource: len(_healthy_ids(feed.devices)) for resource, feed, _ in feeds}
        after = {resource: len(_healthy_ids(devices)) for resource, _, devices in feeds}
        if before == after:  # nothing the kubelet or the scheduler counts changes
            return True
        if not await self._gate.clear(key[1], slots, before, after):
            self.retry = self._gate.retry
            return False
        advertised = [(feed, feed.devices) for _, feed, _ in feeds]
        withdrawn = {
            resource: _healthy_ids(feed.devices) - _healthy_ids(devices)
            for resource, feed, devices in feeds
        }
        for _, feed, devices in feeds:
            feed.publish(devices)
        if await self._gate.settle(withdrawn, after):
            return True
        # Kept: advertised again (a pod bound here on the old count is admitted with it).
        for feed, old in advertised:
            feed.publish(old)
        await self._gate.allocatable.set(before)
        self.retry = self._gate.retry
        return False

    def _advertised_without(
        self, key: _Key, slots: set[str]
    ) -> list[tuple[str, DeviceFeed, list[AdvertisedDevice]]] | None:
        """Per plugin that advertises ``slots`` (the Instance's own and its Configuration's):
        its resource, its feed, and what it advertises once the slots are not this node's;
        None when the Instance is gone."""
        instance = self._world.instance(*key)
        if instance is None:
            return None
        feeds = self._world.feeds()
        changed = []
        resource = instance_resource_name(key[1])
        if (feed := feeds.get(resource)) is not None:
            changed.append((resource, feed, [
                AdvertisedDevice(d.id, healthy=d.healthy and d.id not in slots)
                for d in feed.devices
            ]))
        # The configuration plugin's virtual devices count available slots: recount without.
        reduced = replace(
            instance,
            reservations={s: n for s, n in instance.reservations.items() if s not in slots},
        )
        configuration = instance.spec.configuration_name
        config_resource = self._world.configuration_resource(key[0], configuration)
        if config_resource and (config_feed := feeds.get(config_resource)) is not None:
            others = [i for i in self._world.configuration_instances(key[0], configuration)
                      if i.name != key[1]]
            healthy = [
                i.name
                for i in [*others, reduced]
                if (d := self._world.device(key[0], i.name)) is not None and d.healthy
            ]
            changed.append((config_resource, config_feed, list(configuration_devices(
                configuration, [*others, reduced], self.node, healthy=healthy))))
        return changed


def _healthy_ids(devices: Iterable[AdvertisedDevice]) -> frozenset[str]:
    """The devices the kubelet may allocate; their number is the resource's allocatable."""
    return frozenset(d.id for d in devices if d.healthy)
