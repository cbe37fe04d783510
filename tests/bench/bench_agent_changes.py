"""The agent's change paths (issue 36): each change to what the Node's allocatable shows, beside
a floor measured in the same run and the figures last recorded.

Why this exists: issue 36 found every change-to-allocatable path slower than two weeks before
and asked for a guard a reader can run. One node (the agent as ``python -m agent.main`` with
device plugins and pod-resources, the emulated kubelet, the real control plane) goes through, per
run: a Configuration of 2 debugEcho devices created → both Instances' resources allocatable;
one device offline → its resource 0; back online → 1; the Configuration deleted → every one of
its resources 0; and once, 200 devices in one Configuration → all 200 allocatable (and deleted →
all 0). Times run from the API call (or the availability-file write) to the Node watch event
that shows the count. The floor: a bare lightkube client's merge patch of this Node's status
(a resource of another domain, which neither the agent nor the emulator touches) until the same
watch shows it, i.e. one Node status write and its watch event, the least any of these paths
costs. Idle CPU of the agent at 2 and 200 devices is sampled over ``--idle-window`` seconds.

``--runs N`` (default 5), ``--idle-window S`` (default 20; 0 skips), ``--no-many`` skips the
200-device part, ``--profile DIR`` runs ``py-spy record --format raw`` on the agent during each part
(DIR/paths.raw, many-applied.raw, idle-2.raw, idle-many.raw, many-deleted.raw; summarise one with
``python -m tests.bench.profile_summary FILE``), ``--record`` writes the medians to
``recorded_agent_changes.json`` beside this module. It prints; it asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from agent.kube import ConfigurationResource
from crds.naming import instance_name, instance_resource_name
from tests.bench.bench_agent_setup import BenchNode, bench_node, quiet_logs
from tests.bench.stats import machine_speed_line, summary
from tests.harness.agent_process import api_client, debug_echo_configuration
from tests.harness.controlplane import ControlPlane

RECORDED = Path(__file__).with_name("recorded_agent_changes.json")
FLOOR_RESOURCE = "example.com/bench-floor"
MANY = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: How long py-spy is given to attach before a profiled part starts.
PROFILER_ATTACH_S = 1.0
#: Quiet time before an idle reading, as bench_agent_idle's SETTLE_S (sampling, not a wait).
IDLE_SETTLE_S = 5.0


def _options(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"runs": 5, "idle": 20.0, "many": True, "profile": None,
                            "record": False}
    args = iter(argv)
    for arg in args:
        if arg == "--runs":
            opts["runs"] = int(next(args))
        elif arg == "--idle-window":
            opts["idle"] = float(next(args))
        elif arg == "--no-many":
            opts["many"] = False
        elif arg == "--profile":
            opts["profile"] = Path(next(args))
        elif arg == "--record":
            opts["record"] = True
        else:
            raise SystemExit(f"unknown option {arg}")
    return opts


def _load() -> float:
    return os.getloadavg()[0]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _resources(configuration: str, descriptions: list[str], node: str) -> list[str]:
    return [instance_resource_name(instance_name(configuration, d, shared=True, node=node))
            for d in descriptions]


def _absent(node: BenchNode, instance: str) -> bool:
    return instance not in node.state.instances


def _shows(node: BenchNode, resources: list[str], value: str) -> bool:
    allocatable = node.state.allocatable
    return all(allocatable.get(r, "0") == value for r in resources)


async def _floor(node: BenchNode, runs: int) -> list[float]:
    client = api_client(node.plane)
    samples = []
    try:
        for run in range(runs + 1):  # the first connects the client
            value = str(run + 1)
            patch = {"status": {"capacity": {FLOOR_RESOURCE: value},
                                "allocatable": {FLOOR_RESOURCE: value}}}
            started = time.monotonic()
            await client.patch(Node.Status, node.name, patch, patch_type=PatchType.MERGE)
            seen = await node.state.until(
                partial(_shows, node, [FLOOR_RESOURCE], value),
                what=f"floor run {run}")
            if run:
                samples.append(seen - started)
    finally:
        await client.close()
    return samples


async def _create(node: BenchNode, body: dict[str, Any]) -> float:
    started = time.monotonic()
    await node.client.create(ConfigurationResource.from_dict(body))
    return started


async def _delete(node: BenchNode, name: str) -> float:
    started = time.monotonic()
    await node.client.delete(ConfigurationResource, name, namespace=node.namespace)
    return started


async def _idle(node: BenchNode, window: float) -> float:
    """The agent's CPU seconds per 60 s over ``window`` seconds of nothing changing."""
    await asyncio.sleep(IDLE_SETTLE_S)
    before = _cpu_seconds(node.pid)
    await asyncio.sleep(window)
    return (_cpu_seconds(node.pid) - before) * 60.0 / window


