"""``python -m tests.bench allocators``: each allocator (``spec.allocator: dra`` and
``devicePlugin``) measured the same way in one run, every figure beside a floor of that run.

The scheduler (DRA) is the one allocator of every device by
default and keeps the kubelets' device plugins as a compatibility package the default path
never imports; what each costs must be measured, never asserted. Per run and allocator, a
fresh agent (``python -m agent.main``, DRA on) beside the node emulator and a controller
(``--dra``), all Configurations of its namespace pinned to that allocator (``allocators_node``):

1. rest: one Configuration of 2 local devices; the agent's idle CPU over a window beside a
   bare idle gRPC server's (``grpc_idle_floor``), its VmRSS, and how many device plugins it
   registered (none in ``dra``: the device-plugin allocator is not loaded);
2. appear: a device comes online → it is schedulable (in a slice, or in the Node's
   allocatable) and → a pod that waited for it is bound, local and shared, beside a plain
   pod's create → bound;
3. calls over the agent's Unix sockets from a process of their own, as the kubelet's: DRA
   ``NodePrepareResources`` of an allocated claim (unprepared, untimed, between calls) or
   device-plugin ``Allocate`` of a fresh slot, beside an empty unary call (the registration
   socket's ``GetInfo``, or ``GetDevicePluginOptions``);
4. N local and N shared devices: Configuration applied → all N schedulable, each beside N
   ConfigMaps created by a bare client just before (the API server's cost of one write a
   device, at the agent's concurrency).

``--runs --sizes --samples --calls --idle`` make it small; ``--profile DIR`` records the agent
(and in part 4 the controller) with py-spy during parts 3 and 4, in a run of its own: the
profiler slows what it records (``python -m tests.bench.profile_summary FILE``).

Medians over the runs (each run's own median or percentile first). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from agent.deviceplugins.slots.service import socket_name
from agent.dra.plugin import SERVICE_SOCKET, registration_socket
from crds import dra
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.bench.allocators_node import (
    ALLOCATORS,
    AllocatorNode,
    allocator_node,
    appear,
    many,
    writes_floor,
)
from tests.bench.bench_agent import ALLOCATE_CAPACITY, TREE, _called, _free_all, _recorded
from tests.bench.bench_agent_memory import _status_kib
from tests.bench.bench_agent_setup import quiet_logs
from tests.bench.bench_shared_scale import _profile
from tests.bench.grpc_idle_floor import idle_grpc_server
from tests.bench.stats import machine_speed_line, percentile
from tests.harness import dra as h
from tests.harness.agent_process import apply
from tests.harness.controller_process import install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

RUNS: Final = 3
SIZES: Final = (200,)
SAMPLES: Final = 5
CALLS: Final = 400
IDLE_S: Final = 20.0
#: Quiet time after the rest Configuration is schedulable, before the idle window (sampling).
SETTLE_S: Final = 5.0
RPC_TIMEOUT_S: Final = 10.0

#: The DRA calls, from a process of its own (as the kubelet's): the plugin watcher's GetInfo
#: and NotifyRegistrationStatus, then per call the floor (GetInfo, an empty unary call), a
#: timed NodePrepareResources and an untimed NodeUnprepareResources (so each prepare is a
#: fresh one). argv: service socket, registration socket, count, namespace, name, uid.
DRA_CALLER: Final = """
import asyncio, json, sys, time
import grpc.aio
from agent.kubeletapi import dra_v1_pb2 as pb, dra_v1_pb2_grpc as pb_grpc
from agent.kubeletapi import pluginregistration_v1_pb2 as reg
from agent.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
service, registry, count, ns, name, uid = sys.argv[1:]
T = TIMEOUT
async def main():
    claims = [pb.Claim(namespace=ns, name=name, uid=uid)]
    async with grpc.aio.insecure_channel("unix:" + registry) as r, \\
               grpc.aio.insecure_channel("unix:" + service) as s:
        info, dra = reg_grpc.RegistrationStub(r), pb_grpc.DRAPluginStub(s)
        await info.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
        floor, prepare, errors = [], [], []
        for i in range(WARMUP + int(count)):
            started = time.perf_counter()
            await info.GetInfo(reg.InfoRequest(), timeout=T)
            between = time.perf_counter()
            out = await dra.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims),
                                                 timeout=T)
            done = time.perf_counter()
            await dra.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims),
                                             timeout=T)
            if out.claims[uid].error:
                errors.append(out.claims[uid].error)
            if i >= WARMUP:
                floor.append(between - started)
                prepare.append(done - between)
        print(json.dumps({"floor": floor, "call": prepare, "errors": errors[:3]}))
