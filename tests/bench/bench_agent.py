"""The agent's speed: device → Instance → allocatable, kubelet restart, Allocate round trip.

The agent's targets (≤ 0.5 s median to allocatable, ≤ 1 s re-registration,
Allocate p99 ≤ 5 ms, ≤ 79 MiB resident) are met in benchmarks, never in pass/fail tests. This
module runs all of them against a real control plane, the node emulator (in this process) as the
kubelet and the agent as ``python -m agent.main`` (its own process, as on a node), prints
median/p95/p99/min/max/n, and then runs ``bench_agent_memory``. Nothing here asserts a timing.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import grpc.aio
from lightkube.types import PatchType

from agent.deviceplugins.slots.service import socket_name
from agent.kube.client import InstanceResource
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.bench import bench_agent_memory
from tests.bench.bench_agent_setup import BenchNode, agent_tree, bench_node, quiet_logs
from tests.bench.stats import percentile, summary
from tests.harness.agent_process import api_client, apply, debug_echo_configuration
from tests.harness.controlplane import ControlPlane

APPEAR_RUNS = 20
#: Runs that bring the device back while its old plugins may still be stopping.
FLAP_RUNS = 10
RESTART_RUNS = 10
ALLOCATE_CALLS = 1000
WARMUP_CALLS = 50
#: Slots of the Instance the fresh-slot Allocate runs use (freed all at once between rounds).
ALLOCATE_CAPACITY = 200
#: How long the slots answered in one round may take to show up recorded in ``deviceUsage``.
RECORD_DEADLINE_S = 60.0
#: Extra always-online devices, so a kubelet restart re-registers a realistic number of plugins.
EXTRA_DEVICES = 10
RPC_TIMEOUT_S = 10.0
#: How long the emulator's own ``wait_for`` may take for plugins to stream again.
STREAM_DEADLINE_S = 30.0
#: Field manager of the publish floor's bare client.
FLOOR_MANAGER = "edgeplug-bench-floor"


def _write(path: Path, text: str) -> None:
    """Rewrite debugEcho's availability file (it lists the descriptions now offline)."""
    path.write_text(text, encoding="utf-8")


def _plugins_gone(node: BenchNode, resources: list[str]) -> bool:
    # The emulated kubelet drops an endpoint when the plugin ends its ListAndWatch stream, i.e.
    # when the plugin's gRPC server finished stopping. (Its socket file goes sooner: gRPC
    # unlinks it when shutdown begins.) NodeEmulator has no public accessor for this.
    return all(node.emulator._devices.endpoint(r) is None for r in resources)


async def _appear_once(node: BenchNode, availability: Path, *, run: int,
                       settle: bool) -> tuple[float, float]:
    """Take foo0 offline and back; (online → Instance ADDED, online → allocatable) seconds."""
    name = instance_name("echo", "foo0", shared=True, node=node.name)
    resource = instance_resource_name(name)
    state = node.state
    _write(availability, "foo0\n")
    await state.until(lambda: name not in state.instances,
                      what=f"run {run}: Instance {name} deleted after foo0 went offline")
    await state.until(lambda: state.allocatable.get(resource, "0") == "0",
                      what=f"run {run}: {resource} no longer allocatable")
    if settle:  # both plugins (Instance and configuration level) fully stopped
        plugins = [resource, "edgeplug.io/echo"]
        await node.emulator.wait_for(partial(_plugins_gone, node, plugins),
                                     timeout=STREAM_DEADLINE_S,
                                     what=f"run {run}: plugins {plugins} stopped")
    started = time.monotonic()
    _write(availability, "")
    seen = asyncio.create_task(state.until(lambda: name in state.instances,
                                           what=f"run {run}: Instance {name} back"))
    allocatable = await state.until(lambda: state.allocatable.get(resource) == "1",
                                    what=f"run {run}: {resource}=1 allocatable again")
    exists = await seen
    return exists - started, allocatable - started


def _absent(node: BenchNode, name: str) -> bool:
    return name not in node.state.instances