async def _paths(node: BenchNode, runs: int, samples: dict[str, list[float]],
                 loads: dict[str, list[float]]) -> None:
    availability = node.plugin_dir / "echo-offline"
    availability.write_text("", encoding="utf-8")

    def add(figure: str, value: float) -> None:
        samples.setdefault(figure, []).append(value)
        loads.setdefault(figure, []).append(_load())

    for run in range(runs + 1):  # run 0 warms the paths up
        name, descriptions = f"chg{run}", [f"a{run}", f"b{run}"]
        resources = _resources(name, descriptions, node.name)
        body = debug_echo_configuration(name, descriptions=descriptions, grace=0,
                                        availability_file=availability)
        body["metadata"]["namespace"] = node.namespace
        started = await _create(node, body)
        seen = await node.state.until(partial(_shows, node, resources, "1"),
                                      what=f"run {run}: {resources} allocatable")
        if run:
            add("Configuration applied → all allocatable", seen - started)
        await asyncio.sleep(0.3)  # the Instances' recordings settle (not a sync point)
        started = time.monotonic()
        availability.write_text(f"{descriptions[0]}\n", encoding="utf-8")
        seen = await node.state.until(partial(_shows, node, resources[:1], "0"),
                                      what=f"run {run}: {resources[0]} 0")
        if run:
            add("device offline → allocatable 0", seen - started)
        gone = instance_name(name, descriptions[0], shared=True, node=node.name)
        await node.state.until(partial(_absent, node, gone),
                               what=f"run {run}: Instance gone")
        await asyncio.sleep(0.3)
        started = time.monotonic()
        availability.write_text("", encoding="utf-8")
        seen = await node.state.until(partial(_shows, node, resources[:1], "1"),
                                      what=f"run {run}: {resources[0]} back")
        if run:
            add("device online → allocatable", seen - started)
        await asyncio.sleep(0.3)
        started = await _delete(node, name)
        seen = await node.state.until(partial(_shows, node, resources, "0"),
                                      what=f"run {run}: {resources} 0 after delete")
        if run:
            add("Configuration deleted → allocatable 0", seen - started)
        await asyncio.sleep(0.3)


async def _many(node: BenchNode, samples: dict[str, list[float]],
                loads: dict[str, list[float]], idle: float, profiler: _Profiler) -> None:
    descriptions = [f"m{i}" for i in range(MANY)]
    resources = _resources("many", descriptions, node.name)
    body = debug_echo_configuration("many", descriptions=descriptions)
    body["metadata"]["namespace"] = node.namespace
    async with profiler.part("many-applied"):
        started = await _create(node, body)
        seen = await node.state.until(lambda: _shows(node, resources, "1"),
                                      what=f"{MANY} allocatable", deadline=120.0)
    samples[f"{MANY} devices applied → allocatable"] = [seen - started]
    loads[f"{MANY} devices applied → allocatable"] = [_load()]
    if idle:
        async with profiler.part("idle-many"):
            samples[f"idle CPU per 60 s, {MANY} devices"] = [await _idle(node, idle)]
        loads[f"idle CPU per 60 s, {MANY} devices"] = [_load()]
    async with profiler.part("many-deleted"):
        started = await _delete(node, "many")
        seen = await node.state.until(lambda: _shows(node, resources, "0"),
                                      what=f"{MANY} at 0", deadline=120.0)
    samples[f"{MANY} devices deleted → allocatable 0"] = [seen - started]
    loads[f"{MANY} devices deleted → allocatable 0"] = [_load()]


