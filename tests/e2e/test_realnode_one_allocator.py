"""On the real node: a local device has one allocator, the scheduler.

The agent runs beside the kubelet with ``DRA=on`` and the controller with ``--dra``, as the DRA
default runs them; the API server (v1.37.2) maps extended resources, so the controller says
``allocator: dra`` for a Configuration that does not choose. One local debugEcho device of
capacity 1 (``shared: false``). It is in the node's ResourceSlice pool, both its names
(``edgeplug.io/<configuration>``, ``edgeplug.io/<instance>``) are mapped by DeviceClasses, and
no device plugin advertises it.

Each round creates two pods together that want the one device in the two ways a user asks
for it: one asks for ``edgeplug.io/<instance>: 1`` in ``resources.limits`` (the scheduler makes
its claim, ``status.extendedResourceClaimStatus``), the other names a ResourceClaimTemplate of
the Configuration's DeviceClass selecting the device (``crds.dra.instance_selector``). Both go
through the scheduler, so one runs and the other stays Pending (``Unschedulable``, no
``nodeName``) until the first is deleted; then it runs with the device, and is deleted in
turn. A device offered both ways at once (its plugin to the kubelet and its slice to the
scheduler) could be handed out twice, once by each.

What each container got is read from inside it: ``kubectl logs`` of a busybox printing its env
(``DEBUG_ECHO_DESCRIPTION``, from the claim's CDI spec). At every look the test counts the
containers running with the device and the pods bound and not finished; over all rounds: no
two at once, no pod Failed or refused at admission, nothing ``Allocate``d, and no
``edgeplug.io/`` resource in the Node's allocatable. It prints the figures (the time from
deleting the running pod to the waiting one running with the device).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.dra import slices
from agent.kube.client import as_dict
from crds import dra
from crds.naming import instance_name, instance_resource_name
from tests.e2e.test_realnode_akri_dra import advertised, allocations, allocator, dra_default
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import WaitTimedOut, until
from tests.harness.kube_waits import wait_until as harness_wait
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import END_MARK, ENV_MARK, logged_env
from tests.harness.realnode_images import BUSYBOX_IMAGE

pytestmark = pytest.mark.timeout(1500)
#: The issue's acceptance number.
ROUNDS = 20
CONFIGURATION, DESCRIPTION = "solo", "solo0"
TEMPLATE = "solo-device"
#: Generous: a loaded 2-core machine; never a pass/fail timing.
WITHIN_S = 120.0
REGISTERED = "DRA plugin registered with the kubelet"
#: The two pods of a round: asking by the Instance's resource name, and through a claim.
BY_NAME, BY_CLAIM = "by-name", "by-claim"


def _pod(name: str, *, resource: str | None = None, template: str | None = None
         ) -> dict[str, Any]:
    """A busybox pod printing its env, asking for ``resource: 1`` in its limits or for a
    claim from ``template``."""
    script = f"echo {ENV_MARK}; env | sort; echo {END_MARK}; exec sleep 3600"
    container: dict[str, Any] = {"name": "c", "image": BUSYBOX_IMAGE,
                                 "imagePullPolicy": "Never", "command": ["sh", "-c", script]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if resource is not None:
        container["resources"] = {"limits": {resource: "1"}}
    if template is not None:
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "dev"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass
class Look:
    """One list of the namespace's pods: what each is doing."""

    pods: dict[str, dict[str, Any]]
    #: Pods whose running container printed the device's env (what they got).
    holders: set[str]
    #: Pods bound to the node and not finished (their claim is allocated, or was).
    bound: set[str]

    def waiting(self, name: str) -> bool:
        """``name`` is Pending, unbound, and the scheduler said it found no place for it."""
        found = self.pods.get(name) or {}
        status = found.get("status") or {}
        return (status.get("phase") == "Pending" and not found["spec"].get("nodeName")
                and any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                        for c in status.get("conditions") or []))


