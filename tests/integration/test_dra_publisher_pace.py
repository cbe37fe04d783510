"""How soon and how often the DRA publisher writes (the DRA mode of the agent_changes benchmark).

Real parts: the API server (Instances, ResourceSlices); the publisher and the agent's device
table run in-process, the table filled as the discovery side fills it (``NodeDeviceTable.put``
and ``remove``), so what the publisher is told is exactly what the agent tells it.

- A (local) device this node stopped serving is withdrawn at once, not when its Instance goes;
  a shared device is never the agent's to publish (its pool is the controller's).
- New pools' generations are looked up a batch at a time, not one list per pool.
- An Instance the watch delivers while a relist is in flight is kept, and one it deletes
  meanwhile is not brought back by the list's older answer.
- A change after a quiet spell (``settings.dra.quiet_s``) is written at once, not what is left
  of ``settings.dra.min_pass_interval_s`` after the last write later; changes in a burst are
  still paced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import publisher as publisher_module
from agent.dra import slices
from agent.dra.publisher import DraPublisher
from agent.kube.client import InstanceResource
from agent.settings import DraSettings
from crds import pool_slices
from crds.configuration import Allocator
from discovery_handlers.contract import Device
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.agent_nodes import create_instance
from tests.harness.controlplane import ControlPlane

pytestmark = [pytest.mark.timeout(120)]

NODE, OTHER = "pace-node", "pace-other"


class CountingClient(AsyncClient):
    """The real client, counting its ResourceSlice lists and stamping its slice applies."""

    slice_lists = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[float] = []
        self.wrote = asyncio.Event()  # set when a slice apply has been answered

    def list(self, res: Any, *args: Any, **kwargs: Any) -> Any:
        if res is publisher_module.ResourceSliceResource:
            self.slice_lists += 1
        return super().list(res, *args, **kwargs)

    async def patch(self, res: Any, *args: Any, **kwargs: Any) -> Any:
        if res is publisher_module.ResourceSliceResource:
            self.applied.append(time.monotonic())
            stored = await super().patch(res, *args, **kwargs)
            self.wrote.set()
            return stored
        return await super().patch(res, *args, **kwargs)


class HeldListClient(CountingClient):
    """Hands over its first list of Instances (as the API server answered it) only once
    ``release`` is set: the watch's events of the meantime reach the publisher first, as they
    do when a list's answer is slow to arrive or to be read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered = asyncio.Event()
        self.release = asyncio.Event()
        self._held = False

    def list(self, res: Any, *args: Any, **kwargs: Any) -> Any:
        listing = super().list(res, *args, **kwargs)
        if res is not InstanceResource or self._held:
            return listing
        self._held = True
        return self._handed_over_later(listing)

    async def _handed_over_later(self, listing: Any) -> AsyncIterator[Any]:
        answer = [obj async for obj in listing]
        self.answered.set()
        await self.release.wait()
        for obj in answer:
            yield obj


class DraChosenTable(NodeDeviceTable):
    """The device table with every Configuration's allocator the scheduler, as the controller
    says on a cluster with DRA (no Configuration watch runs here to record it)."""

    def allocator(self, namespace: str, configuration: str) -> Allocator | None:
        return Allocator.DRA


@contextlib.asynccontextmanager
async def publishing(cp: ControlPlane, namespace: str, client_type: type[CountingClient] = (
                     CountingClient)
                     ) -> AsyncIterator[tuple[DraPublisher, NodeDeviceTable, CountingClient]]:
    client = client_type(KubeConfig.from_file(str(cp.kubeconfig)))
    table = DraChosenTable()
    publisher = DraPublisher(client=client, node_name=NODE, namespace=namespace, devices=table)
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher, table, client
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


async def _instance(kube: AsyncClient, ns: str, table: NodeDeviceTable, configuration: str,
                    digest: str, *, nodes: list[str], shared: bool, serve: bool = True) -> str:
    name = await create_instance(kube, ns, configuration=configuration, digest=digest,
                                 nodes=nodes, capacity=1, shared=shared)
    if serve:
        await table.put(NodeDevice(instance=name, namespace=ns, configuration=configuration,
                                   device=Device(id=digest), shared=shared))
    return name