async def publish_floor(node: BenchNode, name: str, runs: int) -> list[float]:
    """The floor of "device online → Instance exists": one server-side apply of the body the
    agent applies for ``name`` (same spec, owner and size; another name, and a node that does
    not exist so the agent leaves it alone) by a bare lightkube client, until the same watch
    sees it. Each run deletes it afterwards (untimed)."""
    agent_made = node.state.instances[name]
    spec = {k: v for k, v in agent_made["spec"].items() if k != "deviceUsage"}
    client = api_client(node.plane)
    samples: list[float] = []
    try:
        for run in range(runs + 1):  # the first one (untimed) connects the client
            floor_name = f"{name}-floor{run}"
            body = {
                "apiVersion": agent_made["apiVersion"], "kind": agent_made["kind"],
                "metadata": {"name": floor_name, "namespace": node.namespace,
                             "ownerReferences": agent_made["metadata"]["ownerReferences"]},
                "spec": {**spec, "nodes": [f"{node.name}-floor"]},
            }
            started = time.monotonic()
            await client.patch(InstanceResource, floor_name, body, namespace=node.namespace,
                               patch_type=PatchType.APPLY, field_manager=FLOOR_MANAGER,
                               force=True)
            seen = await node.state.until(partial(operator.contains, node.state.instances,
                                                  floor_name),
                                          what=f"floor run {run}: Instance {floor_name}")
            if run:
                samples.append(seen - started)
            await client.delete(InstanceResource, floor_name, namespace=node.namespace)
            await node.state.until(partial(_absent, node, floor_name),
                                   what=f"floor run {run}: Instance {floor_name} deleted")
    finally:
        await client.close()
    return samples


async def bench_appear(node: BenchNode, availability: Path) -> None:
    """1. availability file rewritten → Instance ADDED (watch) → allocatable on the Node, and
    beside it the floor (``publish_floor``) and the ratio of the medians.

    Settled runs bring the device back once its plugins finished stopping; flapping runs as
    soon as the Instance is gone and the Node shows 0 (teardown may still be in progress)."""
    name = instance_name("echo", "foo0", shared=True, node=node.name)
    resource = instance_resource_name(name)
    await node.state.until(lambda: node.state.allocatable.get(resource) == "1",
                           what=f"{resource}=1 allocatable before the first run")
    floor = await publish_floor(node, name, APPEAR_RUNS)
    print(summary("  floor: bare client's server-side apply of the same body → Instance "
                  "exists (watch)", floor))
    for settle, runs in ((True, APPEAR_RUNS), (False, FLAP_RUNS)):
        to_instance, to_allocatable = [], []
        for run in range(runs):
            instance, allocatable = await _appear_once(node, availability, run=run,
                                                       settle=settle)
            to_instance.append(instance)
            to_allocatable.append(allocatable)
        between = [a - i for i, a in zip(to_instance, to_allocatable, strict=True)]
        kind = "settled" if settle else "flapping"
        print(f"  {kind}:")
        print(summary("    device online → Instance exists (watch)", to_instance))
        print(f"    ratio Instance exists / floor: median "
              f"{percentile(to_instance, 0.5) / percentile(floor, 0.5):.1f}x")
        print(summary("    Instance exists → allocatable on Node (watch)", between))
        print(summary("    device online → allocatable on Node [target median ≤ 500 ms]",
                      to_allocatable))


def _all_registered_since(node: BenchNode, index: int, resources: set[str]) -> bool:
    return {r.resource_name for r in node.emulator.registrations[index:]} >= resources


async def bench_restart(node: BenchNode) -> None:
    """2. emulated kubelet restart → every plugin re-registered (the emulator's records)."""
    resources = node.resources()
    from_served, from_restart, to_streaming = [], [], []
    for run in range(RESTART_RUNS):
        before = len(node.emulator.registrations)
        begun = datetime.now(UTC)
        await node.emulator.restart_kubelet()
        served = datetime.now(UTC)  # a fresh kubelet.sock is listening from here
        await node.emulator.wait_for(
            partial(_all_registered_since, node, before, resources),
            timeout=STREAM_DEADLINE_S, what=f"run {run}: all {len(resources)} plugins back",
        )
        last = max(r.time for r in node.emulator.registrations[before:])
        from_served.append((last - served).total_seconds())
        from_restart.append((last - begun).total_seconds())
        await node.emulator.wait_for(
            lambda: all(node.emulator.healthy_device_ids(r) for r in resources),
            timeout=STREAM_DEADLINE_S, what=f"run {run}: every plugin streaming devices",
        )
        to_streaming.append((datetime.now(UTC) - served).total_seconds())
    print(f"  {len(resources)} plugins per restart")
    print(summary("  new kubelet.sock → last plugin registered [target median ≤ 1000 ms]",
                  from_served))
    print(summary("  restart begun (old sockets torn down) → last registered", from_restart))
    print(summary("  new kubelet.sock → all streaming devices (50 ms poll)", to_streaming))


