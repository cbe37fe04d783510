"""Rejections made by the kubelet's own device manager end without a human.

The companion of test_controller_admission.py, where the test writes the kubelet's rejection
itself: here nothing stands in for it. One node runs the kubelet's real device manager and pod
admission (``DeviceNode``, tests/harness/devicenode.py) with the agent's device plugins, and the
real controller runs as a process. A user's pod holds the Instance's one slot; pods bound
straight to the node (``nodeName``: the scheduler, which would keep them Pending, is not asked)
are then rejected by the device manager with ``UnexpectedAdmissionError``, as happens when the
scheduler acted on an allocatable count the node had already given away. The user's rejected
pod is reported on the Instance; the broker is recreated at once, again and again, and runs as
soon as the slot is free, with nobody deleting anything but the user's own pod.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Event, Pod

from controller.brokers.plans import ADMISSION_IMMEDIATE_MAX
from crds.naming import instance_resource_name
from tests.harness.agent_nodes import StartNode, create_instance, node_device
from tests.harness.controller_process import (
    FAST_ARGS,
    ControllerProcess,
    apply,
    broker_pod_spec,
    configuration,
    unique,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import (
    in_phase,
    running,
    until,
    wait_allocatable,
    wait_pod,
    wait_until,
)
from tests.integration.test_controller_admission import metric

pytestmark = pytest.mark.timeout(240)

#: The device manager's text when no device is left (pkg/kubelet/cm/devicemanager).
UNAVAILABLE = "requested number of devices unavailable for {resource}. Requested: 1, Available: 0"


@pytest.fixture
def controller_args(metrics_port: int) -> tuple[str, ...]:
    # The fast restart backoff (0.5 s doubling to 2 s) applies after the rejections in a row
    # that are recreated at once: the broker keeps being tried while the slot is held.
    return (*FAST_ARGS, "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1")


def bound_pod(namespace: str, name: str, node: str, resource: str) -> Pod:
    return cast(Pod, Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{
            "name": "app", "image": "registry.invalid/app:1",
            "resources": {"limits": {resource: "1"}}}]}}))


async def warnings_on(kube: AsyncClient, namespace: str, kind: str, name: str,
                      reason: str) -> list[str]:
    """Messages of the Warning Events with ``reason`` about the object ``kind``/``name``."""
    return [e.message or "" async for e in kube.list(Event, namespace=namespace)
            if e.involvedObject.kind == kind and e.involvedObject.name == name
            and e.reason == reason and e.type == "Warning"]


async def phase_of(kube: AsyncClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod's phase and reason; None while it does not exist (between two incarnations)."""
    try:
        pod = await kube.get(Pod, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise
    status = pod.status
    return {"phase": status.phase if status else None, "reason": status.reason if status else None}


async def test_device_manager_rejections_end_without_a_human(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, start_node: StartNode,
    controller: ControllerProcess, metrics_port: int,
) -> None:
    ns = pod_namespace
    node = await start_node()
    cfg = unique("cam")
    apply(control_plane, configuration(ns, cfg))  # no broker spec yet
    inst = await create_instance(kube, ns, configuration=cfg, digest="c0ffee",
                                 nodes=[node.name], capacity=1)
    await node.table.put(node_device(ns, cfg, inst))
    resource = instance_resource_name(inst)
    await wait_allocatable(kube, node.name, resource, "1")

    # A pod of the user's takes the one slot; a second one finds none and is rejected.
    await kube.create(bound_pod(ns, "holder", node.name, resource))
    await wait_pod(kube, ns, "holder", running, "Running")
    await kube.create(bound_pod(ns, "late", node.name, resource))
    late = await wait_pod(kube, ns, "late", lambda p: in_phase(p, "Failed"), "rejected")
    assert late.status is not None
    assert late.status.reason == "UnexpectedAdmissionError"
    [reported] = await until_async(
        lambda: warnings_on(kube, ns, "Instance", inst, "AdmissionFailed"),
        what="the AdmissionFailed Event on the Instance for the user's rejected pod",
    )
    assert f"pod {ns}/late " in reported
    assert UNAVAILABLE.format(resource=resource) in reported

    # Brokers bound straight to the node: rejected while the user's pod holds the slot.
    apply(control_plane, configuration(
        ns, cfg, pod_spec={**broker_pod_spec(), "nodeName": node.name}))
    broker = f"{inst}-{node.name}-pod"
    # Recreated at once ADMISSION_IMMEDIATE_MAX times, then after the restart backoff: one
    # more rejection shows both, each counted.
    enough = ADMISSION_IMMEDIATE_MAX + 1
    await until(lambda: metric(metrics_port, "edgeplug_broker_admission_failures_total",
                               namespace=ns, configuration=cfg) >= enough,
                what=f"{enough} rejections of the broker by the device manager, counted")
    rejections = await until_async(
        lambda: _at_least(enough, warnings_on(kube, ns, "Instance", inst,
                                              "BrokerAdmissionFailed")),
        what=f"{enough} BrokerAdmissionFailed Events on the Instance",
    )
    assert all(f"broker pod {broker} " in m for m in rejections)
    assert all(UNAVAILABLE.format(resource=resource) in m for m in rejections)
    assert any(m.endswith("recreating it at once") for m in rejections)
    assert any("recreating it after a backoff" in m for m in rejections)

    # The user's pod goes; the broker runs on a later try, nobody touching it.
    await kube.delete(Pod, "holder", namespace=ns)
    await until_async(
        lambda: _running(kube, ns, broker), what=f"broker {broker} Running once the slot is free"
    )
    counted = metric(metrics_port, "edgeplug_broker_admission_failures_total", namespace=ns,
                     configuration=cfg)
    print(f"broker rejected {counted:.0f} times before it ran")


async def _at_least(count: int, found: Awaitable[list[str]]) -> list[str]:
    got = await found
    return got if len(got) >= count else []


async def _running(kube: AsyncClient, namespace: str, name: str) -> bool:
    found = await phase_of(kube, namespace, name)
    return found is not None and found["phase"] == "Running"


async def until_async(look: Any, *, what: str) -> Any:
    """``kube_waits.until`` for a check that must be awaited."""
    latest: list[Any] = [None]

    async def probe() -> bool:
        latest[0] = await look()
        return bool(latest[0])

    await wait_until(probe, what=what)
    return latest[0]