def _pool(ns: str, configuration: str, name: str, *, shared: bool) -> str:
    return (slices.shared_pool(ns, configuration, name) if shared
            else slices.local_pool(ns, configuration, NODE))


async def _devices(kube: AsyncClient, pool: str) -> set[str]:
    return set(h.pool_devices(await h.pool_slices(kube, pool)))


async def _published(kube: AsyncClient, pool: str) -> set[str] | None:
    """The pool's devices once it has any (None before: a wait for them)."""
    return await _devices(kube, pool) or None


async def test_a_device_this_node_stops_serving_is_withdrawn_before_its_instance_goes(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    ns = namespace
    async with publishing(control_plane, ns) as (publisher, table, _client):
        shared = await _instance(kube, ns, table, "cam", "b2", nodes=[NODE, OTHER], shared=True)
        usb = [await _instance(kube, ns, table, "usb", d, nodes=[NODE], shared=False)
               for d in ("c3", "d4")]
        pool = _pool(ns, "usb", usb[0], shared=False)
        await harness.eventually(lambda: _all(kube, pool, set(usb)), what="both usb devices")
        await harness.eventually(
            lambda: asyncio.sleep(0, shared in {i.name for i in publisher.known_instances()}
                                  or None), what="the shared Instance known to the publisher")

        await table.remove(ns, usb[0])
        # Every Instance is still there: nothing here deletes them.
        await harness.eventually(lambda: _all(kube, pool, {usb[1]}),
                                 what="the device this node stopped serving, withdrawn")
        assert set(await harness.instances(kube, ns)) == {shared, *usb}
        # That pass knew the shared device this node serves: the controller's to publish,
        # never the agent's.
        assert await _devices(kube, _pool(ns, "cam", shared, shared=True)) == set()


async def _all(kube: AsyncClient, pool: str, names: set[str]) -> bool:
    return await _devices(kube, pool) == names


async def test_the_watch_outranks_a_relist_answered_meanwhile(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    ns = namespace
    # Listed, then deleted before the list's answer is read.
    # (Local devices, each of a Configuration of its own: a pool each.)
    deleted = await create_instance(kube, ns, configuration="relist-a", digest="a0",
                                    nodes=[NODE], capacity=1, shared=False)
    async with publishing(control_plane, ns, HeldListClient) as (publisher, table, client):
        assert isinstance(client, HeldListClient)
        await table.put(NodeDevice(instance=deleted, namespace=ns, configuration="relist-a",
                                   device=Device(id="a0"), shared=False))
        await harness.eventually(lambda: asyncio.sleep(0, client.answered.is_set() or None),
                                 what="the publisher's first list of Instances answered")
        await kube.delete(InstanceResource, deleted, namespace=ns)
        # Created after the list was answered.
        created = await _instance(kube, ns, table, "relist-b", "b1", nodes=[NODE],
                                  shared=False)

        def known() -> set[str]:
            return {i.name for i in publisher.known_instances()}

        await harness.eventually(
            lambda: asyncio.sleep(0, (created in known() and deleted not in known()) or None),
            what="the watch's creation and deletion")
        client.release.set()
        pool = _pool(ns, "relist-b", created, shared=False)
        await harness.eventually(lambda: _published(kube, pool),
                                 what="the Instance created during the list, published")
        assert created in known(), known()
        assert deleted not in known(), known()
        # The deleted one's device is still in the table: only a pool planned from the stale
        # answer would publish it.
        assert await _devices(kube, _pool(ns, "relist-a", deleted, shared=False)) == set()


async def test_a_device_not_served_yet_is_held_not_withdrawn(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    ns = namespace
    async with publishing(control_plane, ns) as (publisher, table, _client):
        waiting = await _instance(kube, ns, table, "cam-w", "e5", nodes=[NODE], shared=False,
                                  serve=False)
        ready = await _instance(kube, ns, table, "cam-r", "f6", nodes=[NODE], shared=False)
        await harness.eventually(
            lambda: _published(kube, _pool(ns, "cam-r", ready, shared=False)),
            what="the served device published")
        passes = publisher.passes
        # A table change wakes a pass (nothing else need come after the last one).
        await table.set_eviction_grace(ns, "unrelated", 60)
        await harness.eventually(lambda: asyncio.sleep(0, publisher.passes > passes or None),
                                 what="a pass after it")
        assert await _devices(kube, _pool(ns, "cam-w", waiting, shared=False)) == set()
        assert any(i.name == waiting for i in publisher.known_instances())


async def test_new_pools_generations_are_listed_a_batch_at_a_time(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    ns = namespace
    count = pool_slices.POOLS_PER_LIST
    async with publishing(control_plane, ns) as (publisher, table, client):
        await harness.eventually(lambda: asyncio.sleep(0, publisher.passes > 0 or None),
                                 what="the publisher's first pass")
        before = client.slice_lists
        # A pool each: one local device of each of ``count`` Configurations.
        names = [await _instance(kube, ns, table, f"many-{i}", f"{i:04x}", nodes=[NODE],
                                 shared=False, serve=False) for i in range(count)]
        # All become served at once (a discovery pass's table puts), so one pass sees them.
        for i, name in enumerate(names):
            await table.put(NodeDevice(instance=name, namespace=ns, configuration=f"many-{i}",
                                       device=Device(id=f"{i:04x}"), shared=False))

        async def published() -> bool:
            return all([await _devices(kube, _pool(ns, f"many-{i}", n, shared=False)) == {n}
                        for i, n in enumerate(names)])

        await harness.eventually(published, what=f"{count} pools published")
    # A list per pass that found new pools (a few passes); one per new pool before.
    lists = client.slice_lists - before
    assert lists <= count // 4, f"{lists} lists of ResourceSlices for {count} new pools"


BURST = 4


async def test_a_change_after_a_quiet_spell_is_written_at_once_and_bursts_are_paced(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
) -> None:
    ns = namespace
    async with publishing(control_plane, ns) as (publisher, table, client):
        await harness.eventually(lambda: asyncio.sleep(0, publisher.passes > 0 or None),
                                 what="the publisher's first pass")
        burst = [await _instance(kube, ns, table, f"burst-{i}", f"b{i:03x}", nodes=[NODE],
                                 shared=False, serve=False) for i in range(BURST)]

        async def written_after(change: Any) -> float:
            """When the change was made (the device served); returns once it is written."""
            client.wrote.clear()
            await change
            made = time.monotonic()
            async with asyncio.timeout(harness.DEFAULT_DEADLINE):
                await client.wrote.wait()
            return made

        await written_after(_instance(kube, ns, table, "quiet-0", "q0", nodes=[NODE],
                                      shared=False))
        # The scenario's quiet spell (a device going a moment after another came), not a wait
        # for anything.
        await asyncio.sleep(2 * DraSettings().quiet_s)
        served = await written_after(_instance(kube, ns, table, "quiet-1", "q1", nodes=[NODE],
                                               shared=False))
        # A burst: each device is served the moment the write before it is answered.
        for i, name in enumerate(burst):
            await written_after(table.put(NodeDevice(
                instance=name, namespace=ns, configuration=f"burst-{i}",
                device=Device(id=name.rpartition("-")[2]), shared=False)))
        written = client.applied
    assert len(written) == 2 + BURST, written  # one new pool, one apply, per change
    # The second change came after a quiet spell: its pass starts at once (one list of its
    # pool's generation, then the apply), not when what is left of the interval has passed
    # (about 0.3 s here).
    assert written[1] - served < DraSettings().min_pass_interval_s / 4, (served, written)
    # In the burst each pass came settings.dra.min_pass_interval_s after the one before it.
    paced = DraSettings().min_pass_interval_s
    assert written[-1] - written[2] >= (BURST - 1) * paced * 0.9, written
