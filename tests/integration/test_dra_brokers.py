"""Brokers through ResourceClaims (``spec.brokerDeviceAccess: dra``), and what
``kubectl get instances`` says about DRA, on the real control plane.

The controller runs as its own process with ``--dra``; agents publish ResourceSlices in-process
(``tests.harness.dra``); the real kube-controller-manager makes each broker's claim from the
Instance's ResourceClaimTemplate and the real kube-scheduler allocates it. The nodes have no
kubelet: a broker is bound once its claim is allocated (what the kubelet's DRA manager does
next is ``test_dra_kubelet_plugin`` and the real node's ``test_realnode_dra``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kube.client import as_dict
from controller import naming
from crds import dra
from crds.naming import instance_name, instance_resource_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kubelet_node import NodeReporter

#: The scheduler retries an unschedulable pod after a backoff; allocation can take a while on
#: the shared 2-core machine.
SCHEDULE_DEADLINE = 60.0


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*FAST_ARGS, "--dra")


def _broker_configuration(name: str, nodes: int) -> dict[str, Any]:
    cfg = harness.debug_echo_configuration(name, descriptions=["cam"], capacity=nodes)
    cfg["spec"]["brokerDeviceAccess"] = "dra"
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "broker", "image": "registry.example.test/broker:1",
                        "resources": {"limits": {"{{PLACEHOLDER}}": "1"}}}]}}
    return cfg


async def _claim_of(kube: AsyncClient, ns: str, pod: str) -> dict[str, Any] | None:
    """The broker pod's claim (made by the controller-manager) once it is allocated."""
    try:
        body = as_dict(await kube.get(Pod, pod, namespace=ns))
    except ApiError:
        return None
    statuses = (body.get("status") or {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName") or not body["spec"].get(
            "nodeName"):
        return None
    claim = as_dict(await kube.get(h.ResourceClaimResource, statuses[0]["resourceClaimName"],
                                   namespace=ns))
    if not (claim.get("status") or {}).get("allocation"):
        return None
    return {"pod": body, "claim": claim}


def _instance_row(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    """The Instance's row of ``kubectl get instances -o wide``, by column header (cut where
    the headers start: a cell may be empty)."""
    lines = cp.kubectl("get", "instances", "-n", ns, "-o", "wide").stdout.splitlines()
    if not lines:
        raise AssertionError("no Instances yet")
    starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    header = [lines[0][a:b].strip() for a, b in bounds]
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in bounds]
        if cells[0] == name:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"no row for {name}: {lines}")


async def test_dra_brokers_get_the_shared_device_through_claims_owned_by_them(
    controller: ControllerProcess, control_plane: ControlPlane, pod_namespace: str,
    kube: AsyncClient,
) -> None:
    ns = pod_namespace
    node_a, node_b = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    name = instance_name("brk", "cam", shared=True, node=node_a)
    async with (h.ready_nodes(kube, [node_a, node_b]),
                h.dra_agents(control_plane, [node_a, node_b], ns)):
        harness.apply(control_plane, ns, _broker_configuration("brk", nodes=2))
        # One broker per node that sees the camera; capacity 2: both claims get the one device.
        held: dict[str, dict[str, Any]] = {}
        for node in (node_a, node_b):
            pod = naming.broker_pod_name(name, node)
            held[node] = await harness.eventually(
                functools.partial(_claim_of, kube, ns, pod), deadline=SCHEDULE_DEADLINE,
                what=f"broker {pod} bound with its claim allocated")
        for node, found in held.items():
            pod, claim = found["pod"], found["claim"]
            assert pod["spec"]["nodeName"] == node
            assert pod["spec"]["resourceClaims"] == [
                {"name": dra.BROKER_CLAIM, "resourceClaimTemplateName": name}]
            limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
            assert instance_resource_name(name) not in limits, "no extended resource"
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["device"]) == (dra.DRIVER, name)
            (owner,) = claim["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"], owner["controller"]) == (
                "Pod", pod["metadata"]["uid"], True)
            assert claim["metadata"]["labels"][naming.LABEL_INSTANCE] == name

        # kubectl get instances: two claims hold it, served by DRA (no device plugin here).
        async def shown() -> dict[str, str] | None:
            row = _instance_row(control_plane, ns, name)
            return row if (row["CLAIMS"], row["SERVED"]) == ("2", "dra") else None

        await harness.eventually(shown, what="CLAIMS 2 and SERVED dra", deadline=30.0)

        # The claim goes with its broker; the broker made again gets a claim of its own.
        old = held[node_a]
        old_claim = old["claim"]["metadata"]["name"]
        control_plane.kubectl("delete", "pod", old["pod"]["metadata"]["name"], "-n", ns,
                              "--grace-period=0", "--force")

        async def claim_gone() -> bool:
            try:
                await kube.get(h.ResourceClaimResource, old_claim, namespace=ns)
            except ApiError as error:
                return error.status.code == 404
            return False

        await harness.eventually(claim_gone, what=f"claim {old_claim} deleted with its broker")
        pod = naming.broker_pod_name(name, node_a)

        async def new_claim() -> dict[str, Any] | None:
            found = await _claim_of(kube, ns, pod)
            return found if found and found["pod"]["metadata"]["uid"] != old["pod"][
                "metadata"]["uid"] else None

        again = await harness.eventually(new_claim, deadline=SCHEDULE_DEADLINE,
                                         what=f"broker {pod} again, with a new claim")
        assert again["claim"]["metadata"]["name"] != old_claim


