"""Killed and restarted, or replaced by its standby, the controller converges without ever
making a duplicate or leaving an orphan broker."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.harness.controller_process import (
    API,
    ControllerProcess,
    apply,
    broker_pod_spec,
    broker_pods,
    configuration,
    install_peering_crds,
    instance,
    items,
    patch,
    unique,
    wait_until,
)
from tests.harness.controlplane import ControlPlane


@pytest.fixture
def plane(control_plane: ControlPlane) -> ControlPlane:
    install_peering_crds(control_plane)
    return control_plane


def brokers(plane: ControlPlane, namespace: str) -> set[tuple[str, str]]:
    """(instance, node) of every live broker pod; fails on a duplicate."""
    pods = [p for p in broker_pods(plane, namespace) if not p["metadata"].get("deletionTimestamp")]
    keys = [
        (p["metadata"]["labels"]["edgeplug.io/instance"],
         p["metadata"]["labels"]["edgeplug.io/target-node"])
        for p in pods
    ]
    duplicates = [key for key, count in Counter(keys).items() if count > 1]
    assert not duplicates, f"duplicate brokers: {duplicates}"
    return set(keys)


def wanted(plane: ControlPlane, namespace: str) -> set[tuple[str, str]]:
    """(instance, node) for every node of every Instance: what the brokers must be."""
    return {
        (i["metadata"]["name"], node)
        for i in items(plane, f"{API}/namespaces/{namespace}/instances")
        for node in i["spec"].get("nodes") or []
    }


def converged(plane: ControlPlane, namespace: str) -> Any:
    have, want = brokers(plane, namespace), wanted(plane, namespace)
    return have == want and have


def test_killed_controller_restarts_and_converges(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    ctl = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log").start()
    try:
        cfg = unique("cam")
        a, b, c = (f"{cfg}-{x * 6}" for x in "abc")
        apply(plane, configuration(namespace, cfg, pod_spec=broker_pod_spec()))
        apply(plane, instance(namespace, a, configuration_name=cfg, nodes=["n-1", "n-2"]))
        apply(plane, instance(namespace, b, configuration_name=cfg, nodes=["n-1"]))
        wait_until(lambda: brokers(plane, namespace) == {(a, "n-1"), (a, "n-2"), (b, "n-1")},
                   what="three brokers")

        ctl.kill()
        # While no controller runs, devices come and go.
        plane.kubectl("delete", "instances.edgeplug.io", a, "-n", namespace)
        apply(plane, instance(namespace, c, configuration_name=cfg, nodes=["n-1"]))
        patch(plane, "instances.edgeplug.io", namespace, b, {"spec": {"nodes": ["n-2"]}})

        ctl.start()
        result = wait_until(lambda: converged(plane, namespace),
                            what="brokers matching the Instances after the restart")
        assert result == {(b, "n-2"), (c, "n-1")}
        # And it stays so: no late duplicate or orphan (sampled over a few resyncs).
        for _ in range(20):
            assert brokers(plane, namespace) <= {(b, "n-2"), (c, "n-1")}
    finally:
        ctl.stop()
        print(f"--- controller log ---\n{ctl.log_tail(40)}")


def peer_priorities(plane: ControlPlane, namespace: str) -> set[int]:
    obj = plane.get_json(
        f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/edgeplug-controller"
    )
    peers: dict[str, Any] = dict((obj or {}).get("status") or {})  # type: ignore[call-overload]
    return {int(p.get("priority", 0)) for p in peers.values()}


def test_standby_takes_over_when_the_active_replica_dies(
    plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    active = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "active.log",
                               priority=200).start()
    # A replica works until it sees a higher-priority peer, so the standby starts once the
    # active one is in the peering object (a real Deployment's replicas just settle).
    wait_until(lambda: 200 in peer_priorities(plane, namespace), what="the active replica peered")
    standby = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "standby.log",
                                priority=100).start()
    wait_until(lambda: 100 in peer_priorities(plane, namespace), what="the standby peered")
    try:
        cfg = unique("cam")
        x, y = f"{cfg}-xxxxxx", f"{cfg}-yyyyyy"
        apply(plane, configuration(namespace, cfg, pod_spec=broker_pod_spec()))
        apply(plane, instance(namespace, x, configuration_name=cfg, nodes=["n-1"]))
        wait_until(lambda: brokers(plane, namespace) == {(x, "n-1")}, what="the first broker")
        wait_until(lambda: f"created Pod {namespace}/{x}" in active.log_path.read_text(),
                   what="the active replica (higher priority) to have created it")
        assert "created Pod" not in standby.log_path.read_text(), "the standby stays paused"

        # x's broker without its owner reference: the garbage collector cannot remove it, so
        # only a controller that acts on x's deletion does.
        [x_broker] = [p["metadata"]["name"] for p in broker_pods(plane, namespace)]
        plane.kubectl("patch", "pod", x_broker, "-n", namespace, "--type=json",
                      "-p", '[{"op": "remove", "path": "/metadata/ownerReferences"}]')

        active.kill()
        # In the gap: a device comes, and x's goes (the standby sees it, but is not active).
        apply(plane, instance(namespace, y, configuration_name=cfg, nodes=["n-1", "n-2"]))
        plane.kubectl("delete", "instances.edgeplug.io", x, "-n", namespace)
        wait_until(lambda: brokers(plane, namespace) == {(y, "n-1"), (y, "n-2")},
                   what="the standby to take over: y's brokers created, x's deleted", deadline=40)
        assert f"created Pod {namespace}/{y}" in standby.log_path.read_text()
    finally:
        active.stop()
        standby.stop()
        print(f"--- standby log ---\n{standby.log_tail(30)}")
