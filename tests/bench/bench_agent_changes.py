"""The agent's change paths: each change to what the scheduler is offered, beside a floor
measured in the same run and the figures last recorded, in both allocation modes.

A guard a reader can run against change-to-allocatable paths growing slower, in both allocators:
the device plugins' result is a Node's allocatable, DRA's a ResourceSlice. One node (the agent
as ``python -m agent.main`` with device plugins and pod-resources, the emulated kubelet, the
real control plane) goes through, per run and mode: a Configuration of 2 shared debugEcho
devices created, one device offline, back online, the Configuration deleted; and once, 200
devices in one Configuration applied and deleted. Idle CPU of the agent at 2 and 200 devices is
sampled over ``--idle-window`` seconds, beside its floor over the same windows: a bare process
serving one idle gRPC server (``grpc_idle_floor``: grpcio's own threads, which any device plugin
pays).

- **devicePlugin** (the agent without DRA, its device plugins serve the shared devices): each
  change is timed to the Node watch event that shows the count (both Instances' resources 1;
  the offline one 0; 1 again; every resource 0). The floor: a bare lightkube client's merge
  patch of this Node's status (a resource of another domain, which neither the agent nor the
  emulator touches) until the same watch shows it, one Node status write and its event.
- **dra** (the agent with ``DRA=on``, slices only, no kubelet plugin; the Configurations pin
  ``spec.sharedDeviceAllocation: dra``, so no device plugin serves them; the controller's
  ``DeviceClasses`` in-process publishes the shared devices' pools from the Instances, as
  ``--dra`` does): each change is timed to the ResourceSlice watch event (this node's slices
  and the controller's) that shows it: every device untainted in its pool's newest
  generation, all of that generation's slices there; the offline device no longer offered
  (withdrawn: with grace 0 its Instance goes, and the controller withdraws a device that is
  gone; tainted would count too); offered again; every pool of the Configuration without a
  slice. The floor: a bare client's server-side apply of a ResourceSlice of another driver
  carrying this node's label, one generation higher each run, until the same watch shows
  that generation.

Times run from the API call (or the availability-file write) to the watch event.
``--mode dra|devicePlugin|both`` (default both, one after the other on one control plane),
``--runs N`` (default 5), ``--idle-window S`` (default 20; 0 skips), ``--no-many`` skips the
200-device part, ``--profile DIR`` runs ``py-spy record --format raw`` on the agent during each
part (DIR/MODE/paths.raw, many-applied.raw, idle-2.raw, idle-many.raw, many-deleted.raw;
summarise one with ``python -m tests.bench.profile_summary FILE``), ``--record`` writes the
medians of the modes run to ``recorded_agent_changes.json`` beside this module (a mode not run
keeps what was recorded for it), ``--agent-tree DIR`` runs the agent of another checkout (a
``git worktree`` of the commit to compare: the bench, harness and control plane stay this
one's; its commit is printed beside the figures; ``--record`` is refused with it). It prints;
it asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from agent.dra import slices
from agent.dra.publisher import ResourceSliceResource
from agent.kube.client import ConfigurationResource, as_dict
from controller.dra.device_classes import DeviceClasses
from crds import dra
from crds.naming import instance_name, instance_resource_name
from tests.bench.bench_agent_setup import BenchNode, agent_tree, bench_node, quiet_logs
from tests.bench.grpc_idle_floor import idle_grpc_server
from tests.bench.stats import machine_speed_line, summary
from tests.harness.agent_process import api_client, debug_echo_configuration
from tests.harness.controlplane import ControlPlane
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

log = logging.getLogger(__name__)

RECORDED = Path(__file__).with_name("recorded_agent_changes.json")
FLOOR_RESOURCE = "example.com/bench-floor"
#: The DRA floor's slice: another driver, so the agent's publisher leaves it alone.
FLOOR_DRIVER = "bench-floor.example.com"
FLOOR_MANAGER = "edgeplug-bench-floor"
MANY = 200
#: How long py-spy is given to attach before a profiled part starts.
PROFILER_ATTACH_S = 1.0
#: Quiet time before an idle reading, as bench_agent_idle's SETTLE_S (sampling, not a wait).
IDLE_SETTLE_S = 5.0
#: Pause before re-opening a watch the API server closed (as bench_agent_setup's).
WATCH_REOPEN_S = 0.2
CONDITION_DEADLINE_S = 60.0
DEVICE_PLUGIN, DRA = "devicePlugin", "dra"
MODES = (DEVICE_PLUGIN, DRA)

#: Each mode's name for each figure (the devicePlugin names are recorded_agent_changes.json's).
LABELS: dict[str, dict[str, str]] = {
    DEVICE_PLUGIN: {
        "applied": "Configuration applied → all allocatable",
        "offline": "device offline → allocatable 0",
        "online": "device online → allocatable",
        "deleted": "Configuration deleted → allocatable 0",
        "many-applied": f"{MANY} devices applied → allocatable",
        "many-deleted": f"{MANY} devices deleted → allocatable 0",
    },
    DRA: {
        "applied": "Configuration applied → all in slices",
        "offline": "device offline → withdrawn from slices",
        "online": "device online → in a slice",
        "deleted": "Configuration deleted → its pools gone",
        "many-applied": f"{MANY} devices applied → all in slices",
        "many-deleted": f"{MANY} devices deleted → pools gone",
    },
}
for _labels in LABELS.values():
    _labels["idle-2"] = "idle CPU per 60 s, 2 devices"
    _labels["idle-many"] = f"idle CPU per 60 s, {MANY} devices"
    _labels["idle-floor"] = "idle CPU per 60 s, floor: a bare gRPC server"


def _options(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"runs": 5, "idle": 20.0, "many": True, "profile": None,
                            "record": False, "modes": MODES, "agent_tree": None}
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
        elif arg == "--agent-tree":
            opts["agent_tree"] = agent_tree(next(args))
        elif arg == "--mode":
            mode = next(args)
            if mode not in (*MODES, "both"):
                raise SystemExit(f"--mode {mode}: one of {', '.join(MODES)}, both")
            opts["modes"] = MODES if mode == "both" else (mode,)
        else:
            raise SystemExit(f"unknown option {arg}")
    if opts["record"] and opts["agent_tree"] is not None:
        raise SystemExit("--record records this checkout's figures: not with --agent-tree")
    return opts


def _load() -> float:
    return os.getloadavg()[0]


def _instances(configuration: str, descriptions: list[str], node: str) -> list[str]:
    return [instance_name(configuration, d, shared=True, node=node) for d in descriptions]


def _absent(node: BenchNode, instance: str) -> bool:
    return instance not in node.state.instances


def _shows(node: BenchNode, resources: list[str], value: str) -> bool:
    allocatable = node.state.allocatable
    return all(allocatable.get(r, "0") == value for r in resources)


_Predicate = Callable[[], bool]


@dataclass
class SliceState:
    """This node's ResourceSlices (by name), updated from a watch; ``until`` as
    ``WatchedState.until``: the time the event that made a predicate true was received."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    _waiters: list[tuple[_Predicate, asyncio.Future[float]]] = field(default_factory=list)

    def _applied(self) -> None:
        now = time.monotonic()
        for pred, future in list(self._waiters):
            if not future.done() and pred():
                future.set_result(now)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    async def until(self, pred: _Predicate, *, what: str,
                    deadline: float = CONDITION_DEADLINE_S) -> float:
        if pred():
            return time.monotonic()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((pred, future))
        try:
            async with asyncio.timeout(deadline):
                return await future
        except TimeoutError:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}") from None
        finally:
            future.cancel()

    async def follow(self, client: AsyncClient, node: str) -> None:
        """This node's slices (its label) and the controller's (the shared devices' pools)."""
        while True:
            try:
                async for kind, obj in client.watch(ResourceSliceResource):
                    body = as_dict(obj)
                    labels = body["metadata"].get("labels") or {}
                    if (labels.get(slices.LABEL_NODE) != slices.node_label(node)
                            and labels.get(dra.LABEL_MANAGED_BY) != "edgeplug-controller"):
                        continue
                    if kind == "DELETED":
                        self.slices.pop(body["metadata"]["name"], None)
                    else:
                        self.slices[body["metadata"]["name"]] = body
                    self._applied()
            except Exception as error:  # e.g. 429 while the server warms up
                log.debug("ResourceSlice watch failed, reopening: %s", error)
            await asyncio.sleep(WATCH_REOPEN_S)

    def pools(self) -> set[str]:
        return {str(s["spec"]["pool"]["name"]) for s in self.slices.values()}

    def offered(self) -> dict[str, dict[str, Any]]:
        """Device name → device, for the devices in a pool's newest generation when every
        slice of that generation is there (what the scheduler allocates from)."""
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for body in self.slices.values():
            by_pool.setdefault(str(body["spec"]["pool"]["name"]), []).append(body)
        devices: dict[str, dict[str, Any]] = {}
        for found in by_pool.values():
            newest = max(int(s["spec"]["pool"]["generation"]) for s in found)
            current = [s for s in found if int(s["spec"]["pool"]["generation"]) == newest]
            if len(current) != int(current[0]["spec"]["pool"]["resourceSliceCount"]):
                continue
            for body in current:
                for device in body["spec"].get("devices") or []:
                    devices[str(device["name"])] = device
        return devices