@dataclass
class Watcher:
    """Looks at the pods, and keeps every breach seen (a wait goes on; the test asserts after
    all rounds)."""

    plane: ControlPlane
    kube: AsyncClient
    namespace: str
    round: int = 0
    #: Container id -> the description its env printed ("" for none).
    printed: dict[str, str] = field(default_factory=dict)
    #: Rounds in which two containers held the device at once / two pods were bound at once.
    both_held: set[int] = field(default_factory=set)
    both_bound: set[int] = field(default_factory=set)
    #: Pods seen Failed before the test deleted them, or refused at admission.
    failed: dict[str, str] = field(default_factory=dict)

    def _description(self, name: str, container: str) -> str | None:
        """The description the container printed; None until it printed its env."""
        if container not in self.printed:
            out = self.plane.kubectl("logs", "-n", self.namespace, name, check=False).stdout
            if END_MARK not in out:
                return None
            self.printed[container] = logged_env(out).get("DEBUG_ECHO_DESCRIPTION", "")
        return self.printed[container]

    async def look(self) -> Look:
        pods = {}
        async for obj in self.kube.list(Pod, namespace=self.namespace):
            body = as_dict(obj)
            pods[body["metadata"]["name"]] = body
        holders, bound = set(), set()
        for name, found in pods.items():
            status = found.get("status") or {}
            phase, reason = status.get("phase"), status.get("reason")
            # Failed while being deleted is its container killed (busybox ignores SIGTERM).
            if (phase == "Failed" and "deletionTimestamp" not in found["metadata"]) \
                    or reason == "UnexpectedAdmissionError":
                self.failed[f"{name} (round {self.round})"] = f"{reason}: {status.get('message')}"
            if found["spec"].get("nodeName") and phase not in ("Failed", "Succeeded"):
                bound.add(name)
            for container in status.get("containerStatuses") or []:
                if "running" in (container.get("state") or {}) and container.get("containerID") \
                        and self._description(name, container["containerID"]) == DESCRIPTION:
                    holders.add(name)
        if len(holders) > 1:
            self.both_held.add(self.round)
        if len(bound) > 1:
            self.both_bound.add(self.round)
        return Look(pods, holders, bound)

    async def until(self, settled: Callable[[Look], bool], what: str) -> Look:
        """Look until ``settled(look)`` is true; that look."""
        seen: list[Look] = []

        async def check() -> bool:
            seen.append(await self.look())
            return bool(settled(seen[-1]))

        try:
            await harness_wait(check, what=f"round {self.round}: {what}", within=WITHIN_S)
        except WaitTimedOut as timed_out:
            last = seen[-1] if seen else None
            raise AssertionError(
                f"{timed_out}\nlast look: holders {last and last.holders}, bound "
                f"{last and last.bound}\n{await h.describe(self.kube, self.namespace)}"
            ) from None
        return seen[-1]


async def _allocated(kube: AsyncClient, ns: str, pod: str, device: str) -> None:
    """The pod's claim (the scheduler's, or its template's) was allocated ``device``; a pod
    asking by resource name carries ``extendedResourceClaimStatus``."""
    got = await h.pod_claim(kube, ns, pod)
    assert got is not None, f"{pod}: bound with its claim allocated"
    assert [(r["driver"], r["device"]) for r in got.results] == [(dra.DRIVER, device)]
    status = as_dict(await kube.get(Pod, pod, namespace=ns))["status"]
    assert ("extendedResourceClaimStatus" in status) == (pod.startswith(BY_NAME)), status


async def _the_dra_default(plane: ControlPlane, node: RealNode, kube: AsyncClient, ns: str,
                           device: str, agent_log: str) -> None:
    """The device offered the scheduler's way only: allocator dra, the agent's DRA plugin
    registered, the device in the node's pool, its Configuration's name mapped, no device
    plugin's."""
    await until(lambda: allocator(plane, ns, CONFIGURATION) == "dra",
                what="status.allocator: dra", within=WITHIN_S)
    await until(lambda: REGISTERED in node.log_tail(agent_log, 1000),
                what="the agent's DRA plugin registered with the kubelet", within=60)
    pool = slices.local_pool(ns, CONFIGURATION, node.node_name)

    async def published() -> bool:
        return device in h.pool_devices(await h.pool_slices(kube, pool))

    await harness_wait(published, what=f"{device} in the node's pool {pool}", within=WITHIN_S)
    name = dra.device_class_name(ns, CONFIGURATION)
    await until(functools.partial(_maps, plane, name, f"edgeplug.io/{CONFIGURATION}"),
                what=f"{name} mapping edgeplug.io/{CONFIGURATION}", within=WITHIN_S)
    # The Instance's own name is mapped once a pod asks for it (the rounds' pods do).
    assert not _maps(plane, dra.instance_class_name(ns, device), instance_resource_name(device))
    assert advertised(plane, node) == set(), "no device plugin advertises the device"


def _maps(plane: ControlPlane, name: str, resource: str) -> bool:
    """The DeviceClass ``name`` exists and maps the extended resource ``resource``."""
    out = plane.kubectl("get", "deviceclass", name, "-o", "json", check=False).stdout
    return bool(out) and json.loads(out)["spec"].get("extendedResourceName") == resource