asyncio.run(main())
"""
WARMUP: Final = 20

Figures = dict[str, float]


async def _rest(an: AllocatorNode, idle_s: float) -> Figures:
    """1. The agent at rest with 2 local devices: idle CPU beside a bare gRPC server's, RSS."""
    names = ["r0", "r1"]
    apply(an.node.plane, an.ns, an.configuration("rest", names, shared=False))
    await an.until_schedulable("rest", 2)
    await asyncio.sleep(SETTLE_S)  # start-up writes end: sampling, not a wait
    async with idle_grpc_server() as floor_pid:
        await asyncio.sleep(1.0)  # the floor's own start-up done: sampling, not a wait
        before, floor_before = thread_cpu_ns(an.node.pid), thread_cpu_ns(floor_pid)
        started = time.monotonic()
        await asyncio.sleep(idle_s)  # the reading itself
        per_min = 60.0 / (time.monotonic() - started)
        used = cpu_seconds_between(before, thread_cpu_ns(an.node.pid)) * per_min
        floor = cpu_seconds_between(floor_before, thread_cpu_ns(floor_pid)) * per_min
    memory = _status_kib(an.node.pid)
    return {"idle_cpu": used, "idle_floor": floor, "rss": memory["VmRSS"] / 1024,
            "rss_anon": memory["RssAnon"] / 1024, "threads": memory["Threads"],
            "plugins": len(an.node.resources())}


async def _prepare(an: AllocatorNode, calls: int) -> Figures:
    """3, dra: NodePrepareResources of one allocated claim, ``calls`` times."""
    apply(an.node.plane, an.ns, an.configuration("prep", ["p0"], shared=False))
    await an.until_schedulable("prep", 1)
    h.apply(an.node.plane, an.ns, h.claim_template("prep", dra.device_class_name(an.ns, "prep")),
            h.claim_pod("prep-user", "prep"))
    claim = await h.allocated_claim(an.node.client, an.ns, "prep-user")
    service = an.dra_dir / "plugins" / dra.DRIVER / SERVICE_SOCKET
    program = DRA_CALLER.replace("WARMUP", str(WARMUP)).replace("TIMEOUT", str(RPC_TIMEOUT_S))
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, str(service),
        str(registration_socket(an.dra_dir / "registry")), str(calls), claim.namespace,
        claim.name, claim.uid, stdout=asyncio.subprocess.PIPE, cwd=TREE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the DRA caller failed (exit {child.returncode})")
    result = json.loads(out)
    if result["errors"]:
        raise RuntimeError(f"NodePrepareResources failed: {result['errors']}")
    return _percentiles(result["call"], result["floor"])


async def _allocate(an: AllocatorNode, calls: int) -> Figures:
    """3, devicePlugin: Allocate of a distinct free slot each call (a shared device of
    ``ALLOCATE_CAPACITY`` slots, freed between rounds), ``calls`` times; the floor from the
    same socket."""
    apply(an.node.plane, an.ns, an.configuration("alloc", ["a0"], shared=True,
                                                 capacity=ALLOCATE_CAPACITY))
    name = instance_name("alloc", "a0", shared=True, node=an.node.name)
    resource = instance_resource_name(name)
    state = an.node.state
    await state.until(lambda: state.allocatable.get(resource) == str(ALLOCATE_CAPACITY),
                      what=f"{resource}={ALLOCATE_CAPACITY} allocatable")
    socket = an.node.plugin_dir / socket_name(resource)
    floor = await _called(socket, calls, [])
    fresh: list[float] = []
    while len(fresh) < calls:
        await _free_all(an.node, name)  # untimed: one merge patch frees every slot
        slots = [slot_id(name, i) for i in range(min(ALLOCATE_CAPACITY, calls - len(fresh)))]
        fresh += await _called(socket, len(slots), slots)
        await state.until(lambda s=slots: _recorded(an.node, name, s),  # type: ignore[misc]
                          what=f"{len(slots)} slots recorded", deadline=60.0)
    # No pod holds the slots answered last: gone with their Instance, or the agent's orphan
    # freer would free them one write each while part 4 is timed.
    an.node.plane.kubectl("delete", "configuration", "alloc", "-n", an.ns)
    await state.until(lambda: state.allocatable.get(resource, "0") == "0",
                      what=f"{resource} gone", deadline=60.0)
    return _percentiles(fresh, floor)


def _percentiles(call: list[float], floor: list[float]) -> Figures:
    return {"call_p50": percentile(call, 0.5), "call_p99": percentile(call, 0.99),
            "floor_p50": percentile(floor, 0.5), "floor_p99": percentile(floor, 0.99)}


@contextlib.contextmanager
def _profiled(directory: Path | None, label: str, **pids: int) -> Iterator[None]:
    """py-spy records each of ``pids`` over the block (``--profile``), to
    ``DIRECTORY/<name>-<label>.txt``."""
    spies = [_profile(pid, directory / f"{name}-{label}.txt") for name, pid in pids.items()
             ] if directory else []
    try:
        yield
    finally:
        for spy in spies:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its record then
                spy.wait(60)


