"""The controller's speed: Instance → broker latency, scale, steady state, outages, failover.

The controller's speed targets are met in benchmarks, never in pass/fail tests. Everything runs
the real controller (``python -m controller.main``, its own process) against a real control
plane and times API watch events seen by this process:

- latency: Instance created → broker pod created, Instance deleted → broker pod deleted;
- scale, two cases: *realistic* (emulated nodes that heart-beat and advertise each Instance's
  device, brokers scheduled by the real scheduler and reported Running,
  ``tests/bench/controller_cluster.py``) and *unschedulable* (bare Nodes: every broker stays
  Pending and the scheduler keeps re-marking it, a stress case). Figures that compare across
  machines: the controller's lag after the last Instance, its CPU per Instance and requests per
  Instance, beside the API server's own create rate in the same run (the machine's speed);
  the realistic case beside its floor (``controller_floor``: the same pinned pods created by a
  bare client, no controller or agent), "last pod Running after the last create", as a ratio;
- steady state: controller CPU and writes over 25 s with nothing changing;
- restart, after the scale run's steady state: the controller stopped and started again with
  every broker in place, an Instance created at once → its broker (workers start once every
  watch holds its listing, ``controller/engine/dispatch.py``: the time to list and look at the whole
  cluster again), with the new process's CPU, RSS and writes until then;
- outage: the API server stopped for N seconds → a new Instance's broker after it returns;
- failover: the active replica SIGKILLed → a new Instance's broker from the standby.

``python -m tests.bench.bench_controller --nodes 100 --instances 10000`` runs the full scale;
the defaults (``make bench``) are cheap. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.codecs import from_dict

from controller import naming
from controller.kube.client import InstanceResource
from tests.bench.controller_cluster import node_names, placement, start_kubelets
from tests.bench.controller_faults import failover, outage
from tests.bench.controller_floor import floor_run
from tests.bench.controller_measure import (
    PodWatch,
    cpu_s,
    quiesce,
    requests,
    rss_mib,
    writes,
)
from tests.bench.stats import summary
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    configuration,
    ensure_nodes,
    install_peering_crds,
    instance,
)
from tests.harness.controlplane import ControlPlane

DEFAULT_RUNS = 20
DEFAULT_NODES = 10
DEFAULT_INSTANCES = 500
DEFAULT_SCALE_RUNS = 1
DEFAULT_OUTAGE_S = 10.0
DEFAULT_FAULT_RUNS = 3
MODES = ("realistic", "unschedulable")
#: Instances created concurrently during the scale run.
CREATE_CONCURRENCY = 32
#: How long the steady state is watched for writes and CPU.
STEADY_WATCH_S = 25.0
#: Before it: no broker pod changed for this long, every one handled by the scheduler...
CLUSTER_QUIET_S = 5.0
#: ...or this long has passed since the controller settled.
CLUSTER_SETTLE_TIMEOUT_S = 300.0
#: The scale run's unschedulable brokers stay Pending and bare Nodes never turn Ready: neither
#: may be acted on while the steady state is measured.
HOUR_S = "3600"
CONVERGE_TIMEOUT_S = 900.0
POLL_S = 0.05


async def latency(client: AsyncClient, namespace: str, cfg: str, runs: int) -> None:
    watch = PodWatch(client, namespace)
    await watch.start()
    created: list[float] = []
    deleted: list[float] = []
    try:
        for run in range(runs):
            name = f"{cfg}-{run:06x}"
            pod = naming.broker_pod_name(name, "n-1")
            obj = instance(namespace, name, configuration_name=cfg, nodes=["n-1"])
            start = time.monotonic()
            await client.create(from_dict(obj))
            created.append(await watch.wait(watch.added, pod) - start)
            start = time.monotonic()
            await client.delete(InstanceResource, name, namespace=namespace)
            deleted.append(await watch.wait(watch.deleted, pod) - start)
    finally:
        await watch.stop()
    print(summary("Instance created → broker pod created", created), flush=True)
    print(summary("Instance deleted → broker pod deleted", deleted), flush=True)


def cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each named process has used so far (0 for one that is gone)."""
    used = {}
    for name, pid in pids.items():
        try:
            used[name] = cpu_s(pid)
        except FileNotFoundError:
            used[name] = 0.0
    return used


