"""``python -m tests.bench write_cost``: the API server's CPU for each way of writing the objects
the controller keeps for shared devices (a ResourceSlice, a per-Instance DeviceClass).

At a thousand shared devices the API server's CPU sets the pace of publishing, and the
controller writes every slice and class by server-side apply; whether a plain create (new
object) or update (rewrite) costs less decides whether changing the verbs is worth their rights.
On a real API server, per round (alternated order) and kind, ``COUNT`` objects written
``IN_FLIGHT`` at once: created by apply and by create, rewritten by apply and by update (PUT,
without a resourceVersion), deleted; the API server's thread CPU over each batch, per object.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
from collections.abc import Awaitable, Callable
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.types import PatchType

from controller.dra.instance_classes import DeviceClassResource
from crds import dra, dra_slices
from crds.instance import Instance
from crds.resources import ResourceSliceResource
from tests.bench.stats import machine_speed_line
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

COUNT: Final = 500
ROUNDS: Final = 3
IN_FLIGHT: Final = 16
FIELD_MANAGER: Final = "bench-write-cost"

_Call = Callable[[], Awaitable[Any]]


def _slice(ns: str, i: int) -> dict[str, Any]:
    instance = Instance.from_object({
        "metadata": {"name": f"cam-{i:06x}", "namespace": ns},
        "spec": {"configurationName": "cam", "shared": True, "nodes": ["n1"], "capacity": 2,
                 "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": f"d{i}"}},
        "status": {"reported": {"n1": True}}})
    plan = dra_slices.shared_plan(instance)
    assert plan is not None
    return dra_slices.slice_bodies(plan, generation=1,
                                   publisher=dra_slices.CONTROLLER_PUBLISHER)[0]


def _class(ns: str, i: int) -> dict[str, Any]:
    return dra.instance_class(ns, "cam", f"cam-{i:06x}",
                              extended_resource=f"{dra.DRIVER}/cam-{i:06x}")


async def _cost(api: int, calls: list[_Call]) -> float:
    """The API server's CPU per call, ``IN_FLIGHT`` at once."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: _Call) -> None:
        async with gate:
            await call()

    before = thread_cpu_ns(api)
    await asyncio.gather(*(one(c) for c in calls))
    return cpu_seconds_between(before, thread_cpu_ns(api)) / len(calls)


async def _round(client: AsyncClient, api: int, ns: str, resource: Any,
                 bodies: list[dict[str, Any]], found: dict[str, list[float]], kind: str,
                 apply_first: bool) -> None:
    def apply(body: dict[str, Any]) -> _Call:
        return lambda: client.patch(resource, body["metadata"]["name"], body,
                                    patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER,
                                    force=True)

    def create(body: dict[str, Any]) -> _Call:
        return lambda: client.create(resource.from_dict(body), field_manager=FIELD_MANAGER)

    def update(body: dict[str, Any]) -> _Call:
        return lambda: client.replace(resource.from_dict(body), field_manager=FIELD_MANAGER)

    def delete(body: dict[str, Any]) -> _Call:
        return lambda: client.delete(resource, body["metadata"]["name"])

    rewritten = copy.deepcopy(bodies)
    for body in rewritten:
        if kind == "slice":
            body["spec"]["pool"]["generation"] = 2
        else:
            body["metadata"]["labels"]["bench"] = "rewritten"
    order = [("apply", apply), ("create", create)]
    for verb, write in order if apply_first else order[::-1]:
        found[f"{kind} {verb} (new)"].append(await _cost(api, [write(b) for b in bodies]))
        rewrite = apply if verb == "apply" else update
        name = "apply" if verb == "apply" else "update"
        found[f"{kind} {name} (rewrite)"].append(
            await _cost(api, [rewrite(b) for b in rewritten]))
        found[f"{kind} delete"].append(await _cost(api, [delete(b) for b in bodies]))


async def _bench(count: int, rounds: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {
        f"{kind} {what}": [] for kind in ("slice", "class")
        for what in ("apply (new)", "create (new)", "apply (rewrite)", "update (rewrite)",
                     "delete")}
    with ControlPlane() as plane:
        client = harness.api_client(plane)
        api = plane.pids()["kube-apiserver"]
        for index in range(rounds):
            ns = f"cost{index}"
            await _round(client, api, ns, ResourceSliceResource,
                         [_slice(ns, i) for i in range(count)], found, "slice", index % 2 == 0)
            await _round(client, api, ns, DeviceClassResource,
                         [_class(ns, i) for i in range(count)], found, "class", index % 2 == 0)
    return found


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench write_cost")
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    print(machine_speed_line(), flush=True)
    found = asyncio.run(_bench(args.count, args.rounds))
    print(f"  the API server's CPU per object, {args.count} objects {IN_FLIGHT} at once, "
          f"median (min-max) of {args.rounds} rounds")
    for what, costs in found.items():
        print(f"  {what:28} {statistics.median(costs) * 1000:5.2f} ms "
              f"({min(costs) * 1000:.2f}-{max(costs) * 1000:.2f})", flush=True)
    print(machine_speed_line(), flush=True)
