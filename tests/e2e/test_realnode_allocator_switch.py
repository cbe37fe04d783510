"""On a real node, a Configuration's allocator switched while its slots are held:
``spec.allocator`` from the DRA default to ``devicePlugin`` and back.

The agent runs beside the kubelet with ``DRA=on`` and its device plugins on; the controller with
``--dra``. One shared debugEcho device of capacity 2. Pods (busybox printing its env, then
sleeping) ask for ``edgeplug.io/<configuration>: 1``: under DRA the scheduler makes each a
claim and the kubelet's DRA plugin call puts the device's env in the container through CDI;
under ``devicePlugin`` the kubelet asks the agent's plugin (``Allocate``). At every step the
test reads what each running container got (``DEBUG_ECHO_DESCRIPTION`` in its printed env) and
asserts that no more containers have the device than its capacity, that no pod was refused at
admission, and that a pod running before a switch runs on in the same container after it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.types import PatchType

from crds.naming import instance_name
from crds.resources import ConfigurationResource
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until, wait_service_account
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    END_MARK,
    ENV_MARK,
    Broker,
    logged_env,
    node,
    plane,
    start_agent,
)
from tests.harness.realnode_images import BUSYBOX_IMAGE

__all__ = ["node", "plane"]  # the module fixtures

pytestmark = pytest.mark.timeout(1200)
CAPACITY = 2
CONFIGURATION = "sw"
DESCRIPTION = "sw0"
RESOURCE = f"edgeplug.io/{CONFIGURATION}"
#: Generous: the scheduler's backoff and a loaded machine; none of these is a timing.
WITHIN_S = 120.0


def _pod(name: str) -> dict[str, Any]:
    script = f"echo {ENV_MARK}; env | sort; echo {END_MARK}; exec sleep 3600"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script], "resources": {"limits": {RESOURCE: "1"}},
            }],
        },
    }


class Pods:
    """The test's pods as the API server shows them, and what their containers got."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        #: Pod name -> the container id it ran in when first seen Running.
        self.containers: dict[str, str] = {}
        #: Every breach seen (kept, not raised: a wait retries on AssertionError).
        self.breaches: list[str] = []

    def all(self) -> dict[str, dict[str, Any]]:
        out = self.plane.kubectl("get", "pods", "-n", self.namespace, "-o", "json").stdout
        return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}

    def with_the_device(self) -> set[str]:
        """Running pods whose container printed the device's env: what they got."""
        holders = set()
        for name, found in self.all().items():
            status = found.get("status") or {}
            # Failed while being deleted is its container killed (busybox ignores SIGTERM).
            if status.get("phase") == "Failed" and "deletionTimestamp" not in found["metadata"]:
                self.breaches.append(f"{name} refused: {status.get('reason')} "
                                     f"{status.get('message')}")
            (container,) = status.get("containerStatuses") or [{}]
            if "running" not in (container.get("state") or {}):
                continue
            first = self.containers.setdefault(name, container["containerID"])
            if container["containerID"] != first or container.get("restartCount", 0):
                self.breaches.append(f"{name} runs in a new container")
            out = self.plane.kubectl("logs", "-n", self.namespace, name, check=False).stdout
            if END_MARK in out and logged_env(out).get("DEBUG_ECHO_DESCRIPTION") == DESCRIPTION:
                holders.add(name)
        if len(holders) > CAPACITY:
            self.breaches.append(f"{sorted(holders)} hold a device of capacity {CAPACITY}")
        assert not self.breaches, self.breaches
        return holders

    def pending(self, name: str) -> bool:
        status = self.all()[name].get("status") or {}
        return status.get("phase") == "Pending" and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in status.get("conditions") or [])

    async def holders_become(self, expected: set[str], what: str) -> None:
        try:
            await eventually(lambda: _async(self.with_the_device() == expected or None),
                             what=what, deadline=WITHIN_S)
        finally:
            assert not self.breaches, self.breaches


async def _async(value: bool | None) -> bool | None:
    return value


async def test_switching_the_allocator_while_slots_are_held_gives_no_slot_twice(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    ns = f"sw-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    device = instance_name(CONFIGURATION, DESCRIPTION, shared=True, node=node.node_name)
    agent = Broker(ns, device, "", f"agent-{ns}")
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    pods = Pods(plane, ns)

    async def allocator(expected: str) -> None:
        def said() -> bool | None:
            body = json.loads(plane.kubectl("get", "configuration", CONFIGURATION, "-n", ns,
                                            "-o", "json").stdout)
            return (body.get("status") or {}).get("allocator") == expected or None

        await until(said, what=f"the Configuration served by {expected}", within=WITHIN_S)

    async def pin(value: str) -> None:
        await kube.patch(ConfigurationResource, CONFIGURATION,
                         {"spec": {"allocator": value}}, namespace=ns,
                         patch_type=PatchType.MERGE)
        await allocator(value)

    def create(*names: str) -> None:
        for name in names:
            h.apply(plane, ns, _pod(name))

    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, agent, extra_env={"DRA": "on"})
        ctl.start()
        cfg = debug_echo_configuration(CONFIGURATION, descriptions=[DESCRIPTION], shared=True,
                                       capacity=CAPACITY)
        h.apply(plane, ns, cfg)
        await allocator("dra")

        # The DRA default: one pod holds a slot through its claim.
        create("d1")
        await pods.holders_become({"d1"}, "d1 Running with the device (its claim)")

        # To device plugins while d1 holds its claim: the plugin offers the one slot left.
        await pin("devicePlugin")
        # One after the other: created together, either may be the one the slot goes to.
        create("p1")
        await pods.holders_become({"d1", "p1"}, "p1 Running through the device plugin")
        create("p2")
        await eventually(lambda: _async(pods.pending("p2") or None),
                         what="p2 Pending, no slot left", deadline=WITHIN_S)

        # Back to DRA while p1 holds its slot through the plugin: nothing new fits.
        await pin("dra")
        await eventually(lambda: _async(pods.pending("p2") or None),
                         what="p2 still Pending under DRA", deadline=WITHIN_S)
        await pods.holders_become({"d1", "p1"}, "d1 and p1 running on")

        # d1's claim goes: p2 gets that slot through the scheduler.
        plane.kubectl("delete", "pod", "d1", "-n", ns, "--wait=false")
        await pods.holders_become({"p1", "p2"}, "p2 Running with d1's slot")
        # p1's device-plugin slot goes (the orphan freer): a new pod gets it through DRA.
        plane.kubectl("delete", "pod", "p1", "-n", ns, "--wait=false")
        create("d2")
        await pods.holders_become({"p2", "d2"}, "d2 Running with p1's slot")
    finally:
        ctl.stop()
        node.stop_process(agent.agent_log)
        print(f"--- agent log ---\n{node.log_tail(agent.agent_log, 40)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await h.delete_slices(kube, node.node_name)
        await kube.close()