async def test_instances_show_how_they_are_served_and_how_many_claims_hold_them(
    controller: ControllerProcess, control_plane: ControlPlane, pod_namespace: str,
    kube: AsyncClient,
) -> None:
    """A node whose kubelet advertises the Instance's resource (the device plugin's count, as
    a kubelet reports it) and a ResourceSlice for the same device: ``both``; without the
    slice, ``device-plugin``. A claim made by a user's template counts like a broker's."""
    ns = pod_namespace
    node = harness.new_node(control_plane)
    name = instance_name("both", "cam", shared=False, node=node)
    advertised: dict[str, int] = {}
    reporter = NodeReporter(client=kube, node_name=node, labels={},
                            device_counts=lambda: dict(advertised))
    await reporter.start()
    try:
        harness.apply(control_plane, ns, harness.debug_echo_configuration(
            "both", descriptions=["cam"], shared=False))
        async with h.dra_agents(control_plane, [node], ns) as agents:
            async def shown(column: str, value: str) -> bool:
                return _instance_row(control_plane, ns, name)[column] == value

            await harness.eventually(lambda: shown("SERVED", "dra"), what="SERVED dra",
                                     deadline=30.0)
            advertised[instance_resource_name(name)] = 1
            reporter.poke()
            await harness.eventually(lambda: shown("SERVED", "both"), what="SERVED both",
                                     deadline=30.0)
            await harness.eventually(lambda: h.device_class(kube, ns, "both"), what="class")
            cel = dra.instance_selector(name)
            h.apply(control_plane, ns, h.claim_template("mine", dra.device_class_name(
                ns, "both"), cel), h.claim_pod("user", "mine"))
            await harness.eventually(lambda: h.pod_claim(kube, ns, "user"),
                                     what="user's pod bound", deadline=SCHEDULE_DEADLINE)
            await harness.eventually(lambda: shown("CLAIMS", "1"), what="CLAIMS 1",
                                     deadline=30.0)
            # DRA off on this node (its publisher stopped, its slices gone): device plugin only.
            agents[node].task.cancel()
            await asyncio.gather(agents[node].task, return_exceptions=True)
            await h.delete_slices(kube, node)
            await harness.eventually(lambda: shown("SERVED", "device-plugin"),
                                     what="SERVED device-plugin", deadline=30.0)
    finally:
        await reporter.stop(delete_node=True)


async def test_a_dra_broker_configuration_without_device_classes_says_why(
    control_plane: ControlPlane, pod_namespace: str, peering: ControlPlane, tmp_path: Path,
) -> None:
    """The controller without ``--dra`` keeps no DeviceClass, so a claim could never be
    allocated: the Configuration's status names the flag, and no broker is made."""
    ns = pod_namespace
    process = ControllerProcess(peering, namespaces=[ns], log_path=tmp_path / "ctl.log")
    process.start()
    try:
        harness.apply(control_plane, ns, _broker_configuration("nodra", nodes=1))

        async def condition() -> dict[str, Any] | None:
            body = json.loads(control_plane.kubectl(
                "get", "configuration", "nodra", "-n", ns, "-o", "json").stdout)
            for cond in (body.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "BrokerSpecValid" and cond.get("status") == "False":
                    return dict(cond)
            return None

        cond = await harness.eventually(condition, what="BrokerSpecValid=False",
                                        deadline=30.0)
        assert "--dra" in cond["message"]
    finally:
        process.stop()
