"""DRA's figures: Instance → ResourceSlice updated, 200 devices in slices, agent memory with
DRA on.

Timings are never pass/fail. Against the real control plane:

1. Instance → slice: a debugEcho device goes offline and comes back (its availability file),
   20 times; two watches in this process stamp the Instance's deletion/creation and the slice
   that follows, and the difference is printed (both watches ride the same API server, so
   their delivery delays cancel out).
2. 200 devices: one Configuration grows to 200 local devices (one pool, 128 + 72 per slice) and
   another has 200 shared devices (in its shared pools, the controller's ``DeviceClasses``
   in-process publishing them): time from the Configuration applied to every device in slices,
   the slices' size (JSON bytes), and the publisher's API writes.
3. Memory: ``python -m agent.main`` as the DaemonSet runs it, with 200 Instances and their
   plugins, DRA off and DRA on (slices and the kubelet plugin), VmRSS as ``bench_agent_memory``
   reads it.

The publisher runs in this process for parts 1 and 2 (with the agent's discovery side), as an
agent process would run it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from agent.dra import slices
from agent.dra.publisher import ResourceSliceResource
from agent.kube import watching
from agent.kube.client import InstanceResource, as_dict
from agent.settings import DraSettings
from controller.dra.device_classes import DeviceClasses
from crds.naming import instance_name
from tests.bench.bench_agent_memory import INSTANCES, TARGET_MIB, _read_memory, _ready
from tests.bench.bench_agent_setup import bench_node, daemonset_env, quiet_logs
from tests.bench.stats import summary
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane

FLIPS = 20
DEVICES = 200
DEADLINE_S = 180.0


async def _stamp_events(client: AsyncClient, resource: Any, namespace: str | None,
                        stamps: list[tuple[float, str, dict[str, Any]]]) -> None:
    """Stamp every event (through the agent's watch helper: it rides out a 429 while a fresh
    API server's storage starts)."""
    async for kind, obj in watching.watch(client, resource, what="bench", namespace=namespace):
        stamps.append((time.monotonic(), kind, as_dict(obj)))


async def _latency(plane: ControlPlane, kube: AsyncClient, ns: str, tmp: Path) -> None:
    node = harness.new_node(plane)
    offline = tmp / "offline"
    pool = slices.local_pool(ns, "flip", node)
    name = instance_name("flip", "d1", shared=False, node=node)
    harness.apply(plane, ns, harness.debug_echo_configuration(
        "flip", descriptions=["d0", "d1"], shared=False, availability_file=offline))
    instance_events: list[tuple[float, str, dict[str, Any]]] = []
    slice_events: list[tuple[float, str, dict[str, Any]]] = []
    watches = [asyncio.create_task(_stamp_events(kube, InstanceResource, ns, instance_events)),
               asyncio.create_task(_stamp_events(kube, ResourceSliceResource, None,
                                                 slice_events))]
    samples: list[float] = []
    try:
        async with h.dra_agents(plane, [node], ns):
            async def devices(count: int) -> bool:
                return len(h.pool_devices(await h.pool_slices(kube, pool))) == count

            await harness.eventually(lambda: devices(2), what="two devices", deadline=DEADLINE_S)
            for flip in range(FLIPS * 2):
                # Pacing, not a wait: each change comes after a quiet spell, as one device
                # going does (a burst is batched, settings.dra.min_pass_interval_s).
                await asyncio.sleep(DraSettings().min_pass_interval_s)
                gone = flip % 2 == 0
                mark = len(instance_events), len(slice_events)
                offline.write_text("d1\n" if gone else "")
                await harness.eventually(lambda g=gone: devices(1 if g else 2),  # type: ignore[misc]
                                         what="the slice updated", deadline=DEADLINE_S)
                wanted = "DELETED" if gone else "ADDED"

                async def stamped(w: str = wanted, m: tuple[int, int] = mark
                                  ) -> tuple[float, float] | None:
                    inst = [t for t, k, o in instance_events[m[0]:]
                            if k == w and o["metadata"]["name"] == name]
                    sl = [t for t, _, o in slice_events[m[1]:]
                          if o["spec"]["pool"]["name"] == pool]
                    return (inst[0], sl[-1]) if inst and sl else None

                try:
                    seen, written = await harness.eventually(stamped, what="both watch events",
                                                             deadline=30.0)
                except AssertionError:
                    print(f"  flip {flip}: events since {mark}: instances "
                          f"{[(k, o['metadata']['name']) for _, k, o in instance_events]}, "
                          f"slices {len(slice_events)}; watches "
                          f"{[t.done() and t.exception() for t in watches]}", flush=True)
                    raise
                samples.append(written - seen)
    finally:
        for task in watches:
            task.cancel()
        await h.delete_slices(kube, node)
    print(summary("  Instance deleted/created -> its pool's slice rewritten", samples),
          flush=True)


async def _two_hundred(plane: ControlPlane, kube: AsyncClient, ns: str, *, shared: bool) -> None:
    node = harness.new_node(plane)
    names = [f"dev{i:03d}" for i in range(DEVICES)]
    conf = "many-shared" if shared else "many-local"
    # Shared devices' pools are the controller's (controller.dra.shared_pools), run in-process.
    classes = DeviceClasses(kube, namespaces=[ns])
    keeper = asyncio.create_task(classes.run()) if shared else None
    try:
        async with h.dra_agents(plane, [node], ns) as agents:
            publisher = classes.pools if shared else agents[node].publisher
            started = time.monotonic()
            harness.apply(plane, ns, harness.debug_echo_configuration(
                conf, descriptions=names, shared=shared))

            async def all_published() -> list[dict[str, Any]] | None:
                found = [s async for s in _slices(kube, node if not shared else None)
                         if s["spec"]["pool"]["name"].startswith(f"{ns}/{conf}/")]
                count = sum(len(s["spec"]["devices"]) for s in found)
                return found if count == DEVICES else None

            found = await harness.eventually(all_published, what=f"{DEVICES} devices in slices",
                                             deadline=DEADLINE_S)
            took = time.monotonic() - started
            size = sum(len(json.dumps(s["spec"])) for s in found)
            pools = {s["spec"]["pool"]["name"] for s in found}
            print(f"  {DEVICES} {'shared' if shared else 'local'} devices: all in slices "
                  f"{took:.1f} s after the Configuration was applied; {len(found)} slices in "
                  f"{len(pools)} pools, {size / 1024:.0f} KiB of spec JSON "
                  f"({size / DEVICES:.0f} B per device); {publisher.writes} API writes "
                  f"(the pool is rewritten as Instances appear)", flush=True)
    finally:
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        await h.delete_slices(kube, node)


async def _slices(kube: AsyncClient, node: str | None) -> Any:
    """The node's own slices, or (None) every slice."""
    labels: dict[str, Any] | None = {slices.LABEL_NODE: node} if node is not None else None
    async for obj in kube.list(ResourceSliceResource, labels=labels):
        yield as_dict(obj)


async def _memory(plane: ControlPlane, *, dra_on: bool) -> None:
    env = daemonset_env()
    directory = Path(tempfile.mkdtemp(prefix="epd-", dir="/tmp"))
    if dra_on:
        env.update({"DRA": "on", "DRA_PLUGINS_DIR": str(directory / "plugins"),
                    "DRA_REGISTRY_DIR": str(directory / "registry"),
                    "CDI_SPEC_DIR": str(directory / "cdi")})
    async with bench_node(plane, label="dra" if dra_on else "nodra", pod_resources=True,
                          env=env) as node:
        names = [f"m{i:03d}" for i in range(INSTANCES)]
        harness.apply(plane, node.namespace, harness.debug_echo_configuration(
            "mem", descriptions=names))
        await _ready(node, INSTANCES)
        if dra_on:  # the proof that DRA runs in this agent: its slices hold every device
            async def published() -> bool:
                found = [s async for s in _slices(node.client, node.name)]
                return sum(len(s["spec"]["devices"]) for s in found) == INSTANCES

            await harness.eventually(published, what=f"{INSTANCES} devices in the agent's "
                                     "slices", deadline=DEADLINE_S)
            registry = directory / "registry" / "edgeplug.io-reg.sock"
            assert registry.exists(), "the DRA kubelet plugin's registration socket"
        await _read_memory(node.pid, f"{INSTANCES} Instances, DRA {'on' if dra_on else 'off'}",
                           target=TARGET_MIB)


async def _slices_part(plane: ControlPlane) -> None:
    kube = harness.api_client(plane)
    ns = f"bench-dra-{int(time.time())}"
    plane.kubectl("create", "namespace", ns)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"1. Instance -> ResourceSlice, {FLIPS} times offline and back", flush=True)
            await _latency(plane, kube, ns, Path(tmp))
        print(f"2. {DEVICES} devices in slices", flush=True)
        await _two_hundred(plane, kube, ns, shared=False)
        await _two_hundred(plane, kube, ns, shared=True)
    finally:
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await kube.close()


def main(argv: list[str]) -> None:
    """Every part; ``--slices`` or ``--memory`` runs only that one."""
    quiet_logs()
    with ControlPlane() as plane:
        plane.apply_crds()
        if "--memory" not in argv:
            asyncio.run(_slices_part(plane))
        if "--slices" in argv:
            return
        print(f"3. agent memory, {INSTANCES} Instances with plugins, DRA off then on",
              flush=True)
        for dra_on in (False, True):
            asyncio.run(_memory(plane, dra_on=dra_on))


if __name__ == "__main__":
    main(sys.argv[1:])
