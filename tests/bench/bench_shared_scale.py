"""``python -m tests.bench shared_scale``: N shared devices through the scheduler.

How the cost of publishing shared devices for the scheduler grows with their number, and what a
pod's scheduling then costs: a real control plane (API server, scheduler, controller-manager),
one Ready Node without a kubelet (``NodeReporter``), one agent process with ``DRA=on`` (slices,
no kubelet plugin) and the controller process with ``--dra``, all in one namespace. Per N and
run, one Configuration with N shared debugEcho devices of capacity 2 is applied, and:

- published: Configuration applied → every device in the controller's slices and the
  Configuration's DeviceClass present, from watches in this process;
- settled: → the last slice, DeviceClass or Instance event before ``QUIET_S`` without one
  (writes that trickle on after the devices are published);
- bind: a pod asking ``edgeplug.io/<configuration>: 1`` created → bound (``spec.nodeName``),
  beside a plain pod's create → bound, interleaved, ``PODS`` of each (the floor), and a pod
  asking ``edgeplug.io/dra-floor: 1``, a Configuration of one device applied before the runs
  (the DRA floor: the scheduler's own writes for a pod asking an extended resource DRA serves,
  a claim's create, update and status and the pod's status, with one device to choose from);
  and a pod asking for an Instance by name, its DeviceClass made on that demand;
- CPU of the controller, the agent, the API server and the scheduler from the apply to the
  settle, and the controller's per device;
- the events each kind saw (the writes behind them).

Then the Configuration is deleted and the run waits for its slices, classes and Instances to go.
``--controller-tree DIR`` runs the controller from another checkout (a ``git worktree`` of an
earlier commit: the before figures; the agent always runs from this one). ``--profile DIR``
records the controller with py-spy over the largest N's first run. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kube import watching
from agent.kube.client import as_dict
from controller.dra.instance_classes import DeviceClassResource
from controller.dra.shared_pools import SharedPools
from crds import dra, dra_slices
from crds.configuration import Allocator
from crds.naming import instance_resource_name
from crds.resources import InstanceResource, ResourceSliceResource
from tests.bench.stats import machine_speed_line
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness import hermetic
from tests.harness.agent_process import AgentSubprocess
from tests.harness.controller_process import FAST_ARGS, install_peering_crds
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.kube_waits import wait_service_account
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

SIZES: Final = (10, 200, 1000)
RUNS: Final = 3
PODS: Final = 5
CAPACITY: Final = 2
#: Settled: this long without a slice, class or Instance event.
QUIET_S: Final = 3.0
PUBLISH_DEADLINE_S: Final = 600.0
BIND_DEADLINE_S: Final = 60.0
PROCESSES: Final = ("controller", "agent", "kube-apiserver", "kube-scheduler")
#: The Configuration of one device whose pods are the DRA floor.
DRA_FLOOR: Final = "dra-floor"


@dataclass
class Tracker:
    """What the watches saw: the controller's slices, the DeviceClasses, the Instances."""

    slices: dict[str, tuple[str, int]] = field(default_factory=dict)  # name → (pool, devices)
    classes: dict[str, str] = field(default_factory=dict)  # name → "<ns>/<configuration>"
    events: dict[str, int] = field(default_factory=lambda: {"slices": 0, "classes": 0,
                                                            "instances": 0})
    last_event: float = 0.0
    bound: dict[str, float] = field(default_factory=dict)  # pod → when first seen bound
    #: Instance → when first seen listing a node (an agent's verdict: it lists its node once
    #: the device's health there is on the Instance), and pool → when its slice was first
    #: seen: the controller's share is the difference.
    listed: dict[str, float] = field(default_factory=dict)
    sliced: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Instance events by the write behind them (``_writer``).
    writers: dict[str, int] = field(default_factory=dict)
    entries: dict[str, dict[str, str]] = field(default_factory=dict)  # Instance → _entries
    runs: int = 0  # runs started: each Configuration (and its pods) named afresh

    def devices(self, prefix: str) -> int:
        return sum(n for pool, n in self.slices.values() if pool.startswith(prefix))

    def class_count(self, owner: str) -> int:
        return sum(1 for o in self.classes.values() if o == owner)


