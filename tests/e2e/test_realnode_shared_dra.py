"""On a real node, the default for shared devices: the scheduler allocates them (DRA), and
unchanged Akri-style pods and brokers get them by resource name.

The agent runs beside the kubelet with ``DRA=on`` and its device plugins on; the controller
with ``--dra``. A Configuration of a shared debugEcho device (capacity 3) that does not choose
an allocator gets the cluster's best: the controller finds that the API server keeps a
DeviceClass's ``extendedResourceName`` and says ``dra`` in the Configuration's status, so the
agent advertises no device plugin for the device (the Node's allocatable has no
``edgeplug.io/...`` for it, and nothing is ever ``Allocate``d), the broker asking for
``edgeplug.io/<instance>`` through ``{{PLACEHOLDER}}`` gets it from the per-Instance class, and
an Akri-style Deployment asking for ``edgeplug.io/<configuration>: 1`` gets it from the
Configuration's class. What each container got is read from inside it. A pod beyond the
capacity stays Pending (the scheduler finds no slot) and is never refused at admission; once
a slot frees it runs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.kube.client import as_dict
from crds import dra
from crds.naming import configuration_resource_name, instance_name, instance_resource_name
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until, wait_service_account
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    Broker,
    akri_style_deployment,
    allocates,
    app_pods,
    broker_log,
    broker_spec,
    is_running,
    is_unschedulable,
    logged_env,
    node,
    plane,
    refusal,
    running_container,
    start_agent,
)

__all__ = ["node", "plane"]  # the module fixtures

pytestmark = pytest.mark.timeout(1500)
CAPACITY = 3


async def _first_release(kube: AsyncClient, namespace: str, device: str,
                         into: list[float]) -> None:
    """Note the moment the first claim allocated ``device`` is deleted or deallocated."""
    holding: set[str] = set()
    async for op, claim in kube.watch(h.ResourceClaimResource, namespace=namespace):
        body = as_dict(claim)
        name = body["metadata"]["name"]
        allocation = (body.get("status") or {}).get("allocation") or {}
        on_device = any(r.get("device") == device
                        for r in (allocation.get("devices") or {}).get("results") or [])
        if on_device and op != "DELETED" and not body["metadata"].get("deletionTimestamp"):
            holding.add(name)
        elif name in holding:
            into.append(time.monotonic())
            return


async def test_shared_devices_go_through_the_scheduler_by_default_on_the_real_node(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    ns = f"shd-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    cam = instance_name("cams", "cam", shared=True, node=node.node_name)
    broker = Broker(ns, cam, f"{cam}-{node.node_name}-pod", f"agent-{ns}")
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, broker, extra_env={"DRA": "on"})
        ctl.start()
        cfg = debug_echo_configuration("cams", descriptions=["cam"], shared=True)
        cfg["spec"]["capacity"] = CAPACITY
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
        started = time.monotonic()
        h.apply(plane, ns, cfg)

        def chosen() -> list[str] | None:
            out = plane.kubectl("get", "configuration", "cams", "-n", ns, "-o", "wide",
                                "--no-headers").stdout.split()
            return out if "dra" in out else None

        await until(chosen, what="kubectl get configurations -o wide showing dra", within=30)
        status = json.loads(plane.kubectl("get", "configuration", "cams", "-n", ns, "-o",
                                          "json").stdout)["status"]
        (condition,) = [c for c in status["conditions"]
                        if c["type"] == "Allocator"]
        assert (condition["status"], condition["reason"]) == ("True", "ServedByScheduler")

        await running_container(plane, broker)
        print(f"figure: Configuration applied -> broker Running through the scheduler on the "
              f"real node {time.monotonic() - started:.1f} s")
        env = logged_env(await broker_log(plane, broker))
        assert env["DEBUG_ECHO_DESCRIPTION"] == "cam", "the broker's env from the claim's spec"
        node_obj = json.loads(plane.kubectl("get", "node", node.node_name, "-o",
                                            "json").stdout)
        advertised = {r for r in node_obj["status"].get("allocatable", {})
                      if r.startswith("edgeplug.io/")}
        assert advertised.isdisjoint({instance_resource_name(cam),
                                      configuration_resource_name("cams", None)}), (
            f"a device plugin advertises the shared device: {advertised}")

        h.apply(plane, ns, akri_style_deployment("akri-style", "edgeplug.io/cams", CAPACITY - 1))

        async def deployment_running() -> list[dict[str, Any]] | None:
            pods = app_pods(plane, ns, "akri-style")
            refused = [(p["metadata"]["name"], refusal(p)) for p in pods if refusal(p)]
            assert not refused, f"refused at admission: {refused}"
            return pods if len(pods) == CAPACITY - 1 and all(map(is_running, pods)) else None

        pods = await eventually(deployment_running, what="both Deployment pods Running",
                                deadline=120)
        for found in pods:
            out = plane.kubectl("logs", "-n", ns, found["metadata"]["name"]).stdout
            assert logged_env(out)["DEBUG_ECHO_DESCRIPTION"] == "cam"
            claim = found["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
            body = json.loads(plane.kubectl("get", "resourceclaim", claim, "-n", ns, "-o",
                                            "json").stdout)
            (result,) = body["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["device"]) == (dra.DRIVER, cam)

        # A fourth pod: the device's three slots are taken (broker + two), so it waits.
        h.apply(plane, ns, akri_style_deployment("one-too-many", "edgeplug.io/cams", 1))

        async def waiting() -> dict[str, Any] | None:
            (extra,) = app_pods(plane, ns, "one-too-many") or [{}]
            assert not refusal(extra), f"refused at admission: {refusal(extra)}"
            return extra if is_unschedulable(extra) else None

        await eventually(waiting, what="the fourth pod Pending, unschedulable", deadline=60)
        assert allocates(node, broker) == 0, "no device-plugin Allocate for anything"

        freed: list[float] = []
        watcher = asyncio.create_task(_first_release(kube, ns, cam, freed))
        scaled = time.monotonic()
        plane.kubectl("scale", "deployment", "akri-style", "-n", ns, "--replicas",
                      str(CAPACITY - 2))

        async def took_the_slot() -> bool:
            (extra,) = app_pods(plane, ns, "one-too-many")
            assert not refusal(extra), f"refused at admission: {refusal(extra)}"
            return is_running(extra)

        await eventually(took_the_slot, what="the waiting pod Running once a slot freed",
                         deadline=120)
        running = time.monotonic()
        watcher.cancel()
        assert freed, "the scaled-away pod's claim was released"
        print(f"figure: replica scaled away -> its claim gone {freed[0] - scaled:.1f} s, "
              f"claim gone -> the waiting pod Running on the real node "
              f"{running - freed[0]:.1f} s")
    finally:
        ctl.stop()
        node.stop_process(broker.agent_log)
        print(f"--- agent log ---\n{node.log_tail(broker.agent_log, 30)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await h.delete_slices(kube, node.node_name)
        await h.delete_controller_slices(kube, ns)
        await kube.close()
