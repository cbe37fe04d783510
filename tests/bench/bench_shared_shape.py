"""``python -m tests.bench shared_shape``: what the shape of shared devices' slices costs.

The shapes to choose between by figures: a pool and a slice per shared device, or fewer, larger
objects (shared devices of the same node set in pools of up to 128 devices, one slice each). No
agent or controller runs: a bare client writes the slices as the controller would
(``crds.dra_slices`` bodies, 16 calls in flight, each rewrite of a pool one generation up) on a
real control plane (API server, scheduler, controller-manager) with one Ready Node. Per N, run
and shape:

The pooled shapes: devices in pools of up to 128 (one slice each, one node selector for the
slice), or of up to 64 with a node selector per device (``perDeviceNodeSelection``, so a device
can stay in its pool when its nodes change).

- ramp: the devices arrive ``BATCH`` at a time (each batch as one pass of the controller
  writes it: per device, one slice per new device; pooled, the pool the batch lands in
  rewritten with every device it holds), wall time and API server CPU;
- change: one device's health changes, ``CHANGES`` times (per device one small slice, pooled
  the whole slice of its pool), API server CPU per change;
- per-Instance classes (per-device runs): the API server's CPU for a DeviceClass per device
  (``edgeplug.io/<instance>``, applied 16 at once), the cost the alternative of making them only
  where a pod asks for one would save;
- bind: a pod asking ``edgeplug.io/<configuration>: 1`` (a DeviceClass maps it) created → bound,
  beside a plain pod (the floor), interleaved, ``PODS`` of each; the scheduler's CPU per pod.

Then the slices and pods are deleted. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from controller.dra.instance_classes import DeviceClassResource, as_dict
from crds import dra, dra_slices
from crds.instance import Instance
from crds.resources import ResourceSliceResource
from tests.bench.stats import machine_speed_line
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

SIZES: Final = (200, 1000)
RUNS: Final = 3
SHAPES: Final = ("per-device", "pooled", "pooled, nodes per device")
#: Devices per pool of the pooled shape with a node selector per device
#: (``perDeviceNodeSelection``): the API's limit for slices using the advanced features.
PER_DEVICE_NODES_POOL: Final = dra_slices.MAX_DEVICES_WITH_TAINTS
#: Devices a pass of the controller takes at once while they arrive.
BATCH: Final = 10
CHANGES: Final = 50
PODS: Final = 10
CAPACITY: Final = 2
IN_FLIGHT: Final = 16
FIELD_MANAGER: Final = "bench-shared-shape"
BIND_DEADLINE_S: Final = 60.0
POLL_S: Final = 0.005


@dataclass
class Figures:
    shape: str
    size: int
    ramp_s: float
    ramp_api_cpu: float
    ramp_writes: int
    change_api_cpu: float  # per change
    binds: list[float]
    floor: list[float]
    scheduler_cpu: float  # per DRA pod bound
    slice_bytes: int
    class_api_cpu: float = 0.0  # per per-Instance DeviceClass applied (per-device runs)


def _instance(ns: str, cfg: str, i: int, node: str, *, healthy: bool = True) -> Instance:
    status: dict[str, Any] = {"reported": {node: True}}
    if not healthy:
        status["unhealthy"] = {node: "no answer"}
    return Instance.from_object({
        "metadata": {"name": f"{cfg}-{i:06x}", "namespace": ns},
        "spec": {"configurationName": cfg, "shared": True, "nodes": [node],
                 "capacity": CAPACITY, "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": f"d{i}"}},
        "status": status})


class Writer:
    """The slices of one shape, written as the controller would write them."""

    def __init__(self, client: AsyncClient, shape: str, ns: str, cfg: str, node: str) -> None:
        self._client = client
        self.shape = shape
        self._ns, self._cfg, self._node = ns, cfg, node
        self._devices: dict[int, dict[str, Any]] = {}  # index → device body
        self._generations: dict[str, int] = {}
        self._gate = asyncio.Semaphore(IN_FLIGHT)
        self.writes = 0
        self.bytes = 0

    def _pool(self, i: int) -> str:
        if self.shape == "per-device":
            return dra_slices.shared_pool(self._ns, self._cfg, f"{self._cfg}-{i:06x}")
        per_pool = (dra_slices.MAX_DEVICES_PER_SLICE if self.shape == "pooled"
                    else PER_DEVICE_NODES_POOL)
        return f"{self._ns}/{self._cfg}/shared-nodes/{i // per_pool}"

    def _members(self, pool: str) -> list[int]:
        return sorted(i for i in self._devices if self._pool(i) == pool)

    async def _write(self, pool: str) -> None:
        plan = dra_slices.PoolPlan(name=pool, nodes=(self._node,),
                                   devices=tuple(self._devices[i] for i in self._members(pool)))
        generation = self._generations.get(pool, 0) + 1
        self._generations[pool] = generation
        for body in dra_slices.slice_bodies(plan, generation=generation,
                                            publisher=dra_slices.CONTROLLER_PUBLISHER):
            if self.shape == "pooled, nodes per device":
                # Each device its own selector: a device keeps its pool whatever its nodes.
                selector = body["spec"].pop("nodeSelector")
                body["spec"]["perDeviceNodeSelection"] = True
                for device in body["spec"]["devices"]:
                    device["nodeSelector"] = selector
            async with self._gate:
                stored = await self._client.patch(
                    ResourceSliceResource, body["metadata"]["name"], body,
                    patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
            if body["spec"].get("perDeviceNodeSelection") and not \
                    as_dict(stored)["spec"].get("perDeviceNodeSelection"):
                raise RuntimeError("the API server dropped perDeviceNodeSelection "
                                   "(DRAPartitionableDevices off)")
            self.writes += 1
            self.bytes = max(self.bytes, len(str(body)))

    def _put(self, i: int, *, healthy: bool = True) -> None:
        instance = _instance(self._ns, self._cfg, i, self._node, healthy=healthy)
        unhealthy = None if healthy else "no answer"
        self._devices[i], _ = dra_slices.device(instance, shared=True, unhealthy=unhealthy)

    async def arrive(self, indexes: range) -> None:
        """One pass: the devices ``indexes`` are new; every pool they land in is written."""
        for i in indexes:
            self._put(i)
        await asyncio.gather(*(self._write(p) for p in sorted({self._pool(i) for i in indexes})))

    async def change(self, i: int, *, healthy: bool) -> None:
        self._put(i, healthy=healthy)
        await self._write(self._pool(i))

    async def clear(self) -> None:
        mine: dict[str, Any] = {dra.LABEL_MANAGED_BY: dra_slices.CONTROLLER_MANAGED_BY}
        async for obj in self._client.list(ResourceSliceResource, labels=mine):
            with contextlib.suppress(ApiError):
                await self._client.delete(ResourceSliceResource,
                                          str(as_dict(obj)["metadata"]["name"]))


async def _bound(client: AsyncClient, ns: str, name: str) -> None:
    while True:
        pod = await client.get(Pod, name, namespace=ns)
        if pod.spec is not None and pod.spec.nodeName:
            return
        await asyncio.sleep(POLL_S)  # the measurement: the bind is polled for


async def _bind(client: AsyncClient, ns: str, name: str, resource: str | None) -> float:
    container: dict[str, Any] = {"name": "c", "image": "registry.example/none:1"}
    if resource:
        container["resources"] = {"limits": {resource: "1"}}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]}}
    started = time.monotonic()
    await client.create(cast(Pod, Pod.from_dict(body)))
    await asyncio.wait_for(_bound(client, ns, name), BIND_DEADLINE_S)
    return time.monotonic() - started


async def _api_cpu(pid: int, work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall time, the API server's CPU) of ``work``."""
    before, started = thread_cpu_ns(pid), time.monotonic()
    await work()
    return time.monotonic() - started, cpu_seconds_between(before, thread_cpu_ns(pid))


