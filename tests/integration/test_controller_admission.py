"""Pods the kubelet rejected at admission: brokers recreated at once and counted,
users' pods reported once in an Event on the Instance or Configuration they asked for.

Real API server, scheduler and controller-manager, and the real controller as a process. No
kubelet runs here: the test stands in for the scheduler's binding (a Binding, as kube-scheduler
posts) and for the kubelet's status write when it rejects a pod (``Kubelet.rejectPod``: phase
Failed, the admit handler's reason, ``Pod was rejected: `` and its message, written to the pod's
status subresource), with the device manager's own message texts.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

NODE = "n-1"
#: An hour: a broker that merely failed would wait this long; one rejected at admission must not.
NO_RESTART_S = "3600"
# Texts of the kubelet's device manager (pkg/kubelet/cm/devicemanager) and rejectPod.
UNAVAILABLE = ("Allocate failed due to requested number of devices unavailable for {resource}."
               " Requested: 1, Available: 0, which is unexpected")
OUT_OF_CPU = "Node didn't have enough resource: cpu, requested: 64000, used: 0, capacity: 2000"


@pytest.fixture
def controller_args(metrics_port: int) -> tuple[str, ...]:
    return (*h.FAST_ARGS, "--restart-backoff-base", NO_RESTART_S, "--restart-backoff-max",
            NO_RESTART_S, "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1")


def metric(port: int, name: str, **labels: str) -> float:
    """A sample of the controller's /metrics; 0 when the series does not exist yet."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def bind(plane: ControlPlane, namespace: str, pod: str) -> None:
    """What kube-scheduler posts when it places the pod on ``NODE``."""
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": pod, "namespace": namespace},
               "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
    plane.kubectl("create", "-f", "-", stdin=json.dumps(binding))


def reject(plane: ControlPlane, namespace: str, pod: str, *, reason: str, message: str) -> None:
    """What the kubelet writes when it refuses to admit ``pod`` (``Kubelet.rejectPod``)."""
    status = {"status": {"phase": "Failed", "reason": reason,
                         "message": f"Pod was rejected: {message}"}}
    plane.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
                  "-p", json.dumps(status))


def events_on(plane: ControlPlane, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    return [e for e in h.items(plane, f"/api/v1/namespaces/{namespace}/events")
            if (e.get("involvedObject") or {}).get("kind") == kind
            and e["involvedObject"].get("name") == name]


def live_broker(plane: ControlPlane, namespace: str) -> dict[str, Any] | None:
    pods = [p for p in h.broker_pods(plane, namespace)
            if not p["metadata"].get("deletionTimestamp")]
    return pods[0] if len(pods) == 1 else None


@pytest.mark.usefixtures("controller")
def test_rejected_broker_is_recreated_at_once_counted_and_reported(
    control_plane: ControlPlane, namespace: str, metrics_port: int
) -> None:
    cfg = h.unique("cam")
    inst = f"{cfg}-a1b2c3"
    resource = f"edgeplug.io/{inst}"
    # The real scheduler would find no edgeplug resource on the bare node and leave the pod
    # Pending; the test binds it itself.
    spec = {**h.broker_pod_spec(), "schedulerName": "nobody"}
    h.apply(control_plane, h.configuration(namespace, cfg, pod_spec=spec))
    h.apply(control_plane, h.instance(namespace, inst, configuration_name=cfg, nodes=[NODE]))
    pod = h.wait_until(lambda: live_broker(control_plane, namespace), what="the broker")
    seen = {pod["metadata"]["uid"]}
    for round_ in (1, 2):
        name = pod["metadata"]["name"]
        bind(control_plane, namespace, name)
        message = UNAVAILABLE.format(resource=resource)
        reject(control_plane, namespace, name, reason="UnexpectedAdmissionError", message=message)
        rejected_at = time.monotonic()
        # With an hour's restart backoff, only the no-backoff rule can bring it back in time.
        pod = h.wait_until(
            lambda: (p := live_broker(control_plane, namespace))
            and p["metadata"]["uid"] not in seen and p,
            what=f"the rejected broker recreated (rejection {round_})",
        )
        # A figure for the record (polled every 0.1 s through kubectl), never a verdict.
        print(f"rejection {round_}: new broker seen {time.monotonic() - rejected_at:.2f}s"
              " after the kubelet's status write")
        seen.add(pod["metadata"]["uid"])
        assert pod["metadata"]["name"] == name
        assert (pod.get("status") or {}).get("phase") == "Pending"
        h.wait_until(
            lambda: metric(metrics_port, "edgeplug_broker_admission_failures_total",
                           namespace=namespace, configuration=cfg) == round_,  # noqa: B023
            what=f"edgeplug_broker_admission_failures_total = {round_}",
        )
    reported = h.wait_until(
        lambda: (e := [e for e in events_on(control_plane, namespace, "Instance", inst)
                       if e["reason"] == "BrokerAdmissionFailed"]) and len(e) == 2 and e,
        what="one BrokerAdmissionFailed Event on the Instance per rejection",
    )
    for event in reported:
        assert event["type"] == "Warning"
        assert f"broker pod {inst}-{NODE}-pod" in event["message"]
        assert f"on node {NODE}" in event["message"]
        assert UNAVAILABLE.format(resource=resource) in event["message"]
    h.wait_until(
        lambda: any(e["reason"] == "PodDeleted" and "rejected at admission" in e["message"]
                    for e in events_on(control_plane, namespace, "Configuration", cfg)),
        what="a Warning on the Configuration saying the broker was rejected and recreated",
    )


def user_pod(namespace: str, name: str, resource: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "nobody", "containers": [{
                "name": "app", "image": "registry.example/app:1",
                "resources": {"limits": {resource: "1"}}}]}}


