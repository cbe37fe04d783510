"""Local devices allocated by the scheduler (the DRA default) on the real node, while pods churn
and the agent is SIGKILLed, the kubelet restarted and the controller killed: no device serves
more containers than its capacity, no pod is refused at admission, every pod runs.

Real parts: the node is ``RealNode`` (the kubelet v1.37.2 itself with its DRA manager,
containerd 2, runc: a container gets what the claim's CDI spec says, or does not start); the
agent as ``python -m agent.main`` beside it with ``DRA=on`` (discovery, its node's ResourceSlice
pool, the DRA kubelet plugin), SIGKILLed and started again as a crashing DaemonSet pod is; the
controller as ``python -m controller.main --dra`` (the allocator choice and the DeviceClasses
mapping ``edgeplug.io/<configuration>`` and ``edgeplug.io/<instance>``), SIGKILLed and started
again; kube-scheduler and kube-controller-manager (which deallocates a gone pod's claim). The
other DRA fault test (test_dra_shared.py) has Ready Nodes without any kubelet, which can only
judge by claims; this one needs containers, so it takes the real kubelet (the harness's
``devicenode`` has no DRA manager).

Two Configurations of local debugEcho devices (``shared: false``), neither choosing an
allocator (the default): ``one``, a device of capacity 1, and ``two``, two devices of
capacity 2 (a consumable ``slots`` capacity in the slice): five slots on three devices. Pods ask
for them every way a user can: ``edgeplug.io/<configuration>: 1`` or
``edgeplug.io/<instance>: 1`` in ``resources.limits`` (unchanged Akri-style pods: the scheduler
makes their claim), or a ResourceClaimTemplate of the Configuration's DeviceClass, with or
without a CEL selector naming one device. Eight pods live at once, so three wait. Each turn
the oldest pod holding a device is deleted (gracefully, as a user does) and a new pod created;
right then (the moment a pod is bound to the node, its claim not yet prepared, or the turn
settled if none is) the turn's fault strikes: the agent SIGKILLed and started again, the kubelet
stopped and started again (containers running on), or the controller SIGKILLed and started
again; then the turn must settle: every pod either running with a device or Pending
``Unschedulable``, and no waiting pod that a free device would fit. At the end the pods are
deleted one by one until every pod has run.

Judged by containers: ``ctr`` on the node lists the running containers every ``POLL_S`` and
reads each one's OCI spec (the env the runtime gave it, the claim's CDI edits applied:
``DEBUG_ECHO_DESCRIPTION``). Flagged at once, throughout:

- a device serving more running containers than its capacity (a slot held twice), in two
  readings in a row with the same containers (each reading is one listing of the runtime);
- a container with a device its pod did not ask for, or with no device at all;
- a pod refused at admission (``UnexpectedAdmissionError``) or Failed before it was deleted;

and at every settled turn: the holders' claims allocated the device their container has, no
device given to more claims than its capacity, no ``edgeplug.io/`` resource in the Node's
allocatable (no device plugin advertises them). Run quiet and with both cores busy (``load``).

Why: a local device offered to the kubelet's device manager and to the scheduler at once
would be handed out by each (both containers with the device, or the
device-plugin pod refused at admission). With the agent made to serve these devices through its
device plugins too, this test fails: two pods refused at admission (the switch guard leaves the
claims' slots Unhealthy), or, with that guard off as well, a device of capacity 2 in three
running containers. A pod bound while the agent is down waits for the kubelet's next try at
preparing its claim, never refused.

Not in the compatibility run: v1.35.4 maps no extended resources, so these Configurations'
devices are the device plugins' there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.dra import slices
from agent.kube.client import as_dict
from crds import dra
from crds.naming import configuration_resource_name, instance_name, instance_resource_name
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.dra import ResourceClaimResource
from tests.harness.dra_faults import ADMISSION_ERROR, claim_owner
from tests.harness.kube_waits import WaitTimedOut, wait_service_account, wait_until
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import Broker, start_agent
from tests.harness.realnode_brokers import node as node  # the module fixture
from tests.harness.realnode_brokers import plane as plane  # the module fixture
from tests.harness.realnode_images import BUSYBOX_IMAGE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
log = logging.getLogger(__name__)

#: Configuration → (capacity, device descriptions).
CONFIGURATIONS = {"one": (1, ("a0",)), "two": (2, ("b0", "b1"))}
#: Pods alive at once: five hold the five slots, three wait.
LIVE = 8
#: The fault of each turn, in order (None: a quiet turn).
FAULTS = ("agent", "kubelet", "agent", "controller", "kubelet", None) * 4
#: How often the node's runtime is read.
POLL_S = 0.3
#: Generous: a loaded 2-core machine, a kubelet restart's backoffs; never a pass/fail timing.
SETTLE_S = 180.0
SETUP_S = 120.0
WATCH_RETRY_S = 0.5
CONTAINER = "c"
ENV = "DEBUG_ECHO_DESCRIPTION"
REGISTERED = "DRA plugin registered with the kubelet"


@dataclass(frozen=True)
class Want:
    """How a pod asks: ``limits`` (an extended resource) or ``claim`` (a template), and the
    descriptions of the devices that would do."""

    how: str
    what: str
    accepts: frozenset[str]


def _wants(node: str) -> list[Want]:
    """Every way of asking, in the order the churn cycles through them."""
    def inst(cfg: str, desc: str) -> str:
        return instance_name(cfg, desc, shared=False, node=node)

    return [
        Want("limits", configuration_resource_name("two", None), frozenset({"b0", "b1"})),
        Want("limits", instance_resource_name(inst("one", "a0")), frozenset({"a0"})),
        Want("claim", "two-any", frozenset({"b0", "b1"})),
        Want("limits", instance_resource_name(inst("two", "b0")), frozenset({"b0"})),
        Want("claim", "one-a0", frozenset({"a0"})),
        Want("limits", configuration_resource_name("one", None), frozenset({"a0"})),
        Want("claim", "two-b1", frozenset({"b1"})),
        Want("limits", instance_resource_name(inst("two", "b1")), frozenset({"b1"})),
    ]


def _templates(ns: str, node: str) -> list[dict[str, Any]]:
    def selector(cfg: str, desc: str) -> str:
        return dra.instance_selector(instance_name(cfg, desc, shared=False, node=node))

    return [h.claim_template("two-any", dra.device_class_name(ns, "two")),
            h.claim_template("one-a0", dra.device_class_name(ns, "one"), selector("one", "a0")),
            h.claim_template("two-b1", dra.device_class_name(ns, "two"), selector("two", "b1"))]


def _pod(ns: str, name: str, want: Want) -> Pod:
    """A busybox pod that prints its env and waits; ends at once on SIGTERM."""
    script = "env | sort; trap 'exit 0' TERM; sleep 3600 & wait"
    container: dict[str, Any] = {"name": CONTAINER, "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never", "command": ["sh", "-c", script]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 5, "containers": [container]}
    if want.how == "limits":
        container["resources"] = {"limits": {want.what: "1"}}
    else:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": want.what}]
        container["resources"] = {"claims": [{"name": "dev"}]}
    return cast(Pod, Pod.from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": name, "namespace": ns}, "spec": spec}))


@dataclass(frozen=True)
class Running:
    """One running container of the namespace, as the runtime has it."""

    pod: str
    uid: str
    device: str  # its DEBUG_ECHO_DESCRIPTION, "" for none


@dataclass
class Judge:
    """The node's running containers and the namespace's pods, checked on every change."""

    node: RealNode
    kube: AsyncClient
    namespace: str
    capacities: Mapping[str, int]
    wants: dict[str, Want] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Container id → what it is (read once from the runtime).
    known: dict[str, Running | None] = field(default_factory=dict)
    #: The last reading: container id → what runs.
    running: dict[str, Running] = field(default_factory=dict)
    #: Pods ever seen running with their device.
    ran: set[str] = field(default_factory=set)
    #: Pods refused at admission (by uid: a name is never reused here).
    admission_errors: set[str] = field(default_factory=set)
    #: Most containers seen on each device at once.
    most: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: Bindings seen (the scheduler put a pod on the node).
    bindings: int = 0
    readings: int = 0
    relists: int = 0
    _suspects: set[str] = field(default_factory=set)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Judge:
        self._tasks = [asyncio.create_task(self._watch_pods(), name="pods"),
                       asyncio.create_task(self._read_runtime(), name="runtime")]
        await self.wait_for(lambda: self.readings > 0, what="the first reading", within=60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_for(self, predicate: Callable[[], bool], *, what: str,
                       within: float) -> None:
        """Return once ``predicate()`` holds after some change; fail naming ``what`` after
        ``within`` seconds, or at once when an invariant is broken."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: bool(self.violations) or predicate()),
                    within)
            except TimeoutError:
                raise AssertionError(f"timed out after {within:.0f} s waiting for {what}; "
                                     f"{self.describe()}") from None
            if self.violations:
                raise AssertionError(f"while waiting for {what}: {self.violations}; "
                                     f"{self.describe()}")

    def flag(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)
            log.error("invariant broken: %s", message)

    # -- what the test reads -----------------------------------------------------------------

    def holders(self) -> dict[str, set[str]]:
        """Device → the pods running with it, in the last reading."""
        found: dict[str, set[str]] = defaultdict(set)
        for what in self.running.values():
            if what.device:
                found[what.device].add(what.pod)
        return found

    def holding(self) -> dict[str, str]:
        """Pod → the device its running container has."""
        return {r.pod: r.device for r in self.running.values() if r.device}

    def waiting(self, name: str) -> bool:
        body = self.pods.get(name) or {}
        status = body.get("status") or {}
        return bool(body) and not body["spec"].get("nodeName") and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in status.get("conditions") or [])

    def settled(self) -> bool:
        """No pod being deleted; every pod running with a device or waiting Unschedulable; no
        waiting pod that a device with a free slot would fit."""
        holding = self.holding()
        holders = self.holders()
        free = {d for d, cap in self.capacities.items() if len(holders.get(d, ())) < cap}
        for name, body in self.pods.items():
            if body["metadata"].get("deletionTimestamp"):
                return False
            if name in holding:
                continue
            if not self.waiting(name) or self.wants[name].accepts & free:
                return False
        return True

    def describe(self) -> str:
        holding = self.holding()
        parts = []
        for name, body in sorted(self.pods.items()):
            status = body.get("status") or {}
            state = (f"holds {holding[name]}" if name in holding else
                     "waiting" if self.waiting(name) else
                     f"{status.get('phase')} node={body['spec'].get('nodeName') or '-'}"
                     f"{' deleting' if body['metadata'].get('deletionTimestamp') else ''}")
            want = self.wants.get(name)
            accepts = ",".join(sorted(want.accepts)) if want else "?"
            parts.append(f"{name}[{accepts}]: {state}")
        return "pods: " + "; ".join(parts)

    # -- the runtime -------------------------------------------------------------------------

    async def _ctr(self, *args: str) -> str:
        return await asyncio.to_thread(self.node.ctr, *args)

    async def _identify(self, container: str) -> Running | None:
        """What a container is: a pod's container of this namespace, and its device; None for
        anything else (a sandbox, another namespace's). RuntimeError if ``ctr`` fails (the
        container gone since the listing)."""
        info = json.loads(await self._ctr("containers", "info", container))
        labels = info.get("Labels") or {}
        if (labels.get("io.kubernetes.pod.namespace") != self.namespace
                or labels.get("io.kubernetes.container.name") != CONTAINER):
            return None
        env = dict(e.split("=", 1) for e in (info.get("Spec") or {}).get("process", {}).get(
            "env") or [] if "=" in e)
        return Running(labels.get("io.kubernetes.pod.name", ""),
                       labels.get("io.kubernetes.pod.uid", ""), env.get(ENV, ""))

    async def _read_runtime(self) -> None:
        while True:
            try:
                listing = await self._ctr("tasks", "ls")
            except RuntimeError as error:
                log.info("ctr tasks ls: %s", error)
                await asyncio.sleep(POLL_S)
                continue
            ids = [line.split()[0] for line in listing.splitlines()[1:]
                   if len(line.split()) >= 3 and line.split()[2] == "RUNNING"]
            for container in ids:
                if container not in self.known:
                    with contextlib.suppress(RuntimeError):  # not answered: the next reading
                        self.known[container] = await self._identify(container)
            async with self._changed:
                self.running = {c: r for c in ids if (r := self.known.get(c)) is not None}
                self.readings += 1
                self._check_containers()
                self._changed.notify_all()
            await asyncio.sleep(POLL_S)

    def _check_containers(self) -> None:
        suspects = set()
        for device, pods in self.holders().items():
            self.most[device] = max(self.most[device], len(pods))
            if len(pods) > self.capacities.get(device, 0):
                suspects.add(f"device {device} of capacity {self.capacities.get(device)} in "
                             f"{len(pods)} running containers at once: {sorted(pods)}")
        for key in suspects & self._suspects:  # two readings in a row: it was so
            self.flag(key)
        self._suspects = suspects
        for what in self.running.values():
            want = self.wants.get(what.pod)
            if not what.device:
                self.flag(f"pod {what.pod}'s container runs without a device")
            elif want is not None and what.device not in want.accepts:
                self.flag(f"pod {what.pod} asked for {sorted(want.accepts)} and its container "
                          f"has {what.device}")
            else:
                self.ran.add(what.pod)

    # -- the pods ----------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        while True:
            try:
                listing = self.kube.list(Pod, namespace=self.namespace)
                current = {}
                async for obj in listing:
                    body = as_dict(obj)
                    current[body["metadata"]["name"]] = body
                async with self._changed:
                    for name in set(self.pods) - set(current):
                        del self.pods[name]
                    for body in current.values():
                        self._on_pod("MODIFIED", body)
                    self._changed.notify_all()
                async for kind, obj in self.kube.watch(Pod, namespace=self.namespace,
                                                       resource_version=listing.resourceVersion):
                    async with self._changed:
                        self._on_pod(kind, as_dict(obj))
                        self._changed.notify_all()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure: list and watch again
                self.relists += 1
                log.info("pod watch: %r; listing again", error)
            await asyncio.sleep(WATCH_RETRY_S)

    def _on_pod(self, kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
            return
        before = self.pods.get(name)
        if body["spec"].get("nodeName") and not (before and before["spec"].get("nodeName")):
            self.bindings += 1
        self.pods[name] = body
        status = body.get("status") or {}
        if status.get("reason") == ADMISSION_ERROR:
            self.admission_errors.add(body["metadata"]["uid"])
            self.flag(f"pod {name} refused at admission: {status.get('message')}")
        elif status.get("phase") == "Failed" and not body["metadata"].get("deletionTimestamp"):
            self.flag(f"pod {name} Failed: {status.get('reason')} {status.get('message')}")


async def _claims_agree(judge: Judge, devices: Mapping[str, str]) -> None:
    """Every holder's claim is allocated the device its container has; no device is given to
    more claims than its capacity. ``devices``: description → device name in the slice."""
    by_device = {v: k for k, v in devices.items()}
    allocated: dict[str, list[str]] = defaultdict(list)  # description → claims' pods
    owners: dict[str, set[str]] = defaultdict(set)  # pod → descriptions its claims have
    pod_claims: dict[str, str] = {}  # claim name → pod, from the pods' statuses
    for name, body in judge.pods.items():
        status = body.get("status") or {}
        for entry in status.get("resourceClaimStatuses") or []:
            pod_claims[entry.get("resourceClaimName", "")] = name
        extended = status.get("extendedResourceClaimStatus") or {}
        if extended.get("resourceClaimName"):
            pod_claims[extended["resourceClaimName"]] = name
    async for obj in judge.kube.list(ResourceClaimResource, namespace=judge.namespace):
        claim = as_dict(obj)
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != dra.DRIVER or result.get("device") not in by_device:
                continue
            desc = by_device[result["device"]]
            pod = pod_claims.get(claim["metadata"]["name"]) or claim_owner(claim)
            allocated[desc].append(pod or claim["metadata"]["name"])
            owners[pod].add(desc)
    # Judge the containers by a reading of the runtime begun after that listing: a container
    # still running then had its claim allocated at the listing (a claim is deallocated only
    # once its pod's containers ended).
    listed = judge.readings
    await judge.wait_for(lambda: judge.readings > listed + 1, what="a reading of the runtime",
                         within=SETTLE_S)
    for desc, pods in allocated.items():
        if len(pods) > judge.capacities[desc]:
            judge.flag(f"device {desc} of capacity {judge.capacities[desc]} allocated to "
                       f"{len(pods)} claims: {sorted(pods)}")
    for pod, desc in judge.holding().items():
        if owners.get(pod) != {desc}:
            judge.flag(f"pod {pod}'s container has {desc}, its claims "
                       f"{sorted(owners.get(pod, ()))}")


@dataclass
class Churn:
    """``LIVE`` pods; each turn the oldest holder goes and a new pod comes."""

    judge: Judge
    wants: list[Want]
    made: int = 0
    #: Pods in order of creation (deleted ones included).
    order: list[str] = field(default_factory=list)
    _cycle: itertools.cycle[Want] = field(init=False)

    def __post_init__(self) -> None:
        self._cycle = itertools.cycle(self.wants)

    async def add(self) -> str:
        want = next(self._cycle)
        name = f"p{self.made}-{want.how}"
        self.made += 1
        self.judge.wants[name] = want
        self.order.append(name)
        await self.judge.kube.create(_pod(self.judge.namespace, name, want))
        # What follows is judged by the watch: it must have seen this pod first.
        await self.judge.wait_for(lambda: name in self.judge.pods, what=f"{name} seen",
                                  within=SETTLE_S)
        return name

    async def delete(self, name: str) -> None:
        """Delete ``name`` as a user does (its grace period); return once the watch saw it
        deleting or gone."""
        with contextlib.suppress(ApiError):
            await self.judge.kube.delete(Pod, name, namespace=self.judge.namespace)

        def seen() -> bool:
            body = self.judge.pods.get(name)
            return body is None or bool(body["metadata"].get("deletionTimestamp"))

        await self.judge.wait_for(seen, what=f"{name} seen deleting", within=SETTLE_S)

    def oldest_holder(self) -> str:
        holding = self.judge.holding()
        found = [p for p in self.order if p in holding]
        assert found, f"no pod holds a device; {self.judge.describe()}"
        return found[0]


@dataclass
class Faults:
    """The faults a turn can strike with, and how often each struck."""

    node: RealNode
    plane: ControlPlane
    namespace: str
    agent_log: str
    controller: ControllerProcess
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: Faults that struck while a pod was bound and its container not running yet.
    mid_start: int = 0
    durations: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def start_agent(self) -> None:
        start_agent(self.node, self.plane, Broker(self.namespace, "", "", self.agent_log),
                    extra_env={"DRA": "on"})

    async def strike(self, fault: str, judge: Judge) -> None:
        holding = judge.holding()
        if any(body["spec"].get("nodeName") and name not in holding
               and not body["metadata"].get("deletionTimestamp")
               for name, body in judge.pods.items()):
            self.mid_start += 1
        began = time.monotonic()
        if fault == "agent":  # a crash, and the DaemonSet's restart
            self.node.kill_process(self.agent_log)
            self.start_agent()
        elif fault == "kubelet":  # containers run on; back once Ready and serving plugins
            await asyncio.to_thread(self.node.restart_kubelet)
        elif fault == "controller":
            self.controller.kill()
            self.controller.start()
        else:
            raise ValueError(fault)
        self.counts[fault] += 1
        self.durations[fault].append(time.monotonic() - began)


async def _setup(judge: Judge, plane: ControlPlane, node: RealNode, agent_log: str,
                 devices: Mapping[str, str]) -> None:
    """Both Configurations served the scheduler's way only: allocator dra, the DRA plugin
    registered, every device in the node's pools, each Configuration's name mapped, no device
    plugin's."""
    ns, kube = judge.namespace, judge.kube

    def chosen() -> bool:
        for cfg in CONFIGURATIONS:
            out = plane.kubectl("get", "configuration", cfg, "-n", ns, "-o", "json").stdout
            if (json.loads(out).get("status") or {}).get("allocator") != "dra":
                return False
        return True

    async def ready() -> bool:
        if not chosen() or REGISTERED not in node.log_tail(agent_log, 2000):
            return False
        published: dict[str, Any] = {}
        for cfg in CONFIGURATIONS:
            published.update(h.pool_devices(await h.pool_slices(
                kube, slices.local_pool(ns, cfg, node.node_name))))
        if set(devices.values()) - set(published):
            return False
        classes = json.loads(plane.kubectl("get", "deviceclasses", "-o", "json").stdout)
        mapped = {c["spec"].get("extendedResourceName") for c in classes["items"]}
        # An Instance's own name is mapped once a pod asks for it (the churn's pods do).
        wanted = {configuration_resource_name(cfg, None) for cfg in CONFIGURATIONS}
        return wanted <= mapped

    try:
        await wait_until(ready, what="both Configurations served through DRA", within=SETUP_S)
    except WaitTimedOut as error:
        raise AssertionError(f"{error}\n{node.log_tail(agent_log, 30)}") from None
    assert _advertised(plane, node) == set(), "a device plugin advertises the devices"


def _advertised(plane: ControlPlane, node: RealNode) -> set[str]:
    body = json.loads(plane.kubectl("get", "node", node.node_name, "-o", "json").stdout)
    return {r for r in body["status"].get("allocatable", {}) if r.startswith("edgeplug.io/")}


@contextlib.asynccontextmanager
async def _served(plane: ControlPlane, node: RealNode, tmp_path: Path
                  ) -> AsyncIterator[tuple[str, AsyncClient, Faults]]:
    """A namespace, the agent beside the kubelet (``DRA=on``), the controller (``--dra``);
    all stopped and removed after, logs printed."""
    ns = f"drl-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    controller = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                                   extra_args=(*FAST_ARGS, "--dra"))
    faults = Faults(node, plane, ns, f"agent-{ns}", controller)
    try:
        await wait_service_account(kube, ns)
        faults.start_agent()
        controller.start()
        yield ns, kube, faults
    finally:
        controller.stop()
        node.stop_process(faults.agent_log)
        print(f"--- agent log ---\n{node.log_tail(faults.agent_log, 40)}")
        print(f"--- controller log ---\n{controller.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        with contextlib.suppress(Exception):
            await h.delete_slices(kube, node.node_name)
        await kube.close()


async def test_local_devices_through_dra_hold_no_slot_twice_through_faults(
    load: str, plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    started = time.monotonic()
    capacities = {desc: cap for cap, descs in CONFIGURATIONS.values() for desc in descs}
    async with _served(plane, node, tmp_path) as (ns, kube, faults):
        devices = {desc: slices.device_name(instance_name(cfg, desc, shared=False,
                                                          node=node.node_name))
                   for cfg, (_, descs) in CONFIGURATIONS.items() for desc in descs}
        for cfg, (cap, descs) in CONFIGURATIONS.items():
            h.apply(plane, ns, debug_echo_configuration(cfg, descriptions=list(descs),
                                                        shared=False, capacity=cap))
        h.apply(plane, ns, *_templates(ns, node.node_name))
        async with Judge(node, kube, ns, capacities) as judge:
            try:
                await _setup(judge, plane, node, faults.agent_log, devices)
                churn = Churn(judge, _wants(node.node_name))
                for _ in range(LIVE):
                    await churn.add()
                await judge.wait_for(judge.settled, what="the first pods settled",
                                     within=SETTLE_S)
                for turn, fault in enumerate(FAULTS, 1):
                    await _claims_agree(judge, devices)
                    assert _advertised(plane, node) == set(), "a device plugin advertises"
                    bindings = judge.bindings
                    await churn.delete(churn.oldest_holder())
                    await churn.add()
                    if fault is not None:
                        # The moment the scheduler binds a pod (its claim not prepared yet),
                        # or the turn settled without one.
                        await judge.wait_for(
                            lambda b=bindings: judge.bindings > b or judge.settled(),  # type: ignore[misc]
                            what=f"turn {turn}: a binding", within=SETTLE_S)
                        await faults.strike(fault, judge)
                    await judge.wait_for(judge.settled, what=f"turn {turn} ({fault}) settled",
                                         within=SETTLE_S)
                # The end: pods deleted one by one (the holders) until none is left.
                while judge.pods:
                    await _claims_agree(judge, devices)
                    await churn.delete(churn.oldest_holder())
                    await judge.wait_for(judge.settled, what="the drain settled",
                                         within=SETTLE_S)
            except AssertionError as error:
                raise AssertionError(f"{error}\nviolations: {judge.violations}\n"
                                     f"{await h.describe(kube, ns)}") from None
            never = [p for p in churn.order if p not in judge.ran]
            print(f"figure: {load}: {len(FAULTS)} turns, {churn.made} pods, faults "
                  f"{dict(faults.counts)} (agent SIGKILL+start, kubelet stop+start "
                  f"{[round(d, 1) for d in faults.durations['kubelet']]} s, controller "
                  f"SIGKILL+start), {faults.mid_start} of them while a bound pod's container was "
                  f"not running yet; most containers on a device at once {dict(judge.most)} "
                  f"(capacities {capacities}); slots held twice "
                  f"{sum('running containers at once' in v for v in judge.violations)}, "
                  f"admission errors {len(judge.admission_errors)}, pods never run "
                  f"{len(never)}; {judge.readings} runtime readings, {judge.relists} pod "
                  f"relists; {time.monotonic() - started:.0f} s")
            assert not judge.violations, "invariants broken:\n" + "\n".join(judge.violations)
            assert not never, f"pods that never ran: {never}"
            assert judge.ran, "no pod ran"
            assert dict(judge.most) == capacities, "not every slot was used"
            assert sum(faults.counts.values()) == sum(f is not None for f in FAULTS)