@dataclass
class _Target:
    """What one mode's figures wait for, over the Instance names of a change."""

    mode: str
    node: BenchNode
    dra: SliceState | None

    def _slices(self) -> SliceState:
        assert self.dra is not None
        return self.dra

    def until(self, pred: _Predicate, *, what: str,
              deadline: float = CONDITION_DEADLINE_S) -> Any:
        state: Any = self.node.state if self.dra is None else self.dra
        return state.until(pred, what=what, deadline=deadline)

    def offered(self, instances: list[str]) -> _Predicate:
        if self.dra is None:
            return partial(_shows, self.node, [instance_resource_name(i) for i in instances],
                           "1")
        names = [slices.device_name(i) for i in instances]
        state = self.dra

        def untainted() -> bool:
            offered = state.offered()
            return all(n in offered and not offered[n].get("taints") for n in names)
        return untainted

    def withdrawn(self, instances: list[str]) -> _Predicate:
        if self.dra is None:
            return partial(_shows, self.node, [instance_resource_name(i) for i in instances],
                           "0")
        names = [slices.device_name(i) for i in instances]
        state = self.dra

        def not_offered() -> bool:
            offered = state.offered()
            return all(n not in offered or bool(offered[n].get("taints")) for n in names)
        return not_offered

    def gone(self, configuration: str, instances: list[str]) -> _Predicate:
        if self.dra is None:
            return self.withdrawn(instances)
        pools = {slices.shared_pool(self.node.namespace, configuration, i) for i in instances}
        state = self.dra
        return lambda: not pools & state.pools()

    def configuration(self, name: str, **kwargs: Any) -> dict[str, Any]:
        body = debug_echo_configuration(name, **kwargs)
        body["metadata"]["namespace"] = self.node.namespace
        if self.mode == DRA:
            body["spec"]["sharedDeviceAllocation"] = "dra"
        return body


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