async def _one(client: AsyncClient, plane: ControlPlane, ns: str, node: str, shape: str,
               size: int, run: int) -> Figures:
    cfg = f"{shape[0]}{len(shape)}n{size}r{run}"
    pids = plane.pids()
    api, scheduler = pids["kube-apiserver"], pids["kube-scheduler"]
    cls = dra.device_class(ns, cfg, extended_resource=f"{dra.DRIVER}/{cfg}")
    await client.patch(DeviceClassResource, cls["metadata"]["name"], cls,
                       patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
    writer = Writer(client, shape, ns, cfg, node)

    async def ramp() -> None:
        for start in range(0, size, BATCH):
            await writer.arrive(range(start, min(start + BATCH, size)))

    ramp_s, ramp_cpu = await _api_cpu(api, ramp)
    ramp_writes = writer.writes

    async def changes() -> None:
        for k in range(CHANGES):
            await writer.change((k * 7919) % size, healthy=k % 2 == 1)

    _, change_cpu = await _api_cpu(api, changes)
    class_cpu = await _classes(client, api, ns, cfg, size) if shape == "per-device" else 0.0
    binds: list[float] = []
    floor: list[float] = []
    sched_before = thread_cpu_ns(scheduler)
    plain_cpu = 0.0
    for i in range(PODS):  # interleaved: a slow spell of the machine hits both
        before = thread_cpu_ns(scheduler)
        floor.append(await _bind(client, ns, f"{cfg}-plain-{i}", None))
        plain_cpu += cpu_seconds_between(before, thread_cpu_ns(scheduler))
        binds.append(await _bind(client, ns, f"{cfg}-dev-{i}", f"{dra.DRIVER}/{cfg}"))
    dra_cpu = cpu_seconds_between(sched_before, thread_cpu_ns(scheduler)) - plain_cpu
    for i in range(PODS):
        for pod in (f"{cfg}-plain-{i}", f"{cfg}-dev-{i}"):
            with contextlib.suppress(ApiError):
                await client.delete(Pod, pod, namespace=ns, grace_period=0)
    await writer.clear()
    with contextlib.suppress(ApiError):
        await client.delete(DeviceClassResource, cls["metadata"]["name"])
    return Figures(shape=shape, size=size, ramp_s=ramp_s, ramp_api_cpu=ramp_cpu,
                   ramp_writes=ramp_writes, change_api_cpu=change_cpu / CHANGES, binds=binds,
                   floor=floor, scheduler_cpu=dra_cpu / PODS, slice_bytes=writer.bytes,
                   class_api_cpu=class_cpu)


async def _classes(client: AsyncClient, api: int, ns: str, cfg: str, size: int) -> float:
    """The API server's CPU per per-Instance DeviceClass applied (then they are deleted)."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    bodies = [dra.instance_class(ns, cfg, f"{cfg}-{i:06x}",
                                 extended_resource=f"{dra.DRIVER}/{cfg}-{i:06x}")
              for i in range(size)]

    async def apply(body: dict[str, Any]) -> None:
        async with gate:
            await client.patch(DeviceClassResource, body["metadata"]["name"], body,
                               patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER,
                               force=True)

    async def delete(body: dict[str, Any]) -> None:
        async with gate:
            with contextlib.suppress(ApiError):
                await client.delete(DeviceClassResource, body["metadata"]["name"])

    async def applies() -> None:
        await asyncio.gather(*(apply(b) for b in bodies))

    _, cpu = await _api_cpu(api, applies)
    await asyncio.gather(*(delete(b) for b in bodies))
    return cpu / size


def _report(found: list[Figures]) -> None:
    print("| N | shape | ramp (writes) | API server CPU, ramp | API server CPU a change "
          "| pod → bound | floor | ratio | scheduler CPU a DRA pod | largest slice "
          "| API server CPU a per-Instance class |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sorted({f.size for f in found}):
        for shape in SHAPES:
            of = [f for f in found if f.size == size and f.shape == shape]
            if not of:
                continue

            def med(get: Callable[[Figures], float], runs: list[Figures] = of) -> float:
                return statistics.median(get(f) for f in runs)

            bind = statistics.median(b for f in of for b in f.binds)
            floor = statistics.median(b for f in of for b in f.floor)
            print(f"| {size:,} | {shape} | {med(lambda f: f.ramp_s):.1f} s "
                  f"({of[0].ramp_writes:,}) | {med(lambda f: f.ramp_api_cpu):.2f} s "
                  f"| {med(lambda f: f.change_api_cpu) * 1000:.1f} ms "
                  f"| {bind * 1000:.0f} ms | {floor * 1000:.0f} ms | {bind / floor:.1f}x "
                  f"| {med(lambda f: f.scheduler_cpu) * 1000:.1f} ms "
                  f"| {max(f.slice_bytes for f in of) / 1024:.0f} KiB "
                  f"| {med(lambda f: f.class_api_cpu) * 1000:.1f} ms |", flush=True)


async def _bench(args: argparse.Namespace) -> list[Figures]:
    found: list[Figures] = []
    with ControlPlane() as plane:
        client = harness.api_client(plane)
        ns = f"shape-{uuid.uuid4().hex[:6]}"
        plane.kubectl("create", "namespace", ns)
        node = f"shape-{uuid.uuid4().hex[:6]}"
        await wait_service_account(client, ns)
        async with h.ready_nodes(client, [node]):
            for size in args.sizes:
                for run in range(args.runs):
                    # Rotated, a different shape first each run: a slow spell hits each.
                    order = SHAPES[run % len(SHAPES):] + SHAPES[:run % len(SHAPES)]
                    for shape in order:
                        figures = await _one(client, plane, ns, node, shape, size, run)
                        found.append(figures)
                        print(f"  N={size} run {run + 1} {shape}: ramp {figures.ramp_s:.1f} s "
                              f"({figures.ramp_writes} writes, API server CPU "
                              f"{figures.ramp_api_cpu:.2f} s), a change "
                              f"{figures.change_api_cpu * 1000:.1f} ms of API server CPU, "
                              f"bind median {statistics.median(figures.binds) * 1000:.0f} ms "
                              f"(floor {statistics.median(figures.floor) * 1000:.0f} ms)",
                              flush=True)
    return found


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench shared_shape")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=list(SIZES))
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args(argv)
    print(machine_speed_line(), flush=True)
    _report(asyncio.run(_bench(args)))
    print(machine_speed_line(), flush=True)