async def _round(watcher: Watcher, device: str) -> tuple[str, float]:
    """One round: both pods created together, one runs and the other waits; the running one
    deleted, the waiting one runs with the device; it is deleted too. Returns how the first
    pod asked (``BY_NAME`` or ``BY_CLAIM``) and the time from its deletion to the other
    running with the device."""
    plane, kube, ns, number = watcher.plane, watcher.kube, watcher.namespace, watcher.round
    names = {BY_NAME: f"{BY_NAME}-{number}", BY_CLAIM: f"{BY_CLAIM}-{number}"}
    pods = [_pod(names[BY_NAME], resource=instance_resource_name(device)),
            _pod(names[BY_CLAIM], template=TEMPLATE)]
    h.apply(plane, ns, *(pods if number % 2 else reversed(pods)))  # created together

    def one_runs(look: Look) -> bool:
        return len(look.holders) == 1 and all(
            n in look.holders or look.waiting(n) for n in names.values())

    settled = await watcher.until(one_runs, "one pod Running with the device, the other "
                                  "Pending (Unschedulable, no nodeName)")
    (holder,) = settled.holders
    (waiter,) = set(names.values()) - {holder}
    await _allocated(kube, ns, holder, device)

    plane.kubectl("delete", "pod", holder, "-n", ns, "--wait=false")
    deleted = time.monotonic()
    await watcher.until(lambda look: look.holders == {waiter},
                        f"{waiter} Running with the device once {holder} went")
    handover = time.monotonic() - deleted
    await _allocated(kube, ns, waiter, device)

    plane.kubectl("delete", "pod", waiter, "-n", ns, "--wait=false")
    await watcher.until(lambda look: not look.pods, "both pods gone")
    return holder.rpartition("-")[0], handover


async def test_a_local_device_has_one_allocator_on_the_real_node(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    device = instance_name(CONFIGURATION, DESCRIPTION, shared=False, node=node.node_name)
    first_ran: dict[str, int] = {BY_NAME: 0, BY_CLAIM: 0}
    handovers: list[float] = []
    started = time.monotonic()
    async with dra_default(plane, node, tmp_path) as (ns, agent_log, kube):
        # One local device of capacity 1; the allocator is left to the controller.
        h.apply(plane, ns, debug_echo_configuration(CONFIGURATION, descriptions=[DESCRIPTION],
                                                    shared=False, capacity=1),
                h.claim_template(TEMPLATE, dra.device_class_name(ns, CONFIGURATION),
                                 dra.instance_selector(device)))
        await _the_dra_default(plane, node, kube, ns, device, agent_log)

        watcher = Watcher(plane, kube, ns)
        for number in range(1, ROUNDS + 1):
            watcher.round = number
            first, handover = await _round(watcher, device)
            first_ran[first] += 1
            handovers.append(handover)

        print(f"figure: {ROUNDS} rounds on a local device of capacity 1 (a pod by "
              f"edgeplug.io/<instance> and a pod by claim, created together) in "
              f"{time.monotonic() - started:.0f} s; the first to run: by name "
              f"{first_ran[BY_NAME]}, by claim {first_ran[BY_CLAIM]}; rounds with two "
              f"containers holding the device {len(watcher.both_held)}, with two pods bound "
              f"{len(watcher.both_bound)}; pods Failed {len(watcher.failed)}")
        print(f"figure: running pod deleted -> the waiting pod Running with the device: median "
              f"{statistics.median(handovers):.2f} s, min {min(handovers):.2f} s, max "
              f"{max(handovers):.2f} s (n={len(handovers)})")
        assert not watcher.both_held, \
            f"two containers held the device: rounds {sorted(watcher.both_held)}"
        assert not watcher.both_bound, \
            f"two pods bound at once: rounds {sorted(watcher.both_bound)}"
        assert not watcher.failed, f"pods failed: {watcher.failed}"
        assert len(handovers) == ROUNDS
        for resource in (instance_resource_name(device), f"edgeplug.io/{CONFIGURATION}"):
            assert allocations(node, agent_log, resource) == 0, \
                f"no device plugin allocated {resource}"
        assert advertised(plane, node) == set(), "no device plugin advertises the device"
        assert _maps(plane, dra.instance_class_name(ns, device), instance_resource_name(device)), \
            "the by-name pods' resource mapped once they asked"