def _floor_shown(state: SliceState, name: str, generation: int) -> bool:
    body = state.slices.get(name)
    return body is not None and int(body["spec"]["pool"]["generation"]) == generation


async def _slice_floor(node: BenchNode, state: SliceState, runs: int) -> list[float]:
    """One server-side apply of a one-device slice with this node's label, one generation
    higher each run, until the slice watch shows that generation; deleted after (untimed)."""
    client = api_client(node.plane)
    name = f"bench-floor-{node.name}"
    samples = []
    try:
        for run in range(runs + 1):  # the first connects the client
            generation = run + 1
            body = {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name,
                             "labels": {slices.LABEL_NODE: slices.node_label(node.name)}},
                "spec": {"driver": FLOOR_DRIVER, "nodeName": node.name,
                         "pool": {"name": "floor", "generation": generation,
                                  "resourceSliceCount": 1},
                         "devices": [{"name": "floor0"}]},
            }
            started = time.monotonic()
            await client.patch(ResourceSliceResource, name, body, patch_type=PatchType.APPLY,
                               field_manager=FLOOR_MANAGER, force=True)
            seen = await state.until(partial(_floor_shown, state, name, generation),
                                     what=f"slice floor run {run}")
            if run:
                samples.append(seen - started)
        await client.delete(ResourceSliceResource, name)
        await state.until(lambda: name not in state.slices, what="floor slice deleted")
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