#: The timed gRPC calls run in a process of their own, as the kubelet's do: in this process
#: they would share the event loop with the emulated kubelet and the benchmark's own watches,
#: whose work on every Instance event would show up in the agent's tail. argv: socket, count,
#: then the slot ids to allocate in turn (none: GetDevicePluginOptions). Prints the seconds.
CALLER = """
import asyncio, json, sys, time
import grpc.aio
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
socket, count, slots = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
async def main():
    async with grpc.aio.insecure_channel("unix:" + socket) as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        for _ in range(WARMUP):  # the channel connected and warm (untimed)
            await stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT)
        samples = []
        for i in range(count):
            if slots:
                ids = [slots[i % len(slots)]]
                request = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
                started = time.perf_counter()
                await stub.Allocate(request, timeout=TIMEOUT)
            else:
                started = time.perf_counter()
                await stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT)
            samples.append(time.perf_counter() - started)
        print(json.dumps(samples))
asyncio.run(main())
"""
#: Untimed calls each caller process makes first.
CALLER_WARMUP = 20
#: The caller runs from the tree this benchmark is in (it imports the kubelet API stubs).
TREE = Path(__file__).resolve().parents[2]


async def _called(socket: Path, count: int, slots: list[str]) -> list[float]:
    """``count`` calls timed in a caller process of their own (``CALLER``)."""
    program = CALLER.replace("WARMUP", str(CALLER_WARMUP)).replace("TIMEOUT", str(RPC_TIMEOUT_S))
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, str(socket), str(count), *slots,
        stdout=asyncio.subprocess.PIPE, cwd=TREE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the caller process failed (exit {child.returncode})")
    samples: list[float] = json.loads(out)
    return samples


async def _timed(call: object, count: int) -> list[float]:
    assert callable(call)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def _free_all(node: BenchNode, name: str) -> None:
    usage = {slot_id(name, i): "" for i in range(ALLOCATE_CAPACITY)}
    await node.client.patch(InstanceResource, name, {"spec": {"deviceUsage": usage}},
                            namespace=node.namespace, patch_type=PatchType.MERGE)
    await node.state.until(
        lambda: not any((node.state.instances.get(name, {}).get("spec", {})
                         .get("deviceUsage") or {}).values()),
        what=f"every slot of {name} free again", deadline=RECORD_DEADLINE_S)


def _recorded(node: BenchNode, name: str, slots: list[str]) -> bool:
    usage = node.state.instances.get(name, {}).get("spec", {}).get("deviceUsage") or {}
    return all(usage.get(slot) == node.name for slot in slots)


