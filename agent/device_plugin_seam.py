"""Start the device-plugin allocator only once this node has something to serve that way.

A device has one allocator (docs/slots.md). Where every Configuration's is the scheduler, the
agent never imports the device-plugin allocator (``agent.deviceplugins.slots``,
``agent.deviceplugins.kubelet``, the kubelet's gRPC stubs): it waits here until a device of this
node is the kubelets' to allocate (its Configuration says ``devicePlugin``, or says nothing while
this agent serves no DRA), or until it finds a slot a device-plugin pod still holds on this node (a
switch to the scheduler while such pods run, then an agent restart: the allocator's orphan freer
must free those slots when their pods end). Once started, the allocator runs until the agent stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDeviceTable
from agent.kube import node_instances, watching
from crds.instance import Instance, SlotUsage

log = logging.getLogger(__name__)


def wants_device_plugins(devices: NodeDeviceTable, *, dra: bool) -> bool:
    """Whether a device this node serves is the kubelets' to allocate."""
    return any(devices.device_plugins_allocate(d.namespace, d.configuration, dra=dra)
               for d in devices.snapshot().values())


def holds_slots(node: str, instances: Iterable[Instance]) -> bool:
    """Whether a device-plugin slot of one of ``instances`` is recorded as held by ``node``."""
    for instance in instances:
        for value in instance.spec.device_usage.values():
            if value and SlotUsage.parse(value).node == node:
                return True
    return False


async def serve_when_wanted(*, client: AsyncClient, node_name: str, devices: NodeDeviceTable,
                            dra: bool, serve: Callable[[], Awaitable[None]]) -> None:
    """Run ``serve`` (which imports and runs the device-plugin allocator) once this node has a
    device to serve through it or holds a device-plugin slot; never before."""
    listed = await _node_instances(client, node_name)
    if holds_slots(node_name, listed):
        log.info("device plugins start: this node holds device-plugin slots")
    else:
        version = devices.version
        while not wants_device_plugins(devices, dra=dra):
            version = await devices.wait_changed(version)
        log.info("device plugins start: a device of this node is the kubelets' to allocate")
    await serve()


async def _node_instances(client: AsyncClient, node_name: str) -> list[Instance]:
    """This node's Instances, the list retried with the watches' backoff until it answers: a
    429 (the API server (re)initialising the Instances' storage, as right after the CRD is
    installed), a 5xx or an API server away must not end the agent."""
    failures = 0
    while True:
        try:
            return [Instance.from_object(obj)
                    async for obj in node_instances.list_instances(client, node_name)]
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            log.warning("listing this node's Instances failed (%s); retrying",
                        watching.describe(error))
            await asyncio.sleep(watching.retry_delay(failures))
