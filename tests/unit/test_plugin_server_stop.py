"""A plugin server stopped by a task that is being cancelled: the task ends cancelled.

On Python 3.11 grpc.aio's ``Server.stop(grace)`` sometimes returns normally when the task running
it is cancelled (its ``wait_for`` on the shutdown swallows a cancellation that lands as the
shutdown completes). The device-plugin service then never stopped: its reconcile loop, cancelled
while it removed a plugin, went back to sleep (a test teardown waited 30 s in vain, about 1 run
in 15). Real gRPC servers on Unix sockets; the cancellation lands at every step of the stop.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agent.deviceplugins.kubelet.backend import ContainerAllocation, PluginSpec
from agent.deviceplugins.kubelet.cancelling import cancellation_kept
from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.kubelet.server import PluginServer

#: How many event-loop steps into the stop the cancellation lands, each tried this often: a
#: stop takes a dozen steps or more; about 1 cancellation in 10 that landed was swallowed
#: before the fix.
STEPS = 40
TRIES = 8
#: A stop takes milliseconds (its grace is 0.5 s).
STOP_DEADLINE_S = 5.0

pytestmark = pytest.mark.timeout(60)


class _Backend:
    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        return [ContainerAllocation() for _ in requests]

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        return list(available)[:size]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        return None


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dps-", dir="/tmp") as d:  # short socket paths
        yield Path(d)


async def test_a_stop_cancelled_at_any_step_ends_the_task_cancelled(plugin_dir: Path) -> None:
    landed = 0
    swallowed = []
    for count, steps in enumerate(s for s in range(STEPS) for _ in range(TRIES)):
        spec = PluginSpec(resource_name=f"edgeplug.io/stop-{count}", socket_name=f"{count}.sock",
                          backend=_Backend(), feed=DeviceFeed([AdvertisedDevice("stop-0")]))
        server = PluginServer(spec=spec, plugin_dir=plugin_dir)
        async with asyncio.timeout(STOP_DEADLINE_S):
            await server.start()
        stopping = asyncio.create_task(server.stop())
        for _ in range(steps):
            await asyncio.sleep(0)
        if stopping.done():
            continue  # stopped before the cancellation: nothing to lose
        landed += 1
        stopping.cancel()
        done, _ = await asyncio.wait([stopping], timeout=STOP_DEADLINE_S)
        assert done, f"a stop cancelled at step {steps} still runs after {STOP_DEADLINE_S} s"
        if not stopping.cancelled():
            swallowed.append(steps)
    assert landed >= STEPS, f"only {landed} cancellations landed during a stop"
    assert not swallowed, (
        f"{len(swallowed)} of {landed} stops returned normally although their task was "
        f"cancelled (at steps {swallowed})"
    )


async def test_a_cancellation_a_call_swallowed_is_raised_again() -> None:
    """Deterministic: ``wait_for`` (Python 3.11) returns when the cancellation lands in the
    same step as the result; ``cancellation_kept`` raises it again after the block."""
    result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    after_block = []

    async def call() -> None:
        with cancellation_kept():
            await asyncio.wait_for(asyncio.shield(result), 5)
        after_block.append("ran on")

    task = asyncio.create_task(call())
    await asyncio.sleep(0)  # the task waits in wait_for
    result.set_result("done")
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()
    assert after_block == []


async def test_an_exception_from_the_block_passes_unchanged() -> None:
    with pytest.raises(KeyError), cancellation_kept():
        raise KeyError("x")