async def _idle(node: BenchNode, window: float, samples: _Samples, key: str) -> None:
    """The agent's CPU seconds per 60 s over ``window`` seconds of nothing changing, as
    ``key``, and over the same window the floor's (``grpc_idle_floor``), as ``idle-floor``."""
    async with idle_grpc_server() as floor_pid:
        await asyncio.sleep(IDLE_SETTLE_S)
        before, floor_before = thread_cpu_ns(node.pid), thread_cpu_ns(floor_pid)
        await asyncio.sleep(window)
        samples.add(key, cpu_seconds_between(before, thread_cpu_ns(node.pid)) * 60.0 / window)
        samples.add("idle-floor", cpu_seconds_between(
            floor_before, thread_cpu_ns(floor_pid)) * 60.0 / window)


class _Samples:
    """Samples and the load at each, by figure name."""

    def __init__(self, mode: str) -> None:
        self.labels = LABELS[mode]
        self.values: dict[str, list[float]] = {}
        self.loads: dict[str, list[float]] = {}

    def add(self, key: str, value: float) -> None:
        figure = self.labels[key]
        self.values.setdefault(figure, []).append(value)
        self.loads.setdefault(figure, []).append(_load())


async def _paths(target: _Target, runs: int, samples: _Samples) -> None:
    node = target.node
    availability = node.plugin_dir / "echo-offline"
    availability.write_text("", encoding="utf-8")
    for run in range(runs + 1):  # run 0 warms the paths up
        name, descriptions = f"chg{run}", [f"a{run}", f"b{run}"]
        instances = _instances(name, descriptions, node.name)
        body = target.configuration(name, descriptions=descriptions, grace=0,
                                    availability_file=availability)
        started = await _create(node, body)
        seen = await target.until(target.offered(instances),
                                  what=f"run {run}: {instances} offered")
        if run:
            samples.add("applied", seen - started)
        await asyncio.sleep(0.3)  # the Instances' recordings settle (not a sync point)
        started = time.monotonic()
        availability.write_text(f"{descriptions[0]}\n", encoding="utf-8")
        seen = await target.until(target.withdrawn(instances[:1]),
                                  what=f"run {run}: {instances[0]} withdrawn")
        if run:
            samples.add("offline", seen - started)
        await node.state.until(partial(_absent, node, instances[0]),
                               what=f"run {run}: Instance gone")
        await asyncio.sleep(0.3)
        started = time.monotonic()
        availability.write_text("", encoding="utf-8")
        seen = await target.until(target.offered(instances[:1]),
                                  what=f"run {run}: {instances[0]} back")
        if run:
            samples.add("online", seen - started)
        await asyncio.sleep(0.3)
        started = await _delete(node, name)
        seen = await target.until(target.gone(name, instances),
                                  what=f"run {run}: {instances} gone after delete")
        if run:
            samples.add("deleted", seen - started)
        await asyncio.sleep(0.3)


async def _many(target: _Target, samples: _Samples, idle: float,
                profiler: _Profiler) -> None:
    node = target.node
    descriptions = [f"m{i}" for i in range(MANY)]
    instances = _instances("many", descriptions, node.name)
    body = target.configuration("many", descriptions=descriptions)
    async with profiler.part("many-applied"):
        started = await _create(node, body)
        seen = await target.until(target.offered(instances), what=f"{MANY} offered",
                                  deadline=120.0)
    samples.add("many-applied", seen - started)
    if idle:
        async with profiler.part("idle-many"):
            await _idle(node, idle, samples, "idle-many")
    async with profiler.part("many-deleted"):
        started = await _delete(node, "many")
        seen = await target.until(target.gone("many", instances), what=f"{MANY} gone",
                                  deadline=120.0)
    samples.add("many-deleted", seen - started)


