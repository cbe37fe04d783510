"""A broker that failed or finished is recreated with backoff; one Pending too long too."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

PENDING_GRACE_S = 3


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*h.FAST_ARGS, "--pending-grace", str(PENDING_GRACE_S))


def the_pod(plane: ControlPlane, namespace: str) -> dict[str, Any] | None:
    pods = [p for p in h.broker_pods(plane, namespace)
            if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if len(pods) == 1 else None


def fail(plane: ControlPlane, namespace: str, pod: str, *, phase: str) -> None:
    """What a kubelet reports when the broker's container exits."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"status": {"phase": phase, "containerStatuses": [{
        "name": "broker", "image": "registry.example/broker:1", "imageID": "", "ready": False,
        "restartCount": 0,
        "state": {"terminated": {"exitCode": 1 if phase == "Failed" else 0,
                                 "startedAt": now, "finishedAt": now}},
    }]}}
    plane.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                  "--type=merge", "-p", json.dumps(status))


def events(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return h.items(plane, f"/api/v1/namespaces/{namespace}/events")


@pytest.mark.parametrize(("phase", "reason"), [("Failed", "failed"), ("Succeeded", "succeeded")])
def test_failed_or_finished_broker_is_recreated(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess, phase: str,
    reason: str,
) -> None:
    cfg = h.unique("cam")
    # The real scheduler would bind it; keep it unbound so the test alone reports its status.
    spec = {**h.broker_pod_spec(), "schedulerName": "nobody"}
    h.apply(control_plane, h.configuration(namespace, cfg, pod_spec=spec))
    h.apply(control_plane, h.instance(namespace, f"{cfg}-aaaaaa", configuration_name=cfg,
                                      nodes=["n-1"]))
    first = h.wait_until(lambda: the_pod(control_plane, namespace), what="the broker")
    fail(control_plane, namespace, first["metadata"]["name"], phase=phase)
    second = h.wait_until(
        lambda: (p := the_pod(control_plane, namespace))
        and p["metadata"]["uid"] != first["metadata"]["uid"] and p,
        what=f"the {phase} broker recreated",
    )
    assert second["metadata"]["name"] == first["metadata"]["name"]
    assert (second.get("status") or {}).get("phase") == "Pending"
    h.wait_until(
        lambda: any(e["reason"] == "PodDeleted" and f"broker {reason}" in e["message"]
                    for e in events(control_plane, namespace)),
        what=f"an Event saying the broker {reason} and is recreated",
    )


def test_broker_pending_past_grace_is_recreated(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("cam")
    h.apply(control_plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec()))
    h.apply(control_plane, h.instance(namespace, f"{cfg}-bbbbbb", configuration_name=cfg,
                                      nodes=["n-1"]))
    first = h.wait_until(lambda: the_pod(control_plane, namespace), what="the broker")
    second = h.wait_until(
        lambda: (p := the_pod(control_plane, namespace))
        and p["metadata"]["uid"] != first["metadata"]["uid"] and p,
        what=f"the broker recreated after {PENDING_GRACE_S}s Pending",
    )
    assert second["metadata"]["name"] == first["metadata"]["name"]
    warning = h.wait_until(
        lambda: [e for e in events(control_plane, namespace)
                 if e["reason"] == "PodDeleted" and "Pending" in e["message"]],
        what="a Warning Event about the Pending broker",
    )
    assert warning[0]["type"] == "Warning"