async def _one(plane: ControlPlane, allocator: str, args: argparse.Namespace, run: int,
               log_dir: Path) -> Figures:
    figures: Figures = {}
    async with allocator_node(plane, allocator, log_dir) as an:
        figures |= await _rest(an, args.idle)
        for shared in (False, True):
            kind = "shared" if shared else "local"
            published, bound, floor = await appear(an, shared=shared, samples=args.samples)
            figures |= {f"appear_{kind}": statistics.median(published),
                        f"bound_{kind}": statistics.median(bound),
                        f"floor_{kind}": statistics.median(floor)}
        call = _prepare if allocator == "dra" else _allocate
        with _profiled(args.profile, f"{allocator}-{run}-calls", agent=an.node.pid):
            figures |= await call(an, args.calls)
        for size in args.sizes:
            for shared in (False, True):
                kind = "shared" if shared else "local"
                figures[f"n{size}_{kind}_floor"] = await writes_floor(an, size, f"{kind}{run}")
                with _profiled(args.profile, f"{allocator}-{run}-{size}{kind}",
                               agent=an.node.pid, controller=an.controller_pid):
                    figures[f"n{size}_{kind}"] = await many(an, size, shared=shared, run=run)
    print(f"  run {run} {allocator}: " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()),
          flush=True)
    return figures


def _report(results: dict[str, list[Figures]], args: argparse.Namespace) -> None:
    rows: list[tuple[str, str, float]] = [
        ("agent idle CPU, s per min", "idle_cpu", 1.0),
        ("  floor: a bare idle gRPC server, s per min", "idle_floor", 1.0),
        ("agent VmRSS, MiB", "rss", 1.0), ("  of which RssAnon, MiB", "rss_anon", 1.0),
        ("agent threads", "threads", 1.0),
        ("device plugins registered with the kubelet", "plugins", 1.0)]
    for kind in ("local", "shared"):
        rows += [(f"{kind} device online → schedulable, ms", f"appear_{kind}", 1e3),
                 (f"{kind} device online → waiting pod bound, ms", f"bound_{kind}", 1e3),
                 ("  floor: plain pod created → bound, ms", f"floor_{kind}", 1e3)]
    rows += [("Prepare (dra) / Allocate (devicePlugin) p50, ms", "call_p50", 1e3),
             ("Prepare / Allocate p99, ms", "call_p99", 1e3),
             ("  floor: empty unary gRPC call p50, ms", "floor_p50", 1e3),
             ("  floor: empty unary gRPC call p99, ms", "floor_p99", 1e3)]
    for size in args.sizes:
        for kind in ("local", "shared"):
            rows += [(f"{size} {kind} devices: applied → all schedulable, s", f"n{size}_{kind}",
                      1.0),
                     (f"  floor: {size} ConfigMaps created, s", f"n{size}_{kind}_floor", 1.0)]
    print(f"  medians of {args.runs} runs ({args.samples} devices appearing per kind and run, "
          f"{args.calls} calls, idle window {args.idle:.0f} s)")
    print(f"  {'figure':<52} {'dra':>10} {'devicePlugin':>13}")
    for label, key, scale in rows:
        cells = []
        for allocator in ALLOCATORS:
            values = [r[key] for r in results[allocator] if key in r]
            cells.append(f"{statistics.median(values) * scale:.3g}" if values else "—")
        print(f"  {label:<52} {cells[0]:>10} {cells[1]:>13}")


async def _bench(args: argparse.Namespace, log_dir: Path) -> dict[str, list[Figures]]:
    results: dict[str, list[Figures]] = {a: [] for a in ALLOCATORS}
    with ControlPlane() as plane:
        install_peering_crds(plane)
        for run in range(1, args.runs + 1):
            for allocator in ALLOCATORS:  # interleaved: a slow spell of the machine hits both
                results[allocator].append(await _one(plane, allocator, args, run, log_dir))
    return results


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench allocators")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=list(SIZES), help="N local and N shared devices, comma-separated "
                        "(empty: skip part 4)")
    parser.add_argument("--samples", type=int, default=SAMPLES,
                        help="devices appearing per kind and run")
    parser.add_argument("--calls", type=int, default=CALLS, help="Prepare / Allocate calls")
    parser.add_argument("--idle", type=float, default=IDLE_S, help="idle window, seconds")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a directory for py-spy's records of the agent and controller in "
                        "parts 3 and 4 (a run of its own: the profiler slows what it records)")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    quiet_logs()
    print(machine_speed_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-alloc-") as tmp:
        results = asyncio.run(_bench(args, Path(tmp)))
    _report(results, args)
    print(machine_speed_line())


if __name__ == "__main__":
    main(sys.argv[1:])
