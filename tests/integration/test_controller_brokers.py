"""Broker pods, jobs and services follow Instances (real control plane + controller process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    broker_pods,
    configuration,
    configuration_path,
    get,
    install_peering_crds,
    instance,
    items,
    patch,
    unique,
    wait_until,
)
from tests.harness.controlplane import ControlPlane


@pytest.fixture(scope="session")
def peering(control_plane: ControlPlane) -> ControlPlane:
    install_peering_crds(control_plane)
    return control_plane


@pytest.fixture
def controller(
    peering: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[ControllerProcess]:
    process = ControllerProcess(peering, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    process.start()
    yield process
    process.stop()
    print(f"--- controller log ---\n{process.log_tail(60)}")


def pods_by_name(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in broker_pods(plane, namespace)}


def services(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        s["metadata"]["name"]: s
        for s in items(plane, f"/api/v1/namespaces/{namespace}/services")
    }


def test_instance_gets_pinned_owned_brokers_and_services(
    control_plane: ControlPlane, namespace: str, controller: ControllerProcess
) -> None:
    cfg = unique("cam")
    inst = f"{cfg}-a1b2c3"
    apply(control_plane, configuration(
        namespace, cfg, pod_spec=broker_pod_spec(), instance_service=True,
        configuration_service=True,
    ))
    apply(control_plane, instance(namespace, inst, configuration_name=cfg, nodes=["n-1", "n-2"]))
    pods = wait_until(
        lambda: (p := pods_by_name(control_plane, namespace)) and len(p) == 2 and p,
        what="two broker pods, one per node",
    )
    uid = get(control_plane, f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances/{inst}")
    assert uid is not None
    for node in ("n-1", "n-2"):
        pod = pods[f"{inst}-{node}-pod"]
        labels = pod["metadata"]["labels"]
        assert labels["edgeplug.io/instance"] == inst
        assert labels["edgeplug.io/configuration"] == cfg
        assert labels["edgeplug.io/target-node"] == node
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "Instance", uid["metadata"]["uid"], True,
        )
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {f"edgeplug.io/{inst}": "1"}
    svcs = wait_until(
        lambda: (s := services(control_plane, namespace)) and len(s) == 2 and s,
        what="instance and configuration services",
    )
    assert svcs[f"{inst}-svc"]["spec"]["selector"] == {
        "edgeplug.io/instance": inst, "app.kubernetes.io/component": "broker"}
    assert svcs[f"{cfg}-svc"]["spec"]["selector"] == {
        "edgeplug.io/configuration": cfg, "app.kubernetes.io/component": "broker"}

    status = wait_until(
        lambda: ((get(control_plane, configuration_path(namespace, cfg)) or {}).get("status")
                 or {}).get("brokers") == {"desired": 2, "ready": 0}
        and get(control_plane, configuration_path(namespace, cfg)),
        what="status with 2 desired brokers",
    )
    assert status["status"]["instanceCount"] == 1
    conditions = {c["type"]: c for c in status["status"]["conditions"]}
    assert conditions["BrokersReady"]["status"] == "False"
    assert conditions["BrokersReady"]["message"] == "0/2 brokers ready"

    # The device leaves node n-2: its broker goes, the other stays.
    patch(control_plane, "instances.edgeplug.io", namespace, inst, {"spec": {"nodes": ["n-1"]}})
    wait_until(
        lambda: set(pods_by_name(control_plane, namespace)) == {f"{inst}-n-1-pod"},
        what="only the n-1 broker left",
    )

    # The device goes offline: Instance deleted → broker and both services gone.
    control_plane.kubectl("delete", "instances.edgeplug.io", inst, "-n", namespace)
    wait_until(lambda: not pods_by_name(control_plane, namespace), what="no broker pod left")
    wait_until(lambda: not services(control_plane, namespace), what="no service left")
