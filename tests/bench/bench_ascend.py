"""The ascend handler's cost and speed on an emulated 16-chip node.

Why this exists: issue 11 asks for the discovery pass and the CPU of one health poll on a
16-chip node, and for how long a faulted chip takes to show Unhealthy (target: within the poll
interval + 0.2 s). Timings are never pass/fail, so they are measured here. The node is
tests/harness/ascend_node.py's (the DCMI stand-in compiled and loaded through ctypes, and the
fake ``npu-smi``). A pure-Python loop timed in the same run shows the machine's speed beside
the figures.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.sources import scan
from tests.bench.stats import summary
from tests.harness.ascend_node import AscendNode, build_dcmi_library, chips_910b

CHIPS = 16
PER_CARD = 2
PASSES = 50
FAULT_RUNS = 10
POLL_S = 1.0  # the fastest poll details allow; Huawei's default is 5 s
FAULT_DEADLINE_S = 10.0
CALIBRATION_LOOPS = 2_000_000


def machine_speed() -> float:
    """Seconds for a fixed pure-Python loop: the machine's speed, beside the figures."""
    started = time.perf_counter()
    total = 0
    for value in range(CALIBRATION_LOOPS):
        total += value & 7
    return time.perf_counter() - started


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_passes(details: AscendDetails, label: str) -> None:
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(PASSES):
        cpu, wall = _cpu(), time.perf_counter()
        result = scan(details)
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
        assert len(result.devices) == CHIPS, result.status
    print("  " + summary(f"{label}: pass wall time", walls))
    print("  " + summary(f"{label}: CPU per pass (= per health poll)", cpus))


async def bench_fault(node: AscendNode, details: AscendDetails) -> list[float]:
    """Fault → the handler yields the chip Unhealthy, FAULT_RUNS times. The stream is drained
    by its own task, as the agent does, so the poll timer runs while the bench waits."""
    lists: asyncio.Queue[tuple[float, dict[str, bool]]] = asyncio.Queue()

    async def drain() -> None:
        async for devices in handler.discover(details):
            lists.put_nowait((time.perf_counter(), {d.id: d.health.healthy for d in devices}))

    async def until(phy: int, healthy: bool) -> float:
        while True:
            at, health = await asyncio.wait_for(lists.get(), FAULT_DEADLINE_S)
            if health[f"davinci{phy}"] is healthy:
                return at

    samples: list[float] = []
    consumer = asyncio.create_task(drain())
    try:
        await asyncio.wait_for(lists.get(), FAULT_DEADLINE_S)
        for run in range(FAULT_RUNS):
            phy = run % CHIPS
            # Fault at a different point of the poll cycle each run, as a real fault comes.
            await asyncio.sleep(POLL_S * ((run * 0.37) % 1.0))
            started = time.perf_counter()
            node.fault(phy)
            samples.append(await until(phy, False) - started)
            node.clear(phy)
            await until(phy, True)
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    return samples


def main(argv: Sequence[str]) -> None:
    del argv
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at start", flush=True)
    print(f"machine speed: {CALIBRATION_LOOPS:,} loop iterations in "
          f"{statistics.median(machine_speed() for _ in range(3)) * 1000:.0f} ms (median of 3)")
    with tempfile.TemporaryDirectory(prefix="bench-ascend-") as tmp:
        library = build_dcmi_library(Path(tmp) / "lib")
        node = AscendNode(Path(tmp) / "host", chips_910b(CHIPS, per_card=PER_CARD),
                          library=library)
        os.environ.update(node.env)
        dcmi = handler.parse_details(node.details(healthPollSeconds=POLL_S), {})
        smi = handler.parse_details(node.details(sources=["npu-smi"]), {})
        print(f"1. one discovery pass over {CHIPS} chips (n={PASSES})", flush=True)
        bench_passes(dcmi, "DCMI (ctypes)")
        bench_passes(smi, "npu-smi info (subprocess + parse)")
        print(f"2. fault → Unhealthy from the handler, poll {POLL_S:g} s (n={FAULT_RUNS}; "
              f"target ≤ poll + 0.2 s)", flush=True)
        print("  " + summary("fault → Unhealthy", asyncio.run(bench_fault(node, dcmi))))
