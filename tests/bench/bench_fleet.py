"""Two agents in a fleet of thousands of nodes: what other nodes' Instances cost each of them.

An agent runs on every node, and its cost should follow its node, not the cluster. This starts a
real control plane and two ``python -m agent.main`` processes (as the DaemonSet runs them: every
namespace, device plugins on, metrics served), each on an emulated node with its own debugEcho
Configuration of a few local devices. It reads each agent's CPU seconds per minute (the scheduler's
nanoseconds, thread by thread: ``ProcessReading``), resident memory (``/proc``) and bytes received
from the API server (``ss``) at rest in that cluster (the floor: only their own Instances), then
writes a fleet with a bare client (Nodes, Configurations selecting only those Nodes, local Instances
on them; the time each takes is printed), reads them at rest again, then under a churn of merge
patches to those foreign Instances at a fixed rate (``tests/harness/fleet.py``). Beside them:
the API server's and etcd's CPU, the controller's (cluster-wide, ``--standalone``) CPU and
memory, and the watch events and bytes the API server sent per Instance write (its own
/metrics) beside the Instance watch events each agent received (the agent's own /metrics);
last, writes to the agents' own Instances and the events each costs. Medians of several
windows; nothing is asserted.

``python -m tests.bench fleet [--small] [--nodes N] [--instances N] [--rate W] [--window S]
[--windows N] [--no-controller]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from agent.kube.client import InstanceResource, as_dict
from tests.bench.bench_agent_setup import WatchedState, daemonset_env, quiet_logs
from tests.bench.stats import machine_speed_line
from tests.harness.agent_process import AgentSubprocess, api_client, apply, debug_echo_configuration
from tests.harness.aio_process import cancel_and_wait
from tests.harness.controller_process import ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.fleet import (
    Churn,
    FleetSize,
    ProcessReading,
    WatchEvents,
    create_fleet,
    received_from,
    watch_events,
)
from tests.harness.metrics_scrape import scrape
from tests.harness.node_emulator import NodeEmulator

AGENTS = 2
DEVICES = 4
OWN_NAMESPACE = "fleet-own"
FLEET_NAMESPACE = "fleet"
AGENT_LABEL = "fleet.edgeplug.io/agent"
READY_DEADLINE_S = 120.0
#: After the fleet is written, the agents digest its events; the readings at rest start once
#: each agent's CPU over one sampling interval is below QUIET_CPU (a fraction of a core).
QUIET_SAMPLE_S = 2.0
QUIET_CPU = 0.05
QUIET_DEADLINE_S = 300.0
#: Pause before the first floor reading (start-up writes, the emulated kubelet's first
#: heartbeats). Sampling, not a wait for a state.
SETTLE_S = 5.0
HOUR_S = "3600"
INSTANCE_EVENTS = 'edgeplug_watch_events_total{kind="Instance"}'
#: Writes to the agents' own Instances after the churn (the events each one costs).
OWN_WRITES = 40


@dataclass(frozen=True)
class Options:
    nodes: int
    instances: int
    configurations: int
    rate: float
    window: float
    windows: int
    controller: bool


def _options(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m tests.bench fleet")
    parser.add_argument("--small", action="store_true",
                        help="100 nodes, 1,000 Instances, 2 windows of 10 s, 20 writes/s")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--instances", type=int)
    parser.add_argument("--rate", type=float, help="foreign Instance writes per second")
    parser.add_argument("--window", type=float, help="seconds of one reading")
    parser.add_argument("--windows", type=int, help="readings per phase")
    parser.add_argument("--no-controller", action="store_true")
    args: Any = parser.parse_args(argv)
    small = args.small
    nodes = args.nodes or (100 if small else 1000)
    return Options(
        nodes=nodes, instances=args.instances or nodes * 10,
        configurations=max(1, nodes // 10), rate=args.rate or (20.0 if small else 50.0),
        window=args.window or (10.0 if small else 20.0),
        windows=args.windows or (2 if small else 3), controller=not args.no_controller)


@dataclass
class FleetAgent:
    name: str
    agent: AgentSubprocess
    emulator: NodeEmulator
    state: WatchedState
    metrics_port: int

    def instance_events(self) -> float:
        """The Instance watch events this agent received so far (its own /metrics)."""
        return scrape(self.metrics_port).get(INSTANCE_EVENTS, 0.0)

    @property
    def pid(self) -> int:
        assert self.agent.process is not None
        return self.agent.process.pid

    def served(self) -> int:
        return sum(1 for key, value in self.state.allocatable.items()
                   if key.startswith("edgeplug.io/") and value != "0")


def _serving(agent: FleetAgent) -> Callable[[], bool]:
    return lambda: agent.served() >= DEVICES + 1


@contextlib.asynccontextmanager
async def _agents(plane: ControlPlane, client: AsyncClient,
                  tmp: Path) -> AsyncIterator[list[FleetAgent]]:
    """AGENTS emulated nodes, each with its agent and a Configuration selecting only it."""
    started: list[FleetAgent] = []
    watches: list[asyncio.Task[None]] = []
    try:
        for index in range(AGENTS):
            name = f"fleet-agent-{index}"
            plugin_dir = Path(tempfile.mkdtemp(prefix="epf-", dir="/tmp"))
            emulator = NodeEmulator(node_name=name, kubeconfig=plane.kubeconfig,
                                    plugin_dir=plugin_dir, labels={AGENT_LABEL: name})
            await emulator.start()
            env = daemonset_env()
            agent = AgentSubprocess(plane, node_name=name, namespace=None,
                                    serve_device_plugins=True, plugin_dir=plugin_dir,
                                    log_path=tmp / f"{name}.log", extra_env=env)
            state = WatchedState()
            watches.append(asyncio.create_task(state.follow_node(client, name)))
            agent.start()
            started.append(FleetAgent(name, agent, emulator, state, int(env["METRICS_PORT"])))
            apply(plane, OWN_NAMESPACE, debug_echo_configuration(
                  f"own-{index}", descriptions=[f"{name}-d{i}" for i in range(DEVICES)],
                shared=False, node_selector={"matchLabels": {AGENT_LABEL: name}}))
        for fleet_agent in started:
            await fleet_agent.state.until(
                _serving(fleet_agent),
                what=f"{fleet_agent.name}'s {DEVICES} Instance resources + 1 configuration "
                     "resource allocatable", deadline=READY_DEADLINE_S)
        yield started
    finally:
        for fleet_agent in started:
            fleet_agent.agent.stop()
        await cancel_and_wait(*watches)
        for fleet_agent in started:
            await fleet_agent.emulator.stop(delete_node=True)
            shutil.rmtree(fleet_agent.emulator.plugin_dir, ignore_errors=True)


#: Per process name: the readings of each window of one phase (CPU s/min, bytes received/min), its
#: VmRSS at the phase's end, and the threads that ended within a window (their CPU in it is not
#: counted: ``ProcessReading``).
@dataclass
class Phase:
    cpu: dict[str, list[float]]
    read: dict[str, list[float]]
    rss_kib: dict[str, int]
    ended: dict[str, int] = field(default_factory=dict)
    events: WatchEvents | None = None
    writes: int = 0
    #: Per agent, the Instance watch events it received in the phase (its own /metrics).
    agent_events: list[float] = field(default_factory=list)


def _readings(plane: ControlPlane, pids: Mapping[str, int]) -> dict[str, ProcessReading]:
    received = received_from(plane)
    return {n: ProcessReading.of(p, received) for n, p in pids.items()}


async def _measure(plane: ControlPlane, pids: Mapping[str, int], *, window: float,
                   windows: int) -> Phase:
    phase = Phase({n: [] for n in pids}, {n: [] for n in pids}, {})
    for _ in range(windows):
        before = _readings(plane, pids)
        await asyncio.sleep(window)  # the reading itself: the processes are left alone
        after = _readings(plane, pids)
        for n in pids:
            phase.cpu[n].append(after[n].cpu_per_minute(before[n]))
            phase.read[n].append(after[n].received_per_minute(before[n]))
            phase.rss_kib[n] = after[n].rss_kib
            phase.ended[n] = phase.ended.get(n, 0) + after[n].ended_since(before[n])
    return phase


async def _until_quiet(agents: list[FleetAgent]) -> float:
    """Seconds until every agent spent under QUIET_CPU of a core over one sample."""
    started = time.monotonic()
    while time.monotonic() - started < QUIET_DEADLINE_S:
        before = [ProcessReading.of(a.pid, {}) for a in agents]
        await asyncio.sleep(QUIET_SAMPLE_S)  # one sample of the agents' CPU
        after = [ProcessReading.of(a.pid, {}) for a in agents]
        if all(b.cpu_per_minute(a) / 60 < QUIET_CPU for a, b in zip(before, after, strict=True)):
            return time.monotonic() - started
    raise AssertionError(f"agents still busy {QUIET_DEADLINE_S:.0f} s after the fleet was written")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratio(ours: float, floor: float) -> str:
    return f"{ours / floor:.2f}x" if floor > 0 else "n/a"


def _print_process(name: str, floor: Phase, rest: Phase, churn: Phase, *,
                   writes_per_minute: float, bytes_read: bool) -> None:
    f_cpu, r_cpu, c_cpu = (_median(p.cpu[name]) for p in (floor, rest, churn))
    f_rss, r_rss = floor.rss_kib[name] / 1024, rest.rss_kib[name] / 1024
    print(f"  {name}: VmRSS floor {f_rss:.1f} MiB, fleet {r_rss:.1f} MiB "
          f"({_ratio(r_rss, f_rss)}), during churn {churn.rss_kib[name] / 1024:.1f} MiB")
    per_write = (c_cpu - r_cpu) / max(writes_per_minute, 1) * 1000
    print(f"    CPU s per 60 s: floor at rest {f_cpu:.4f}, fleet at rest {r_cpu:.4f} "
          f"({_ratio(r_cpu, f_cpu)}), during churn {c_cpu:.4f} ({_ratio(c_cpu, f_cpu)} the "
          f"floor; {per_write:.3f} ms per foreign write that succeeded, above the fleet at rest)")
    print("    each window's CPU s per 60 s: " + "; ".join(
        f"{what} " + ", ".join(f"{v:.4f}" for v in p.cpu[name])
        for what, p in (("floor", floor), ("fleet at rest", rest), ("churn", churn))))
    ended = [p.ended.get(name, 0) for p in (floor, rest, churn)]
    if any(ended):
        print("    threads that ended within a window (their CPU in it not counted): floor "
              f"{ended[0]}, fleet at rest {ended[1]}, during churn {ended[2]}")
    if bytes_read:
        f_rd, r_rd, c_rd = (_median(p.read[name]) / 1024 for p in (floor, rest, churn))
        print(f"    KiB received from the API server per 60 s: floor {f_rd:.0f}, fleet at rest "
              f"{r_rd:.0f}, during churn {c_rd:.0f} ({_ratio(c_rd, f_rd)} the floor)")


async def _churn_phase(plane: ControlPlane, client: AsyncClient, churn: Churn,
                       pids: Mapping[str, int], options: Options,
                       agents: list[FleetAgent]) -> Phase:
    before = watch_events(plane)
    received = [a.instance_events() for a in agents]
    writes_before = churn.writes
    load = asyncio.create_task(churn.run(options.window * options.windows))
    phase = await _measure(plane, pids, window=options.window, windows=options.windows)
    await load
    after = watch_events(plane)
    phase.events = WatchEvents(after.events - before.events, after.bytes - before.bytes,
                               after.watches)
    phase.writes = churn.writes - writes_before
    phase.agent_events = [a.instance_events() - r for a, r in zip(agents, received, strict=True)]
    return phase


async def _own_writes(plane: ControlPlane, client: AsyncClient,
                      agents: list[FleetAgent]) -> None:
    """OWN_WRITES annotation patches to the agents' own (local) Instances, one at a time: the
    events the API server sends per write, and what each agent received (1 per write to an
    Instance it serves, 0 for the other's)."""
    own = [as_dict(i)["metadata"]["name"]
           async for i in client.list(InstanceResource, namespace=OWN_NAMESPACE)]
    before, received = watch_events(plane), [a.instance_events() for a in agents]
    for index in range(OWN_WRITES):
        await client.patch(InstanceResource, own[index % len(own)],
                           {"metadata": {"annotations": {"bench.edgeplug.io/write": str(index)}}},
                           namespace=OWN_NAMESPACE, patch_type=PatchType.MERGE)
    await _until_received(agents, [r + OWN_WRITES / len(agents) for r in received])
    after = watch_events(plane)
    print(f"  {OWN_WRITES} writes to the agents' own Instances (each serves {DEVICES}): the API "
          f"server sent {(after.events - before.events) / OWN_WRITES:.2f} Instance watch "
          "events per write; received: " + ", ".join(
              f"{a.name} {a.instance_events() - r:.0f}"
              for a, r in zip(agents, received, strict=True)))


async def _until_received(agents: list[FleetAgent], counts: list[float]) -> None:
    deadline = time.monotonic() + READY_DEADLINE_S
    while any(a.instance_events() < c for a, c in zip(agents, counts, strict=True)):
        assert time.monotonic() < deadline, "the agents did not receive their own writes"
        await asyncio.sleep(QUIET_SAMPLE_S / 10)  # polling the agents' counters


async def _run(plane: ControlPlane, options: Options, tmp: Path) -> None:
    client = api_client(plane)
    controller = None
    try:
        await client.create(Namespace(metadata=ObjectMeta(name=OWN_NAMESPACE)))
        if options.controller:
            controller = ControllerProcess(
                plane, namespaces=[], log_path=tmp / "controller.log",
                extra_args=("--standalone", "--node-not-ready-grace", HOUR_S,
                            "--orphan-instance-grace", HOUR_S)).start()
        async with _agents(plane, client, tmp) as agents:
            servers = plane.pids()
            pids = {a.name: a.pid for a in agents}
            pids["this benchmark"] = os.getpid()
            pids["kube-apiserver"] = servers["kube-apiserver"]
            pids["etcd"] = servers["etcd"]
            if controller is not None:
                pids["controller"] = controller.pid
            await asyncio.sleep(SETTLE_S)  # start-up writes end; sampling, not a wait
            print(f"floor: {AGENTS} agents with {DEVICES} local debugEcho devices each, "
                  f"no other Instances; {options.windows} windows of {options.window:.0f} s")
            floor = await _measure(plane, pids, window=options.window, windows=options.windows)
            before = _readings(plane, pids)
            size = FleetSize(options.nodes, options.instances, options.configurations)
            fleet = await create_fleet(client, size, namespace=FLEET_NAMESPACE)
            after = _readings(plane, pids)
            print(f"fleet written by a bare client: {options.nodes:,} Nodes in "
                  f"{fleet.nodes_s:.1f} s ({options.nodes / fleet.nodes_s:.0f}/s), "
                  f"{options.configurations} Configurations, {options.instances:,} Instances "
                  f"in {fleet.instances_s:.1f} s "
                  f"({options.instances / fleet.instances_s:.0f}/s)")
            print("  CPU s spent meanwhile: " + ", ".join(
                f"{n} {after[n].cpu_since(before[n]):.1f}" for n in pids))
            print("  KiB received meanwhile: " + ", ".join(
                f"{a.name} {(after[a.name].received - before[a.name].received) / 1024:.0f}"
                for a in agents))
            quiet = await _until_quiet(agents)
            print(f"  agents quiet {quiet:.0f} s after the last Instance was written")
            rest = await _measure(plane, pids, window=options.window, windows=options.windows)
            print(f"churn: {options.rate:.0f} merge patches/s to foreign Instances "
                  "(spec.deviceUsage and status.used, alternating)")
            churn = Churn(client, fleet, rate=options.rate)
            during = await _churn_phase(plane, client, churn, pids, options, agents)
            print(f"results ({options.nodes:,} nodes, {options.instances:,} foreign "
                  f"Instances; medians of {options.windows} windows of "
                  f"{options.window:.0f} s; churn {during.writes} writes, "
                  f"{churn.failures} failed):")
            for name in pids:
                if name != "this benchmark":
                    _print_process(name, floor, rest, during, writes_per_minute=during.writes
                                   * 60 / (options.window * options.windows),
                                   bytes_read=name.startswith("fleet-agent"))
            assert during.events is not None
            writes = max(during.writes, 1)
            print(f"  API server Instance watch events during the churn: "
                  f"{during.events.events:.0f} ({during.events.events / writes:.2f} per "
                  f"write), {during.events.bytes / 1024:.0f} KiB "
                  f"({during.events.bytes / writes:.0f} bytes per write); Instance watches "
                  f"open {during.events.watches:.0f}")
            print("  Instance watch events each agent received during the churn (its own "
                  "edgeplug_watch_events_total): " + ", ".join(
                      f"{a.name} {n:.0f}" for a, n in zip(agents, during.agent_events,
                                                          strict=True)))
            await _own_writes(plane, client, agents)
    finally:
        if controller is not None:
            controller.stop()
        await client.close()


def main(argv: list[str]) -> None:
    options = _options(argv)
    quiet_logs()
    print(machine_speed_line(), flush=True)
    started = time.monotonic()
    with ControlPlane() as plane, tempfile.TemporaryDirectory(prefix="epfleet-") as tmp:
        asyncio.run(_run(plane, options, Path(tmp)))
    print(f"fleet bench: {time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.1f}",
          flush=True)