def create_rejected(plane: ControlPlane, namespace: str, name: str, resource: str, *,
                    reason: str = "UnexpectedAdmissionError", message: str = "") -> None:
    h.apply(plane, user_pod(namespace, name, resource))
    bind(plane, namespace, name)
    reject(plane, namespace, name, reason=reason,
           message=message or UNAVAILABLE.format(resource=resource))


def admission_events(plane: ControlPlane, namespace: str, kind: str, name: str,
                     pod: str) -> list[dict[str, Any]]:
    return [e for e in events_on(plane, namespace, kind, name)
            if e["reason"] == "AdmissionFailed" and f"pod {namespace}/{pod} " in e["message"]]


def test_users_rejected_pods_are_reported_once_on_what_they_asked_for(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess,
    metrics_port: int,
) -> None:
    cfg = h.unique("plc")
    inst = f"{cfg}-d4e5f6"
    h.apply(control_plane, h.configuration(namespace, cfg))  # no brokers: users' pods only
    # Pods are refused until the namespace's default ServiceAccount exists.
    account = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
    h.wait_until(lambda: h.get(control_plane, account),
                 what="the namespace's default ServiceAccount")
    h.apply(control_plane, h.instance(namespace, inst, configuration_name=cfg, nodes=[NODE]))
    # Rejected for an edgeplug resource, but the kubelet says CPU: not edgeplug's to report.
    create_rejected(control_plane, namespace, "cpu-hog", f"edgeplug.io/{inst}",
                    reason="OutOfcpu", message=OUT_OF_CPU)
    create_rejected(control_plane, namespace, "by-instance", f"edgeplug.io/{inst}")
    create_rejected(control_plane, namespace, "by-configuration", f"edgeplug.io/{cfg}")

    (on_instance,) = h.wait_until(
        lambda: admission_events(control_plane, namespace, "Instance", inst, "by-instance"),
        what="an AdmissionFailed Event on the Instance naming the pod",
    )
    assert on_instance["type"] == "Warning"
    assert f"on node {NODE}" in on_instance["message"]
    assert UNAVAILABLE.format(resource=f"edgeplug.io/{inst}") in on_instance["message"]
    (on_configuration,) = h.wait_until(
        lambda: admission_events(control_plane, namespace, "Configuration", cfg,
                                 "by-configuration"),
        what="an AdmissionFailed Event on the Configuration for its configuration-level resource",
    )
    assert UNAVAILABLE.format(resource=f"edgeplug.io/{cfg}") in on_configuration["message"]
    h.wait_until(
        lambda: metric(metrics_port, "edgeplug_pod_admission_failures_total",
                       namespace=namespace, configuration=cfg) == 2,
        what="edgeplug_pod_admission_failures_total = 2",
    )
    assert not admission_events(control_plane, namespace, "Instance", inst, "cpu-hog")

    # Once per pod, across a restart: the new process sees the same rejected pods again.
    controller.stop()
    controller.start()
    create_rejected(control_plane, namespace, "after-restart", f"edgeplug.io/{inst}")
    h.wait_until(
        lambda: admission_events(control_plane, namespace, "Instance", inst, "after-restart"),
        what="the restarted controller reporting a new rejected pod",
    )
    h.wait_until(
        lambda: metric(metrics_port, "edgeplug_pod_admission_failures_total",
                       namespace=namespace, configuration=cfg) == 1,
        what="the restarted controller counting the new pod only",
    )
    assert len(admission_events(control_plane, namespace, "Instance", inst, "by-instance")) == 1
    assert len(admission_events(control_plane, namespace, "Configuration", cfg,
                                "by-configuration")) == 1