async def _follow(client: AsyncClient, resource: Any, what: str, namespace: str | None,
                  on_event: Callable[[str, dict[str, Any]], None],
                  labels: dict[str, Any] | None = None) -> None:
    async for kind, obj in watching.watch(client, resource, what=what, namespace=namespace,
                                          labels=labels):
        on_event(kind, as_dict(obj))


def _trackers(client: AsyncClient, ns: str, seen: Tracker) -> list[asyncio.Task[None]]:
    def on_slice(kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        pool = str(body["spec"]["pool"]["name"])
        if kind == "DELETED":
            seen.slices.pop(name, None)
        else:
            devices = body["spec"].get("devices") or ()
            seen.slices[name] = (pool, len(devices))
            for device in devices:
                seen.sliced.setdefault(str(device["name"]), time.monotonic())
        seen.events["slices"] += 1
        seen.last_event = time.monotonic()
        seen.changed.set()

    def on_class(kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        owner = ((body["metadata"].get("annotations") or {})
                 .get(dra.ANNOTATION_CONFIGURATION, ""))
        if kind == "DELETED":
            seen.classes.pop(name, None)
        else:
            seen.classes[name] = owner
        seen.events["classes"] += 1
        seen.last_event = time.monotonic()
        seen.changed.set()

    def on_instance(kind: str, body: dict[str, Any]) -> None:
        if kind != "DELETED" and (body.get("spec") or {}).get("nodes"):
            seen.listed.setdefault(body["metadata"]["name"], time.monotonic())
        name = body["metadata"]["name"]
        if kind == "DELETED":
            seen.entries.pop(name, None)
            seen.changed.set()  # a teardown waits for them
        else:
            after = _entries(body)
            writer = _writer(seen.entries.get(name, {}), after)
            seen.entries[name] = after
            seen.writers[writer] = seen.writers.get(writer, 0) + 1
        seen.events["instances"] += 1
        seen.last_event = time.monotonic()
        seen.changed.set()

    def on_pod(kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if kind != "DELETED" and (body.get("spec") or {}).get("nodeName"):
            seen.bound.setdefault(name, time.monotonic())
            seen.changed.set()

    managed = {dra.LABEL_MANAGED_BY: dra_slices.CONTROLLER_MANAGED_BY}
    return [
        asyncio.create_task(_follow(client, ResourceSliceResource, "slices", None, on_slice,
                                    managed)),
        asyncio.create_task(_follow(client, DeviceClassResource, "classes", None, on_class,
                                    {dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER})),
        asyncio.create_task(_follow(client, InstanceResource, "instances", ns, on_instance)),
        asyncio.create_task(_follow(client, Pod, "pods", ns, on_pod)),
    ]


async def _until(seen: Tracker, check: Callable[[], bool], *, what: str,
                 deadline: float) -> float:
    """Wait for ``check`` (re-checked on every watch event); the time it first held."""
    until = time.monotonic() + deadline
    while not check():
        seen.changed.clear()
        left = until - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(seen.changed.wait(), timeout=min(left, 1.0))
    return time.monotonic()


async def _quiet(seen: Tracker, *, deadline: float) -> float:
    """Wait until no watched event came for ``QUIET_S``; the time of the last one."""
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        since = time.monotonic() - seen.last_event
        if since >= QUIET_S:
            break
        await asyncio.sleep(QUIET_S - since)  # the measurement: a quiet spell is waited out
    return seen.last_event


def _entries(body: dict[str, Any]) -> dict[str, str]:
    """An Instance's managedFields entries: ``manager-operation[/subresource]`` → their time
    and fields."""
    found: dict[str, str] = {}
    for entry in (body.get("metadata") or {}).get("managedFields") or []:
        manager = str(entry.get("manager") or "?").removeprefix("edgeplug-").split("-")[0]
        sub = f"/{entry['subresource']}" if entry.get("subresource") else ""
        key = f"{manager}-{str(entry.get('operation') or '?').lower()}{sub}"
        found[key] = f"{entry.get('time')}{entry.get('fieldsV1')}"
    return found


def _writer(before: dict[str, str], after: dict[str, str]) -> str:
    """Who made an Instance event: the managedFields entries it changed (``?``: none seen)."""
    return ",".join(sorted(k for k, v in after.items() if before.get(k) != v)) or "?"


def _pod(name: str, resource: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.example/none:1"}
    if resource:
        container["resources"] = {"limits": {resource: "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]}}


async def _bind(client: AsyncClient, ns: str, seen: Tracker, name: str,
                resource: str | None) -> float:
    started = time.monotonic()
    body = _pod(name, resource)
    body["metadata"]["namespace"] = ns
    await client.create(cast(Pod, Pod.from_dict(body)))
    bound = await _until(seen, lambda: name in seen.bound, what=f"pod {name} bound",
                         deadline=BIND_DEADLINE_S)
    return bound - started


def _cpu(pids: dict[str, int]) -> dict[str, dict[int, int]]:
    return {name: thread_cpu_ns(pid) for name, pid in pids.items()}


@dataclass
class Run:
    size: int
    published: float
    settled: float
    teardown: float
    cpu: dict[str, float]
    events: dict[str, int]
    binds: list[float]
    floor: list[float]
    by_name: list[float]
    dra_floor: list[float]
    #: Applied → the agent's last health verdict; each device's verdict → its slice.
    reported: float = 0.0
    lags: list[float] = field(default_factory=list)
    tree: str = ""  # the checkout the controller ran from (its directory's name)


async def _one_run(client: AsyncClient, plane: ControlPlane, ns: str, seen: Tracker,
                   pids: dict[str, int], size: int, index: int) -> Run:
    seen.runs += 1
    cfg = f"s{size}r{index}x{seen.runs}"
    body = harness.debug_echo_configuration(
        cfg, descriptions=[f"d{i}" for i in range(size)], shared=True, capacity=CAPACITY)
    prefix = f"{ns}/{cfg}/shared/"
    owner = f"{ns}/{cfg}"
    events_before = dict(seen.events)
    seen.writers.clear()
    cpu_before = _cpu(pids)
    started = time.monotonic()
    harness.apply(plane, ns, body)
    published = await _until(
        seen, lambda: seen.devices(prefix) == size and seen.class_count(owner) == 1,
        what=f"{size} devices in slices and the Configuration's class",
        deadline=PUBLISH_DEADLINE_S)
    last = await _quiet(seen, deadline=PUBLISH_DEADLINE_S)
    cpu_after = _cpu(pids)
    instances = [n for n in seen.listed if n.startswith(f"{cfg}-")]
    reported = max(seen.listed[n] for n in instances)
    lags = [seen.sliced[dra_slices.device_name(n)] - seen.listed[n] for n in instances
            if dra_slices.device_name(n) in seen.sliced]
    for n in instances:  # a later run's Configuration of the same name starts afresh
        seen.listed.pop(n, None)
        seen.sliced.pop(dra_slices.device_name(n), None)
    events = {k: seen.events[k] - events_before[k] for k in seen.events}
    binds: list[float] = []
    floor: list[float] = []
    by_name: list[float] = []  # the first pod asking for each: its class made on demand
    # Each kind interleaved with plain pods, so a slow spell of the machine hits both; by name
    # first, one a device, while every device has a free slot.
    for i, instance in enumerate(sorted(instances)[:PODS]):
        floor.append(await _bind(client, ns, seen, f"{cfg}-plain-{i}", None))
        by_name.append(await _bind(client, ns, seen, f"{cfg}-name-{i}",
                                   instance_resource_name(instance)))
    dra_floor: list[float] = []
    for i in range(PODS):
        floor.append(await _bind(client, ns, seen, f"{cfg}-plain-{PODS + i}", None))
        binds.append(await _bind(client, ns, seen, f"{cfg}-dev-{i}", f"edgeplug.io/{cfg}"))
        dra_floor.append(await _bind(client, ns, seen, f"{cfg}-drafloor-{i}",
                                     f"edgeplug.io/{DRA_FLOOR}"))
    for i in range(PODS):
        for pod in (f"{cfg}-plain-{i}", f"{cfg}-plain-{PODS + i}", f"{cfg}-dev-{i}",
                    f"{cfg}-name-{i}", f"{cfg}-drafloor-{i}"):
            with contextlib.suppress(ApiError):
                await client.delete(Pod, pod, namespace=ns, grace_period=0)
    removed = time.monotonic()
    plane.kubectl("delete", "configuration", cfg, "-n", ns, "--wait=false")
    # Its Instances too (the garbage collector's deletes): the next run starts on an idle API
    # server.
    gone = await _until(seen, lambda: seen.devices(prefix) == 0 and seen.class_count(owner) == 0
                        and not any(n.startswith(f"{cfg}-") for n in seen.entries),
                        what=f"{cfg}'s slices, classes and Instances gone",
                        deadline=PUBLISH_DEADLINE_S)
    return Run(size=size, published=published - started, settled=last - started,
               teardown=gone - removed,
               cpu={name: cpu_seconds_between(cpu_before[name], cpu_after[name])
                    for name in pids},
               events=events, binds=binds, floor=floor, by_name=by_name, dra_floor=dra_floor,
               reported=reported - started,
               lags=lags)


class _NoApi:
    """A client for the pass-cost part: every apply and delete succeeds, lists find nothing."""

    async def patch(self, _resource: object, _name: str, body: dict[str, Any],
                    **_: object) -> dict[str, Any]:
        return body

    async def delete(self, *_: object, **__: object) -> None:
        return None

    async def _none(self) -> AsyncIterator[dict[str, Any]]:
        found: tuple[dict[str, Any], ...] = ()
        for body in found:
            yield body

    def list(self, *_: object, **__: object) -> AsyncIterator[dict[str, Any]]:
        return self._none()


def _instance_body(i: int, *, version: int = 1, nodes: tuple[str, ...] = ("n1",)
                   ) -> dict[str, Any]:
    return {"metadata": {"name": f"cam-{i:06x}", "namespace": "ns",
                         "resourceVersion": str(version)},
            "spec": {"configurationName": "cam", "shared": True, "nodes": list(nodes),
                     "capacity": CAPACITY,
                     "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": f"d{i}"}},
            "status": {}}


async def _pass_cost(size: int) -> None:
    """The controller's own CPU for shared pools at ``size`` devices, without an API server
    (every call answered at once): an Instance event that changes no pool input, one that
    changes one pool and its pass, and the full pass after a (re)list."""
    pools = SharedPools(cast(AsyncClient, _NoApi()), namespaces=["ns"])
    bodies = [_instance_body(i) for i in range(size)]
    started = time.process_time()
    pools.listed(bodies)
    pools.set_mode(("ns", "cam"), Allocator.DRA)
    pools.modes_listed()
    await pools.reconcile()
    full = time.process_time() - started
    events = 200
    started = time.process_time()
    for i in range(events):  # the controller's own status write comes back: no pool input
        body = _instance_body(i, version=2)
        body["status"] |= {"servedBy": "dra", "claims": 0}
        pools.put(("ns", body["metadata"]["name"]), body)
    quiet = (time.process_time() - started) / events
    started = time.process_time()
    for i in range(events):  # a second node reports: the pool is rewritten
        body = _instance_body(i, version=3, nodes=("n1", "n2"))
        pools.put(("ns", body["metadata"]["name"]), body)
        await pools.reconcile()
    one = (time.process_time() - started) / events
    print(f"  pass cost at {size:,} shared devices, no API server: relist + full pass "
          f"{full:.2f} s ({full / size * 1e6:.0f} µs a device); an Instance event changing no "
          f"pool input {quiet * 1e6:.0f} µs, no pass; one changing a pool, with its pass "
          f"{one * 1e3:.2f} ms", flush=True)


def _controller(plane: ControlPlane, ns: str, tree: Path, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "controller.main", "--kubeconfig", str(plane.kubeconfig),
            "--namespace", ns, *FAST_ARGS, "--dra"]
    env = hermetic.controller_environment(
        {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "PYTHONUNBUFFERED": "1",
         "PYTHONPATH": str(tree)})
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)


def _agent(plane: ControlPlane, node: str, ns: str, tmp: Path) -> AgentSubprocess:
    (tmp / "plugins").mkdir()
    (tmp / "cdi").mkdir()
    return AgentSubprocess(plane, node_name=node, namespace=ns, log_path=tmp / "agent.log",
                           extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",
                                      "DRA_PLUGINS_DIR": str(tmp / "plugins"),
                                      "CDI_SPEC_DIR": str(tmp / "cdi")})


def _profile(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("  (py-spy not installed: no profile)")
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "50", "--format",
                             "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Controllers:
    """The controller process, from one checkout or another: ``use`` stops the running one if
    it is of another tree, starts that tree's and waits out a warm-up run."""

    def __init__(self, plane: ControlPlane, ns: str, log_dir: Path) -> None:
        self._plane = plane
        self._ns = ns
        self._log_dir = log_dir
        self.tree: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.tree = None

    def use(self, tree: Path) -> bool:
        """True when it (re)started the controller."""
        if self.tree == tree and self.process is not None and self.process.poll() is None:
            return False
        self.stop()
        self.process = _controller(self._plane, self._ns, tree,
                                   self._log_dir / f"controller-{tree.name}.log")
        self.tree = tree
        return True


async def _bench(args: argparse.Namespace, tmp: Path) -> list[Run]:
    runs: list[Run] = []
    trees = [args.controller_tree, *([args.against] if args.against else [])]
    with ControlPlane() as plane:
        install_peering_crds(plane)
        client = harness.api_client(plane)
        ns = f"scale-{uuid.uuid4().hex[:6]}"
        plane.kubectl("create", "namespace", ns)
        node = f"scale-{uuid.uuid4().hex[:6]}"
        seen = Tracker()
        watches = _trackers(client, ns, seen)
        agent = _agent(plane, node, ns, tmp)
        controllers = Controllers(plane, ns, tmp)
        try:
            await wait_service_account(client, ns)
            async with h.ready_nodes(client, [node]):
                agent.start()
                assert agent.process is not None
                harness.apply(plane, ns, harness.debug_echo_configuration(
                    DRA_FLOOR, descriptions=["floor"], shared=True, capacity=PODS))
                servers = {k: v for k, v in plane.pids().items() if k in PROCESSES}
                for size in args.sizes:
                    for index in range(1, args.runs + 1):
                        for tree in trees:  # interleaved: a slow spell hits both alike
                            if controllers.use(tree):
                                # Warm-up: up and serving before the timed apply (PODS x
                                # CAPACITY slots for the pods).
                                assert controllers.process is not None
                                pids = {"controller": controllers.process.pid,
                                        "agent": agent.process.pid, **servers}
                                await _one_run(client, plane, ns, seen, pids, PODS, 0)
                            run = await _profiled(args, client, plane, ns, seen, pids, size,
                                                  index, tree)
                            runs.append(run)
        finally:
            controllers.stop()
            agent.stop()
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await h.delete_controller_slices(client, ns)
            await client.close()
    return runs


async def _profiled(args: argparse.Namespace, client: AsyncClient, plane: ControlPlane,
                    ns: str, seen: Tracker, pids: dict[str, int], size: int, index: int,
                    tree: Path) -> Run:
    """One run, recorded by py-spy when asked (the largest N's first run of each tree)."""
    spy = None
    if args.profile and size == max(args.sizes) and index == 1:
        spy = _profile(pids["controller"], args.profile / f"controller-{tree.name}-{size}.txt")
    run = await _one_run(client, plane, ns, seen, pids, size, index)
    run.tree = tree.name
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its record then
        spy.wait(60)
    print(f"  {tree.name} N={size} run {index}: published {run.published:.1f} s (the agent's "
          f"last verdict {run.reported:.1f} s; verdict → slice median "
          f"{statistics.median(run.lags):.2f} s, max {max(run.lags):.2f}), "
          f"settled {run.settled:.1f} s, controller CPU {run.cpu['controller']:.2f} s, bind "
          f"median {statistics.median(run.binds) * 1000:.0f} ms (floor "
          f"{statistics.median(run.floor) * 1000:.0f} ms; by an Instance's name, its class "
          f"made then: {statistics.median(run.by_name) * 1000:.0f} ms; DRA floor "
          f"{statistics.median(run.dra_floor) * 1000:.0f} ms), events {run.events}, "
          f"Instance events by writer {dict(sorted(seen.writers.items()))}, teardown "
          f"{run.teardown:.1f} s", flush=True)
    return run


def _report(runs: list[Run]) -> None:
    print(f"  medians over the runs per N ({PODS} pods of each kind per run); CPU from the "
          "apply to settled")
    print(f"  {'controller':>12} {'N':>5} {'published':>10} {'agent':>7} {'lag':>6} "
          f"{'settled':>8} {'bind':>8} "
          f"{'floor':>8} {'ratio':>6} {'DRA floor':>9} {'ratio':>6} {'by name':>8} {'ctl CPU':>8} "
          f"{'ms/dev':>7} {'agent':>7} "
          f"{'apiserver':>9} {'sched':>7} {'slice/class/inst events':>24}")
    for size in sorted({r.size for r in runs}):
        for tree in sorted({r.tree for r in runs}):
            of = [r for r in runs if r.size == size and r.tree == tree]
            binds = statistics.median(b for r in of for b in r.binds)
            floor = statistics.median(f for r in of for f in r.floor)
            by_name = statistics.median(b for r in of for b in r.by_name)
            dra_floor = statistics.median(b for r in of for b in r.dra_floor)

            def med(get: Callable[[Run], float], runs_of: list[Run] = of) -> float:
                return statistics.median(get(r) for r in runs_of)

            ctl = med(lambda r: r.cpu["controller"])
            events = "/".join(f"{med(lambda r, k=k: r.events[k]):.0f}"  # type: ignore[misc]
                              for k in ("slices", "classes", "instances"))
            lag = statistics.median(x for r in of for x in r.lags)
            print(f"  {tree[-12:]:>12} {size:>5} {med(lambda r: r.published):>9.1f}s"
                  f" {med(lambda r: r.reported):>6.1f}s {lag:>5.2f}s"
                  f" {med(lambda r: r.settled):>7.1f}s {binds * 1000:>6.0f}ms"
                  f" {floor * 1000:>6.0f}ms {binds / floor:>5.1f}x {dra_floor * 1000:>7.0f}ms"
                  f" {binds / dra_floor:>5.1f}x {by_name * 1000:>6.0f}ms"
                  f" {ctl:>7.2f}s"
                  f" {ctl / size * 1000:>7.2f} {med(lambda r: r.cpu['agent']):>6.2f}s"
                  f" {med(lambda r: r.cpu.get('kube-apiserver', 0.0)):>8.2f}s"
                  f" {med(lambda r: r.cpu.get('kube-scheduler', 0.0)):>6.2f}s {events:>24}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench shared_scale")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=list(SIZES), help="N shared devices, comma-separated")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--controller-tree", type=Path, default=REPO_ROOT,
                        help="the checkout the controller runs from")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (a git worktree of an earlier commit: the "
                        "before figures); each run is made with both controllers in turn")
    parser.add_argument("--pass-cost", type=int, default=10_000, metavar="N",
                        help="the controller's CPU per pass at N devices without an API "
                        "server (this checkout's code; 0: skip)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a directory for py-spy's record of the controller (largest N)")
    args = parser.parse_args(argv)
    print(machine_speed_line())
    if args.pass_cost:
        asyncio.run(_pass_cost(args.pass_cost))
        if not args.sizes:
            return
    print(f"  controller from {args.controller_tree}"
          + (f", each run also from {args.against}" if args.against else ""), flush=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        runs = asyncio.run(_bench(args, Path(tmp)))
    _report(runs)
    print(machine_speed_line())
