"""What the DRA health stream tells the kubelet: each served device under the pool and name its
ResourceSlice publishes, this node's verdict on it, sent again on every change of a verdict and
at the refresh, and a device that leaves the table sent once as Unknown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import health, slices
from discovery_handlers.contract import Device, Health

NODE = "n1"


def served(instance: str, *, shared: bool = False, reason: str = "") -> NodeDevice:
    return NodeDevice(instance=instance, namespace="ns", configuration="echo",
                      device=Device(id=instance), shared=shared,
                      health=Health.unhealthy(reason) if reason else Health())


def lines(report: list[health.DeviceReport]) -> set[tuple[str, str, str, str]]:
    return {(r.pool, r.device, r.status.name, r.message) for r in report}


async def next_report(stream: AsyncGenerator[list[health.DeviceReport]]
                      ) -> list[health.DeviceReport]:
    async with asyncio.timeout(5):
        return await anext(stream)


async def test_pools_verdicts_changes_and_a_device_gone() -> None:
    table = NodeDeviceTable()
    await table.put(served("echo-aaaaaa"))
    await table.put(served("echo-bbbbbb", shared=True, reason="not seen since 12:00"))
    local = slices.local_pool("ns", "echo", NODE)
    shared = slices.shared_pool("ns", "echo", "echo-bbbbbb")
    clock = [1000.0]
    stream = health.HealthReports(node_name=NODE, devices=table, clock=lambda: clock[0],
                                  refresh=3600).watch()
    first = await next_report(stream)
    assert lines(first) == {(local, "echo-aaaaaa", "HEALTHY", ""),
                            (shared, "echo-bbbbbb", "UNHEALTHY", "not seen since 12:00")}
    assert {r.since for r in first} == {1000}

    # A verdict that changes is sent at once; the unchanged device keeps its time.
    clock[0] = 1010.0
    await table.put(served("echo-aaaaaa", reason="lamp broke"))
    second = await next_report(stream)
    assert lines(second) == {(local, "echo-aaaaaa", "UNHEALTHY", "lamp broke"),
                             (shared, "echo-bbbbbb", "UNHEALTHY", "not seen since 12:00")}
    assert {r.device: r.since for r in second} == {"echo-aaaaaa": 1010, "echo-bbbbbb": 1000}

    # Gone from the table: Unknown once, then left out.
    await table.remove("ns", "echo-bbbbbb")
    third = await next_report(stream)
    assert lines(third) == {(local, "echo-aaaaaa", "UNHEALTHY", "lamp broke"),
                            (shared, "echo-bbbbbb", "UNKNOWN", health.GONE_MESSAGE)}
    await table.put(served("echo-aaaaaa"))
    assert lines(await next_report(stream)) == {(local, "echo-aaaaaa", "HEALTHY", "")}
    await stream.aclose()


async def test_an_unchanged_list_is_sent_again_at_the_refresh() -> None:
    table = NodeDeviceTable()
    await table.put(served("echo-aaaaaa"))
    stream = health.HealthReports(node_name=NODE, devices=table, refresh=0.05).watch()
    first = await next_report(stream)
    assert await next_report(stream) == first, "the same list, the same times"
    await stream.aclose()


def test_a_long_reason_is_cut_to_the_apis_limit() -> None:
    found = health.verdicts(NODE, {("ns", "x"): served("echo-aaaaaa", reason="r" * 2000)})
    ((status, message),) = found.values()
    assert (status, len(message)) == (health.Status.UNHEALTHY, health.MAX_MESSAGE)


async def test_a_stop_ends_the_stream() -> None:
    table = NodeDeviceTable()
    stopping = asyncio.Event()
    stream = health.HealthReports(node_name=NODE, devices=table, stopping=stopping,
                                  refresh=3600).watch()
    assert await next_report(stream) == []
    stopping.set()
    async with asyncio.timeout(5):
        assert [r async for r in stream] == [], "ended, nothing more sent"
