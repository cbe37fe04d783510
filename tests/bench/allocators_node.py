"""``bench_allocators``' node: one agent, its emulated kubelet and a controller per allocator,
and what the scheduler can see of their devices.

The scheduler's view is the one that counts for "a device can be scheduled": a device is schedulable
once it is in a ResourceSlice (``dra``) or in the Node's allocatable (``devicePlugin``), and a pod
asking for it is bound. This wraps ``bench_agent_setup.bench_node`` (the agent as
``python -m agent.main`` with DRA on, as the chart runs it, beside the node emulator) with the
controller process (``--dra``) of its namespace and the watches of ``bench_shared_scale`` (pods
bound, the controller's slices and classes) plus one on the agents' own slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod

from agent.settings import current
from crds import dra, dra_slices
from crds.resources import ResourceSliceResource
from tests.bench.bench_agent_setup import BenchNode, bench_node, daemonset_env
from tests.bench.bench_shared_scale import Tracker, _bind, _follow, _pod, _trackers, _until
from tests.harness import dra as h
from tests.harness.agent_process import apply, debug_echo_configuration, eventually
from tests.harness.aio_process import cancel_and_wait
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account

ALLOCATORS: Final = ("dra", "devicePlugin")
#: How long N devices may take to become schedulable, and one device or a teardown.
PUBLISH_DEADLINE_S: Final = 300.0
DEADLINE_S: Final = 60.0
#: A waiting pod is left this long after the scheduler found no place for it, so its first
#: backoff (1 s) has run out, as for a pod that waited a while. Pacing, not a wait.
PENDING_PACE_S: Final = 1.2


@dataclass
class AllocatorNode:
    """An agent serving one allocator's Configurations, and the scheduler's view of them."""

    allocator: str
    node: BenchNode
    seen: Tracker
    dra_dir: Path
    controller_pid: int

    @property
    def ns(self) -> str:
        return self.node.namespace

    def schedulable(self, cfg: str) -> int:
        """How many of ``cfg``'s devices (capacity 1) the scheduler can place a pod asking
        ``edgeplug.io/<cfg>`` on: in slices (``dra``), or in the Node's allocatable of that
        resource (``devicePlugin``: its configuration-level plugin; an Instance's own resource
        drops to 0 while the configuration-level one holds its slot)."""
        if self.allocator == "dra":
            return self.seen.devices(f"{self.ns}/{cfg}/")
        return int(self.node.state.allocatable.get(f"edgeplug.io/{cfg}", "0"))

    async def until_schedulable(self, cfg: str, count: int, *,
                                deadline: float = DEADLINE_S) -> float:
        """The time ``count`` of ``cfg``'s devices were first schedulable."""
        what = f"{count} devices of {cfg} schedulable"
        check: Callable[[], bool] = lambda: self.schedulable(cfg) == count  # noqa: E731
        if self.allocator == "dra":
            return await _until(self.seen, check, what=what, deadline=deadline)
        return await self.node.state.until(check, what=what, deadline=deadline)

    def configuration(self, cfg: str, names: list[str], *, shared: bool,
                      offline: Path | None = None, capacity: int = 1) -> dict[str, Any]:
        """A debugEcho Configuration pinned to this node's allocator (grace 0: an offline
        device goes at once)."""
        return debug_echo_configuration(cfg, descriptions=names, shared=shared, grace=0,
                                        availability_file=offline, capacity=capacity,
                                        allocator=self.allocator)


@contextlib.asynccontextmanager
async def allocator_node(plane: ControlPlane, allocator: str, log_dir: Path
                         ) -> AsyncIterator[AllocatorNode]:
    """A fresh namespace and node: the agent (DRA on: slices and the DRA kubelet plugin; the
    device-plugin allocator loaded only when a Configuration asks for it), the emulated kubelet
    with pod-resources, the controller with ``--dra``; every Configuration deleted at the end
    and its slices and classes waited out, so later runs' scheduler does not carry them."""
    dra_dir = Path(tempfile.mkdtemp(prefix="epa-", dir="/tmp"))  # short: socket paths ≤ 108 B
    env = daemonset_env() | {"DRA": "on", "DRA_PLUGINS_DIR": str(dra_dir / "plugins"),
                             "DRA_REGISTRY_DIR": str(dra_dir / "registry"),
                             "CDI_SPEC_DIR": str(dra_dir / "cdi")}
    (dra_dir / "cdi").mkdir()
    label = "alc" if allocator == "dra" else "alp"
    async with bench_node(plane, label=label, pod_resources=True, env=env) as node:
        seen = Tracker()
        agents = {dra.LABEL_MANAGED_BY: dra_slices.MANAGED_BY}
        watches = [*_trackers(node.client, node.namespace, seen),
                   asyncio.create_task(_follow(node.client, ResourceSliceResource,
                                               "agent slices", None,
                                               lambda k, b: _on_slice(seen, k, b), agents))]
        controller = ControllerProcess(plane, namespaces=[node.namespace],
                                       log_path=log_dir / f"controller-{node.namespace}.log",
                                       extra_args=(*FAST_ARGS, "--dra"))
        controller.start()
        try:
            await wait_service_account(node.client, node.namespace)
            yield AllocatorNode(allocator, node, seen, dra_dir, controller.pid)
            plane.kubectl("delete", "configurations", "--all", "-n", node.namespace)
            await _until(seen, lambda: _nothing_left(seen, node.namespace),
                         what=f"{node.namespace}'s slices and classes gone",
                         deadline=PUBLISH_DEADLINE_S)
        finally:
            controller.stop()
            await cancel_and_wait(*watches)
            await h.delete_controller_slices(node.client, node.namespace)
            await h.delete_slices(node.client, node.name)
            shutil.rmtree(dra_dir, ignore_errors=True)