async def scale_run(
    client: AsyncClient, ctl: ControllerProcess, namespace: str, cfg: str, *, nodes: int,
    instances: int, others: dict[str, int], running: bool,
) -> dict[str, float]:
    """One scale run; returns its figures. ``others``: the processes beside the controller
    whose CPU until the last broker is reported too (the control plane, the emulated nodes,
    this benchmark). ``running``: the brokers are reported Running (emulated kubelets); wait for
    that too and return when the last one was (``running_lag_s``)."""
    requests_before = requests(ctl)
    others_before = cpu_by_process(others)
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    watch = PodWatch(client, namespace)
    await watch.start()

    async def create(name: str, node: str) -> None:
        obj = instance(namespace, name, configuration_name=cfg, nodes=[node], shared=False)
        async with limit:
            await client.create(from_dict(obj))

    cpu_before = cpu_s(ctl.pid)
    start = time.monotonic()
    await asyncio.gather(*(create(name, node) for name, node in placement(cfg, nodes, instances)))
    created_at = time.monotonic()
    peak = 0.0
    while len(watch.added) < instances:
        peak = max(peak, rss_mib(ctl.pid))
        if time.monotonic() > start + CONVERGE_TIMEOUT_S:
            raise TimeoutError(f"only {len(watch.added)}/{instances} brokers")
        await asyncio.sleep(POLL_S)
    last_broker = max(watch.added.values())
    first_broker = min(watch.added.values())
    cpu_converge = cpu_s(ctl.pid) - cpu_before
    others_used = {name: used - others_before[name]
                   for name, used in cpu_by_process(others).items()}
    sent = requests(ctl) - requests_before
    running_lag = {}
    if running:
        last_running = await watch.last_of(watch.running, instances, what="Running",
                                           timeout_s=CONVERGE_TIMEOUT_S)
        running_lag["running_lag_s"] = max(0.0, last_running - created_at)
    settle_s = await quiesce(ctl)
    # "Nothing changing" includes the cluster: the scheduler marks 10,000 unschedulable pods
    # (one status write each) for a while after the last broker exists.
    cluster_settle_s = await watch.settled(instances, quiet_s=CLUSTER_QUIET_S,
                                           timeout_s=CLUSTER_SETTLE_TIMEOUT_S)
    steady_from, steady_events = writes(ctl), watch.events
    steady_cpu = cpu_s(ctl.pid)
    await asyncio.sleep(STEADY_WATCH_S)  # the measurement window itself, not a wait for a result
    steady_events = watch.events - steady_events
    steady_writes, steady_cpu_s = writes(ctl) - steady_from, cpu_s(ctl.pid) - steady_cpu
    restarted = await restart_run(client, ctl, watch, namespace, cfg, node_names(nodes)[0])
    await watch.stop()
    return {
        "created_s": created_at - start,
        "create_rate": instances / (created_at - start),
        "lag_s": max(0.0, last_broker - created_at),
        "broker_rate": instances / max(last_broker - first_broker, 1e-3),
        "converge_s": last_broker - start,
        "cpu_ms_per_instance": 1000 * cpu_converge / instances,
        "cpu_s": cpu_converge,
        "requests_per_instance": sent / instances,
        "rss_mib": rss_mib(ctl.pid),
        "peak_mib": peak,
        "settle_s": settle_s,
        "cluster_settle_s": cluster_settle_s,
        "steady_pod_events": steady_events,
        "steady_writes": steady_writes,
        "steady_cpu_s": steady_cpu_s,
        **restarted,
        **running_lag,
        **{f"cpu_s:{name}": used for name, used in others_used.items()},
    }