async def _bench(plane: ControlPlane, opts: dict[str, Any]) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {}
    async with bench_node(plane, label="chg", pod_resources=True) as node:
        floor = await _floor(node, max(opts["runs"], 5) * 2)
        profiler = _Profiler(opts["profile"], node.pid)
        if opts["idle"]:
            warm = debug_echo_configuration("idle", descriptions=["i0", "i1"])
            warm["metadata"]["namespace"] = node.namespace
            await _create(node, warm)
            idle_resources = _resources("idle", ["i0", "i1"], node.name)
            await node.state.until(lambda: _shows(node, idle_resources, "1"),
                                   what="idle devices allocatable")
            async with profiler.part("idle-2"):
                samples["idle CPU per 60 s, 2 devices"] = [await _idle(node, opts["idle"])]
            loads["idle CPU per 60 s, 2 devices"] = [_load()]
            await _delete(node, "idle")
            await node.state.until(lambda: _shows(node, idle_resources, "0"),
                                   what="idle devices gone")
        async with profiler.part("paths"):
            await _paths(node, opts["runs"], samples, loads)
        if opts["many"]:
            await _many(node, samples, loads, opts["idle"], profiler)
    return {"floor": floor, "samples": samples, "loads": loads}


class _Profiler:
    """``py-spy record --format raw`` on the agent for one part of the run, to DIR/PART.raw
    (nothing without ``--profile``)."""

    def __init__(self, directory: Path | None, pid: int) -> None:
        self.directory, self.pid = directory, pid

    @contextlib.asynccontextmanager
    async def part(self, name: str) -> AsyncIterator[None]:
        if self.directory is None:
            yield
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self.directory / f"{name}.raw"
        process = subprocess.Popen(  # noqa: ASYNC220 (starting it does not block)
            [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw",
             "--rate", "250", "--pid", str(self.pid), "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(PROFILER_ATTACH_S)  # py-spy has no "attached" signal to wait on
        try:
            yield
        finally:
            process.send_signal(signal.SIGINT)  # py-spy writes what it sampled
            await asyncio.to_thread(process.wait, 30)


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False, cwd=Path(__file__).resolve().parents[2])
    return out.stdout.strip() or "?"


def _report(result: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    floor = statistics.median(result["floor"])
    print(summary("floor: bare client's Node status patch → Node watch event", result["floor"]))
    last = recorded.get("figures", {})
    if recorded:
        print(f"last recorded: {recorded.get('commit')} {recorded.get('date')}, floor "
              f"{recorded.get('floor_ms', 0):.1f} ms")
    print(f"{'figure':45} {'now (median)':>14} {'÷ floor':>8} {'load':>5} "
          f"{'recorded':>10} {'÷ floor':>8}")
    figures: dict[str, Any] = {}
    for figure, values in result["samples"].items():
        median = statistics.median(values)
        load = statistics.median(result["loads"][figure])
        cpu = figure.startswith("idle CPU")
        now = f"{median:.3f} s"
        ratio = "" if cpu else f"{median / floor:.1f}x"
        before = last.get(figure)
        then = f"{before['median_s']:.3f} s" if before else "—"
        then_ratio = (f"{before['median_s'] / (recorded['floor_ms'] / 1000):.1f}x"
                      if before and not cpu else "")
        print(f"{figure:45} {now:>14} {ratio:>8} {load:5.1f} {then:>10} {then_ratio:>8}"
              f"  (n={len(values)})")
        figures[figure] = {"median_s": round(median, 4), "n": len(values),
                           "load": round(load, 1)}
    return {"commit": _commit(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "floor_ms": round(floor * 1000, 2), "figures": figures}


def main(argv: list[str]) -> None:
    opts = _options(argv)
    quiet_logs()
    print(machine_speed_line(), flush=True)
    with ControlPlane() as plane:
        plane.apply_crds()
        result = asyncio.run(_bench(plane, opts))
    recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    now = _report(result, recorded)
    if opts["record"]:
        RECORDED.write_text(json.dumps(now, indent=2, ensure_ascii=False) + "\n")
        print(f"recorded in {RECORDED}")
    if opts["profile"] is not None:
        print(f"profiles (py-spy raw, one per part): {opts['profile']}/*.raw")


if __name__ == "__main__":
    main(sys.argv[1:])
