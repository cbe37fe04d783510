"""A node deleted, or NotReady past its grace, leaves every Instance and frees its slots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

NOT_READY_GRACE_S = 2


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*h.FAST_ARGS, "--node-not-ready-grace", str(NOT_READY_GRACE_S))


@pytest.fixture
def make_node(control_plane: ControlPlane) -> Iterator[Any]:
    made: list[str] = []

    def make(*, ready: bool) -> str:
        name = h.unique("node")
        control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"status": {"conditions": [{
            "type": "Ready", "status": "True" if ready else "False",
            "reason": "Test", "message": "set by the test",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}}
        control_plane.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                              "-p", json.dumps(status))
        made.append(name)
        return name

    yield make
    for name in made:
        control_plane.kubectl("delete", "node", name, "--wait=false", check=False)


def spec_of(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    obj = h.get(plane, h.instance_path(namespace, name))
    return dict(obj["spec"]) if obj else None


def test_deleted_node_leaves_instances_and_frees_its_slots(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess, make_node: Any
) -> None:
    gone, stays = make_node(ready=True), make_node(ready=True)
    cfg = h.unique("cam")
    shared, local = f"{cfg}-111111", f"{cfg}-222222"
    h.apply(control_plane,
            h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec(), capacity=3))
    h.apply(control_plane, h.instance(
        namespace, shared, configuration_name=cfg, nodes=[gone, stays], capacity=3,
        device_usage={f"{shared}-0": gone, f"{shared}-1": f"C:vid0:{gone}",
                      f"{shared}-2": stays},
    ))
    h.apply(control_plane, h.instance(namespace, local, configuration_name=cfg, nodes=[gone],
                                      shared=False))
    h.wait_until(lambda: len(h.broker_pods(control_plane, namespace)) == 3, what="three brokers")

    control_plane.kubectl("delete", "node", gone)

    spec = h.wait_until(
        lambda: (s := spec_of(control_plane, namespace, shared)) and s["nodes"] == [stays] and s,
        what=f"node {gone} removed from the shared Instance",
    )
    assert spec["deviceUsage"] == {
        f"{shared}-0": "", f"{shared}-1": "", f"{shared}-2": stays,
    }, "the gone node's slots are free, the other node's claim is untouched"
    h.wait_until(lambda: spec_of(control_plane, namespace, local) is None,
                 what="the local Instance seen only by the gone node deleted")
    h.wait_until(
        lambda: {p["metadata"]["labels"]["edgeplug.io/target-node"]
                 for p in h.broker_pods(control_plane, namespace)} == {stays},
        what="only the surviving node's broker left",
    )


def test_node_not_ready_past_grace_is_removed(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess, make_node: Any
) -> None:
    sick, healthy = make_node(ready=False), make_node(ready=True)
    cfg = h.unique("cam")
    inst = f"{cfg}-333333"
    h.apply(control_plane,
            h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec(), capacity=2))
    h.apply(control_plane, h.instance(
        namespace, inst, configuration_name=cfg, nodes=[sick, healthy], capacity=2,
        device_usage={f"{inst}-0": sick, f"{inst}-1": healthy},
    ))
    spec = h.wait_until(
        lambda: (s := spec_of(control_plane, namespace, inst)) and s["nodes"] == [healthy] and s,
        what=f"NotReady node {sick} removed after {NOT_READY_GRACE_S}s",
        deadline=20,
    )
    assert spec["deviceUsage"] == {f"{inst}-0": "", f"{inst}-1": healthy}
