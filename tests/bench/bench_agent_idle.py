"""The agent at rest: CPU seconds per minute and resident memory while nothing changes.

An agent runs on every node, small gateways included, and should cost nothing
while no device, Configuration or pod changes (targets: ≤ 0.05 CPU s per 60 s with 2 and with
200 devices; ≤ 45 MiB resident with one Configuration, ≤ 64 MiB with 200 devices). This runs
``python -m agent.main`` against the real API server and the node emulator (kubelet.sock and
pod-resources), serving a debugEcho Configuration that watches an availability file (so the
handler's own idle cost counts), waits until every Instance is allocatable, lets it settle, and
then reads the agent's CPU time (utime + stime from ``/proc/<pid>/stat``) over several windows
while nothing changes. Beside it: the load average and the time of a fixed CPU-bound loop in
this process, so figures from a busier machine can be told apart. Nothing is asserted.

``python -m tests.bench agent_idle`` (defaults), or with options
``python -m tests.bench.bench_agent_idle [--window S] [--windows N] [--devices 2,200]
[--smaps]`` (``--smaps`` lists the largest resident mappings).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from crds.naming import instance_name, instance_resource_name
from tests.bench.bench_agent_memory import _status_kib
from tests.bench.bench_agent_setup import (
    DAEMONSET_SETTINGS,
    BenchNode,
    bench_node,
    daemonset_env,
    quiet_logs,
)
from tests.bench.stats import CALIBRATION_LOOPS, machine_speed
from tests.harness.agent_process import apply, debug_echo_configuration
from tests.harness.controlplane import ControlPlane
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

#: Seconds of each CPU reading, and how many are taken per device count.
WINDOW_S = 20.0
WINDOWS = 3
#: Quiet time after everything is allocatable before the first reading (start-up work ends:
#: first status writes, the emulated kubelet's first heartbeats). Sampling, not a wait.
SETTLE_S = 5.0
DEVICE_COUNTS: tuple[int, ...] = (2, 200)
READY_DEADLINE_S = 240.0
TARGET_CPU_S = 0.05
#: The fixed loop whose duration shows the machine's speed at the time of the reading.
#: With ``--smaps``: how many mappings to list by resident size.
SMAPS_TOP = 15


def _rss_by_mapping(pid: int, top: int) -> list[tuple[int, str]]:
    """Resident KiB per mapped file (or ``[anon]``, ``[heap]``, ``[stack]``), largest first."""
    sizes: dict[str, int] = {}
    name = "[anon]"
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else "[anon]"
            elif head and head[0] == "Rss:":
                sizes[name] = sizes.get(name, 0) + int(head[1])
    return sorted(((kib, n) for n, kib in sizes.items()), reverse=True)[:top]


def _options(argv: list[str]) -> tuple[float, int, tuple[int, ...]]:
    window, windows, counts = WINDOW_S, WINDOWS, DEVICE_COUNTS
    args = iter(argv)
    for arg in args:
        if arg == "--window":
            window = float(next(args))
        elif arg == "--windows":
            windows = int(next(args))
        elif arg == "--devices":
            counts = tuple(int(c) for c in next(args).split(","))
    return window, windows, counts


async def _ready(node: BenchNode, names: list[str]) -> float:
    started = time.monotonic()
    resources = [instance_resource_name(instance_name("idle", n, shared=True, node=node.name))
                 for n in names]
    await node.state.until(
        lambda: all(node.state.allocatable.get(r) == "1" for r in resources),
        what=f"{len(names)} Instance resources allocatable", deadline=READY_DEADLINE_S)
    return time.monotonic() - started


async def _idle(plane: ControlPlane, count: int, *, window: float, windows: int,
                smaps: bool) -> None:
    offline = Path(tempfile.mkdtemp(prefix="epi-", dir="/tmp")) / "offline"
    async with bench_node(plane, label="idl", pod_resources=True, env=daemonset_env()) as node:
        names = [f"d{i:03d}" for i in range(count)]
        apply(plane, node.namespace, debug_echo_configuration(
            "idle", descriptions=names, availability_file=offline))
        took = await _ready(node, names)
        await asyncio.sleep(SETTLE_S)
        per_minute, speeds = [], []
        for _ in range(windows):
            before, started = thread_cpu_ns(node.pid), time.monotonic()
            await asyncio.sleep(window)  # the reading itself: the agent is left alone
            used = cpu_seconds_between(before, thread_cpu_ns(node.pid))
            elapsed = time.monotonic() - started
            per_minute.append(used * 60 / elapsed)
            speeds.append(machine_speed() * 1000)
        memory = _status_kib(node.pid)
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        print(f"  {count} devices ({count} Instance plugins + 1 configuration plugin, "
              f"allocatable {took:.1f} s after apply):", flush=True)
        print(f"    idle CPU per 60 s: median {statistics.median(per_minute):.3f} s "
              f"(min {min(per_minute):.3f}, max {max(per_minute):.3f}; n={windows} windows "
              f"of {window:.0f} s) [target ≤ {TARGET_CPU_S} s]")
        print(f"    VmRSS {memory['VmRSS'] / 1024:.1f} MiB, VmHWM {memory['VmHWM'] / 1024:.1f} "
              f"MiB, threads {memory['Threads']}")
        print(f"    machine: load {load} (1, 5, 15 min); {CALIBRATION_LOOPS:,}-step loop "
              f"{statistics.median(speeds):.0f} ms median", flush=True)
        if smaps:
            for kib, mapping in _rss_by_mapping(node.pid, SMAPS_TOP):
                print(f"      {kib / 1024:6.1f} MiB  {mapping}")
    offline.unlink(missing_ok=True)
    offline.parent.rmdir()


def main(argv: list[str]) -> None:
    """Idle CPU and memory with each device count in ``--devices`` (2 and 200 by default)."""
    window, windows, counts = _options(argv)
    quiet_logs()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at start; "
          f"{CALIBRATION_LOOPS:,}-step loop {machine_speed() * 1000:.0f} ms", flush=True)
    print(f"the agent runs as the DaemonSet runs it: {DAEMONSET_SETTINGS}", flush=True)
    with ControlPlane() as plane:
        plane.apply_crds()
        for count in counts:
            print(f"agent at rest, {count} debugEcho devices", flush=True)
            asyncio.run(_idle(plane, count, window=window, windows=windows,
                              smaps="--smaps" in argv))


if __name__ == "__main__":
    main(sys.argv[1:])