async def bench_allocate(node: BenchNode, *, configuration: str, fast: bool) -> None:
    """3. Allocate over the plugin's Unix socket, next to GetDevicePluginOptions (the floor).

    ``fast``: the agent has pod-resources, so a slot free and reserved for it (or held) is
    answered at once and recorded right after; else each fresh slot is one conditioned write
    before the answer. Each round of fresh slots waits until all are recorded (untimed, but
    the time from the round's last answer to its last slot recorded is reported)."""
    apply(node.plane, node.namespace, debug_echo_configuration(
        configuration, descriptions=["a0"], capacity=ALLOCATE_CAPACITY))
    name = instance_name(configuration, "a0", shared=True, node=node.name)
    resource = instance_resource_name(name)
    await node.state.until(lambda: node.state.allocatable.get(resource) == str(ALLOCATE_CAPACITY),
                           what=f"{resource}={ALLOCATE_CAPACITY} allocatable")
    socket = node.plugin_dir / socket_name(resource)
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)

        def allocate(slot: str) -> object:
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[slot])])
            return lambda: stub.Allocate(request, timeout=RPC_TIMEOUT_S)

        def options() -> object:
            return stub.GetDevicePluginOptions(pb.Empty(), timeout=RPC_TIMEOUT_S)

        await _timed(options, WARMUP_CALLS)
        floor = await _called(socket, ALLOCATE_CALLS, [])
        held_slot = slot_id(name, 0)
        await _timed(allocate(held_slot), WARMUP_CALLS)
        await node.state.until(lambda: _recorded(node, name, [held_slot]),
                               what=f"{held_slot} recorded", deadline=RECORD_DEADLINE_S)
        held = await _called(socket, ALLOCATE_CALLS, [held_slot])
        fresh: list[float] = []
        to_recorded: list[float] = []
        while len(fresh) < ALLOCATE_CALLS:
            await _free_all(node, name)  # untimed: one merge patch frees every slot
            count = min(ALLOCATE_CAPACITY, ALLOCATE_CALLS - len(fresh))
            slots = [slot_id(name, index) for index in range(count)]
            fresh += await _called(socket, count, slots)
            answered = time.monotonic()
            recorded = await node.state.until(partial(_recorded, node, name, slots),
                                              what=f"{count} slots recorded",
                                              deadline=RECORD_DEADLINE_S)
            to_recorded.append(recorded - answered)
        await _free_all(node, name)
    how = ("answered from the reservation, recorded after" if fast
           else "1 conditioned write before the answer")
    held_how = ("answered at once, confirmed by 1 GET after" if fast
                else "confirmed by 1 GET before the answer")
    print("  (timed calls from a caller process of their own, as the kubelet's are)")
    print(summary("  GetDevicePluginOptions (gRPC unary floor, same socket)", floor))
    print(summary(f"  Allocate, slot already held by this node ({held_how}) "
                  "[target p99 ≤ 5 ms]", held))
    print(summary(f"  Allocate, distinct free slot each call, capacity {ALLOCATE_CAPACITY} "
                  f"({how}) [target p50 ≤ 10 ms{', p99 ≤ 5 ms' if fast else ''}]", fresh))
    print(summary(f"  last answer of a round of {ALLOCATE_CAPACITY} → all recorded (watch)",
                  to_recorded))
    for label, samples in (("held", held), ("fresh", fresh)):
        p50 = percentile(samples, 0.5) / percentile(floor, 0.5)
        p99 = percentile(samples, 0.99) / percentile(floor, 0.99)
        print(f"  ratio Allocate({label}) / floor: p50 {p50:.1f}x, p99 {p99:.1f}x")


async def _latency(plane: ControlPlane, tree: Path | None) -> None:
    async with bench_node(plane, label="lat", pod_resources=True, agent_source=tree) as node:
        availability = node.plugin_dir / "echo-offline"
        extra = [f"dev{i}" for i in range(EXTRA_DEVICES)]
        apply(plane, node.namespace,
              debug_echo_configuration("echo", descriptions=["foo0"], grace=0,
                                       availability_file=availability),
              debug_echo_configuration("many", descriptions=extra))
        expected = EXTRA_DEVICES + 1 + 2  # Instance plugins + two configuration-level plugins
        await node.emulator.wait_for(lambda: len(node.resources()) >= expected,
                                     timeout=STREAM_DEADLINE_S,
                                     what=f"{expected} plugins registered")
        print(f"1. device appears → Instance → allocatable (n={APPEAR_RUNS})", flush=True)
        await bench_appear(node, availability)
        print(f"2. kubelet restart → re-registered (n={RESTART_RUNS})", flush=True)
        await bench_restart(node)
        print(f"3. Allocate round trip (n={ALLOCATE_CALLS} each), fast path (pod-resources on)",
              flush=True)
        await bench_allocate(node, configuration="alloc", fast=True)
    async with bench_node(plane, label="cnd", agent_source=tree) as node:
        print(f"3b. Allocate round trip (n={ALLOCATE_CALLS} each), conditioned writes "
              "(no pod-resources: fast path off)", flush=True)
        await bench_allocate(node, configuration="cond", fast=False)


def main(argv: list[str]) -> None:
    """All agent benchmarks; ``--no-memory`` skips part 4, ``--tracemalloc`` adds a traced run,
    ``--agent-tree DIR`` runs parts 1-3 on the agent of another checkout (a ``git worktree`` of
    the commit to compare; part 4 measures this one's)."""
    tree = agent_tree(argv[argv.index("--agent-tree") + 1]) if "--agent-tree" in argv else None
    quiet_logs()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (1, 5, 15 min) at start", flush=True)
    with ControlPlane() as plane:
        plane.apply_crds()
        if tree is not None:
            print(f"agent of {tree}", flush=True)
        asyncio.run(_latency(plane, tree))
        if "--no-memory" not in argv:
            bench_agent_memory.run(plane, trace="--tracemalloc" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])