async def restart_run(client: AsyncClient, ctl: ControllerProcess, watch: PodWatch,
                      namespace: str, cfg: str, node: str) -> dict[str, float]:
    """The controller stopped (SIGTERM) and started again, an Instance created at once: seconds
    from the start to its broker, and the new process's CPU, RSS and API writes until then."""
    ctl.stop()
    name = f"{cfg}-restart"
    pod = naming.broker_pod_name(name, node)
    writes_before = writes(ctl)
    start = time.monotonic()
    ctl.start()
    await client.create(from_dict(instance(namespace, name, configuration_name=cfg,
                                           nodes=[node], shared=False)))
    seen = await watch.wait(watch.added, pod, timeout_s=CONVERGE_TIMEOUT_S)
    return {"restart_broker_s": seen - start, "restart_cpu_s": cpu_s(ctl.pid),
            "restart_rss_mib": rss_mib(ctl.pid), "restart_writes": writes(ctl) - writes_before}


def describe(mode: str, nodes: int, instances: int, f: dict[str, float]) -> str:
    return (
        f"scale {mode} {nodes} nodes x {instances} Instances: API server created them in "
        f"{f['created_s']:.1f} s ({f['create_rate']:.0f} Instances/s); last broker "
        f"{f['lag_s']:.2f} s after the last Instance"
        + (f", Running {f['running_lag_s']:.2f} s after it" if "running_lag_s" in f else "")
        + f" (all in {f['converge_s']:.1f} s, "
        f"{f['broker_rate']:.0f} brokers/s); "
        f"controller CPU {f['cpu_s']:.1f} s = {f['cpu_ms_per_instance']:.2f} ms per Instance; "
        f"{f['requests_per_instance']:.3f} requests per Instance; RSS {f['rss_mib']:.0f} MiB "
        f"(peak sampled {f['peak_mib']:.0f}); settled {f['settle_s']:.1f} s later, every "
        f"broker pod {f['cluster_settle_s']:.1f} s after that; steady "
        f"{STEADY_WATCH_S:.0f} s: {f['steady_cpu_s']:.2f} s CPU, "
        f"{f['steady_writes']:.0f} writes, {f['steady_pod_events']:.0f} broker pod events; "
        f"restarted: a new Instance's broker {f['restart_broker_s']:.1f} s after the start "
        f"(the new process then: {f['restart_cpu_s']:.1f} s CPU, RSS "
        f"{f['restart_rss_mib']:.0f} MiB, {f['restart_writes']:.0f} writes); "
        f"CPU until the last broker: controller {f['cpu_s']:.1f} s, "
        + ", ".join(f"{k.removeprefix('cpu_s:')} {v:.1f} s"
                    for k, v in f.items() if k.startswith("cpu_s:"))
        + f" (in {f['converge_s']:.1f} s on {os.cpu_count()} CPUs)"
    )


async def scale_once(mode: str, nodes: int, instances: int) -> dict[str, float]:
    namespace, cfg = "bench-scale", "scale"
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        plane.kubectl("create", "namespace", namespace)
        kubelets = None
        if mode == "realistic":
            kubelets = start_kubelets(plane, namespace, cfg, nodes, instances)
        else:
            ensure_nodes(plane, node_names(nodes))
        ctl = ControllerProcess(
            plane, namespaces=[namespace], log_path=Path(tmp) / "ctl.log",
            extra_args=("--standalone", "--pending-grace", HOUR_S,
                        "--node-not-ready-grace", HOUR_S),
        ).start()
        client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
        try:
            apply(plane, configuration(namespace, cfg, pod_spec=broker_pod_spec()))
            others = {**plane.pids(), "this benchmark": os.getpid()}
            if kubelets is not None:
                others["emulated nodes"] = kubelets.pid
            figures = await scale_run(client, ctl, namespace, cfg, nodes=nodes,
                                      instances=instances, others=others,
                                      running=kubelets is not None)
        finally:
            await client.close()
            ctl.stop()
            if kubelets is not None:
                kubelets.terminate()
                kubelets.wait()
    print(describe(mode, nodes, instances, figures), flush=True)
    return figures


def floor_once(nodes: int, instances: int) -> dict[str, float]:
    """The realistic scale run's floor (``controller_floor``), printed."""
    floor = asyncio.run(floor_run(nodes, instances, concurrency=CREATE_CONCURRENCY,
                                  timeout_s=CONVERGE_TIMEOUT_S))
    print(f"floor {nodes} nodes x {instances} pinned pods by a bare client, no controller or "
          f"agent: created in {floor['created_s']:.1f} s ({floor['create_rate']:.0f} pods/s); "
          f"last pod Running {floor['running_lag_s']:.2f} s after the last create, "
          f"{floor['all_running_s']:.1f} s after the first", flush=True)
    return floor