@contextlib.contextmanager
def _mode_env(mode: str) -> Iterator[dict[str, str]]:
    """The agent's extra settings in ``mode``: DRA's slices only (no kubelet plugin), its
    directories under a temporary one (the hermetic guard refuses host paths)."""
    if mode != DRA:
        yield {}
        return
    directory = Path(tempfile.mkdtemp(prefix="epb-dra-", dir="/tmp"))
    try:
        yield {"DRA": "on", "DRA_REGISTRY_DIR": "", "DRA_PLUGINS_DIR": str(directory / "p"),
               "CDI_SPEC_DIR": str(directory / "cdi")}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _bench(plane: ControlPlane, mode: str, opts: dict[str, Any]) -> dict[str, Any]:
    samples = _Samples(mode)
    with _mode_env(mode) as env:
        async with bench_node(plane, label="chg", pod_resources=True, env=env,
                              agent_source=opts["agent_tree"]) as node:
            dra = SliceState() if mode == DRA else None
            watch = (asyncio.create_task(dra.follow(node.client, node.name))
                     if dra is not None else None)
            # The shared devices' pools are the controller's (controller.dra.shared_pools).
            pools = (asyncio.create_task(DeviceClasses(
                node.client, namespaces=[node.namespace]).run()) if dra is not None else None)
            try:
                target = _Target(mode, node, dra)
                runs = max(opts["runs"], 5) * 2
                floor = (await _slice_floor(node, dra, runs) if dra is not None
                         else await _floor(node, runs))
                directory = opts["profile"] / mode if opts["profile"] is not None else None
                profiler = _Profiler(directory, node.pid)
                if opts["idle"]:
                    idle_instances = _instances("idle", ["i0", "i1"], node.name)
                    await _create(node, target.configuration("idle", descriptions=["i0", "i1"]))
                    await target.until(target.offered(idle_instances),
                                       what="idle devices offered")
                    async with profiler.part("idle-2"):
                        await _idle(node, opts["idle"], samples, "idle-2")
                    await _delete(node, "idle")
                    await target.until(target.gone("idle", idle_instances),
                                       what="idle devices gone")
                async with profiler.part("paths"):
                    await _paths(target, opts["runs"], samples)
                if opts["many"]:
                    await _many(target, samples, opts["idle"], profiler)
            finally:
                for task in (watch, pools):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
    return {"floor": floor, "samples": samples.values, "loads": samples.loads}


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


def _commit(tree: Path | None = None) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False, cwd=tree or Path(__file__).resolve().parents[2])
    return out.stdout.strip() or "?"


def recorded_modes(recorded: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The recorded figures by mode (a record written before the DRA mode holds the device
    plugins' figures at its top level)."""
    if "modes" in recorded:
        modes: dict[str, dict[str, Any]] = recorded["modes"]
        return modes
    return {DEVICE_PLUGIN: recorded} if recorded else {}


def _report(mode: str, result: dict[str, Any], recorded: dict[str, Any],
            tree: Path | None) -> dict[str, Any]:
    floor = statistics.median(result["floor"])
    what = ("bare client's Node status patch → Node watch event" if mode == DEVICE_PLUGIN
            else "bare client's ResourceSlice apply → slice watch event")
    print(f"-- mode {mode}, agent of {_commit(tree)}" + (f" ({tree})" if tree else ""))
    print(summary(f"floor: {what}", result["floor"]))
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
    return {"commit": _commit(tree), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "floor_ms": round(floor * 1000, 2), "figures": figures}


def main(argv: list[str]) -> None:
    opts = _options(argv)
    quiet_logs()
    print(machine_speed_line(), flush=True)
    results: dict[str, dict[str, Any]] = {}
    with ControlPlane() as plane:
        plane.apply_crds()
        for mode in opts["modes"]:
            print(f"mode {mode} ...", flush=True)
            results[mode] = asyncio.run(_bench(plane, mode, opts))
    recorded = recorded_modes(json.loads(RECORDED.read_text()) if RECORDED.exists() else {})
    now = {mode: _report(mode, result, recorded.get(mode, {}), opts["agent_tree"])
           for mode, result in results.items()}
    if opts["record"]:
        merged = {**recorded, **now}
        RECORDED.write_text(json.dumps({"modes": {m: merged[m] for m in MODES if m in merged}},
                                       indent=2, ensure_ascii=False) + "\n")
        print(f"recorded in {RECORDED}")
    if opts["profile"] is not None:
        print(f"profiles (py-spy raw, one per part): {opts['profile']}/MODE/*.raw")


if __name__ == "__main__":
    main(sys.argv[1:])