def _on_slice(seen: Tracker, kind: str, body: dict[str, Any]) -> None:
    """An agent's slice, counted as ``bench_shared_scale`` counts the controller's."""
    name = body["metadata"]["name"]
    if kind == "DELETED":
        seen.slices.pop(name, None)
    else:
        seen.slices[name] = (str(body["spec"]["pool"]["name"]),
                             len(body["spec"].get("devices") or ()))
    seen.changed.set()


def _nothing_left(seen: Tracker, ns: str) -> bool:
    return (seen.devices(f"{ns}/") == 0
            and not any(o.startswith(f"{ns}/") for o in seen.classes.values()))


async def appear(an: AllocatorNode, *, shared: bool, samples: int
                 ) -> tuple[list[float], list[float], list[float]]:
    """Device appears → schedulable, and → a pod that waited for it bound, ``samples`` times.

    One Configuration with ``samples`` devices, all offline at first (debugEcho's availability
    file). Per sample: a pod asking ``edgeplug.io/<configuration>: 1`` is created and waits
    (the scheduler finds no place: earlier pods hold the earlier devices), a plain pod is
    bound beside it (the floor), then one more device comes online. Returns (appeared →
    schedulable, appeared → waiting pod bound, plain pod created → bound), seconds."""
    cfg = "shr" if shared else "loc"
    names = [f"a{i}" for i in range(samples)]
    offline = an.dra_dir / f"{cfg}-offline"
    _offline(offline, names)
    apply(an.node.plane, an.ns, an.configuration(cfg, names, shared=shared, offline=offline))
    published: list[float] = []
    bound: list[float] = []
    floor: list[float] = []
    for i in range(samples):
        waiting = f"{cfg}-wait-{i}"
        body = _pod(waiting, f"edgeplug.io/{cfg}")
        body["metadata"]["namespace"] = an.ns
        await an.node.client.create(cast(Pod, Pod.from_dict(body)))
        await eventually(lambda p=waiting: h.unschedulable(an.node.client, an.ns, p),  # type: ignore[misc]
                         what=f"{waiting} found no place", deadline=DEADLINE_S)
        floor.append(await _bind(an.node.client, an.ns, an.seen, f"{cfg}-plain-{i}", None))
        await asyncio.sleep(PENDING_PACE_S)
        started = time.monotonic()
        _offline(offline, names[i + 1:])
        seen_at, bound_at = await asyncio.gather(
            an.until_schedulable(cfg, i + 1),
            _until(an.seen, lambda p=waiting: p in an.seen.bound,  # type: ignore[misc]
                   what=f"{waiting} bound", deadline=DEADLINE_S))
        published.append(seen_at - started)
        bound.append(bound_at - started)
    return published, bound, floor


def _offline(path: Path, names: list[str]) -> None:
    """Rewrite debugEcho's availability file (the devices offline) whole, by a rename: a
    rewrite in place can be read empty (every device online) between truncate and write."""
    partial = path.with_suffix(".partial")
    partial.write_text("".join(f"{n}\n" for n in names))
    partial.replace(path)


async def writes_floor(an: AllocatorNode, size: int, label: str) -> float:
    """The floor of ``many``: ``size`` ConfigMaps created by a bare client, as many in flight
    as the agent writes Instances (``publishing.writes_in_flight``): one write a device, where
    the agent and the controller make several (an Instance, its status, a slice, a plugin).
    Seconds."""
    gate = asyncio.Semaphore(current().publishing.writes_in_flight)

    async def one(i: int) -> None:
        async with gate:
            await an.node.client.create(ConfigMap(
                metadata=ObjectMeta(name=f"floor-{label}-{i:04d}", namespace=an.ns),
                data={"description": f"d{i:04d}" * 32}))

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(size)))
    return time.monotonic() - started


async def many(an: AllocatorNode, size: int, *, shared: bool, run: int) -> float:
    """``size`` devices of one Configuration: applied → every one schedulable, seconds."""
    cfg = f"n{size}{'s' if shared else 'l'}{run}"
    names = [f"d{i:04d}" for i in range(size)]
    started = time.monotonic()
    apply(an.node.plane, an.ns, an.configuration(cfg, names, shared=shared))
    return await an.until_schedulable(cfg, size,
                                      deadline=PUBLISH_DEADLINE_S) - started