def floor_ratios(runs: list[dict[str, float]], floors: list[dict[str, float]]) -> None:
    """Medians of ours beside the floor's, and their ratios."""
    floor = statistics.median(f["running_lag_s"] for f in floors)
    created = statistics.median(r["lag_s"] for r in runs)
    running = statistics.median(r["running_lag_s"] for r in runs)
    print(f"realistic against its floor (medians of {len(runs)} / {len(floors)} runs): last "
          f"broker {created:.2f} s (created) / {running:.2f} s (Running) after the last Instance; "
          f"floor: last pod Running {floor:.2f} s after the last create → ratio "
          f"{created / max(floor, 1e-3):.1f}x (created) / {running / max(floor, 1e-3):.1f}x "
          "(Running)", flush=True)
    whole = statistics.median(r["created_s"] + r["running_lag_s"] for r in runs)
    floor_whole = statistics.median(f["all_running_s"] for f in floors)
    print(f"   first create → last broker Running: {whole:.1f} s; floor, first create → last "
          f"pod Running: {floor_whole:.1f} s → ratio {whole / floor_whole:.2f}x", flush=True)


def medians(mode: str, runs: list[dict[str, float]]) -> None:
    if len(runs) < 2:
        return
    keys = ("lag_s", "cpu_ms_per_instance", "requests_per_instance", "rss_mib", "create_rate",
            "broker_rate", "steady_cpu_s", "steady_writes", "steady_pod_events",
            "restart_broker_s", "restart_cpu_s")
    text = ", ".join(f"{k} {statistics.median(r[k] for r in runs):.3g}" for k in keys)
    print(f"scale {mode}, median of {len(runs)} runs: {text}", flush=True)


async def bench_latency(runs: int) -> None:
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        install_peering_crds(plane)
        namespace = "bench-latency"
        plane.kubectl("create", "namespace", namespace)
        ctl = ControllerProcess(plane, namespaces=[namespace], log_path=Path(tmp) / "ctl.log",
                                extra_args=("--standalone",)).start()
        client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
        try:
            apply(plane, configuration(namespace, "lat", pod_spec=broker_pod_spec()))
            await latency(client, namespace, "lat", runs)
        finally:
            await client.close()
            ctl.stop()


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_controller")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="latency samples")
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    parser.add_argument("--instances", type=int, default=DEFAULT_INSTANCES,
                        help="Instances in the scale run (0: no scale run)")
    parser.add_argument("--scale-runs", type=int, default=DEFAULT_SCALE_RUNS)
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--outage", type=float, default=DEFAULT_OUTAGE_S,
                        help="seconds the API server is down (0: no outage runs)")
    parser.add_argument("--fault-runs", type=int, default=DEFAULT_FAULT_RUNS,
                        help="outage and failover runs (0: none)")
    parser.add_argument("--only", choices=("latency", "scale", "faults"), default=None)
    parser.add_argument("--no-floor", action="store_true",
                        help="no floor run beside each realistic scale run")
    args: Any = parser.parse_args(list(argv))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at start", flush=True)
    if args.only in (None, "latency") and args.runs > 0:
        asyncio.run(bench_latency(args.runs))
    if args.only in (None, "scale") and args.instances > 0:
        for mode in MODES if args.mode == "both" else (args.mode,):
            with_floor = mode == "realistic" and not args.no_floor
            results, floors = [], []
            for _ in range(args.scale_runs):  # alternating, so both see the same load
                if with_floor:
                    floors.append(floor_once(args.nodes, args.instances))
                results.append(asyncio.run(scale_once(mode, args.nodes, args.instances)))
            medians(mode, results)
            if with_floor:
                floor_ratios(results, floors)
    if args.only in (None, "faults") and args.fault_runs > 0:
        if args.outage > 0:
            outage(args.outage, args.fault_runs)
        failover(args.fault_runs)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"load average {load} at the end", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
