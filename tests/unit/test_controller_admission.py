"""Pods rejected at admission: which are, which resource is blamed, what the
controller plans for a rejected broker, and what it keeps of a user's rejected pod."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from controller import naming
from controller.brokers import plans
from controller.brokers.admission_report import AdmissionReporter
from controller.brokers.plans import BrokerPolicy
from controller.kube.client import Kube
from controller.metrics import ControllerMetrics
from controller.state import admission, decode
from controller.state.index import ClusterState
from controller.state.records import ConfigurationRecord, InstanceRecord, ObservedPod, RejectedPod
from crds.configuration import Configuration
from crds.instance import Instance

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
POLICY = BrokerPolicy(pending_grace_s=60, restart_backoff_base_s=2, restart_backoff_max_s=10)

# Messages as the kubelet writes them (``Pod was rejected: `` + the admit handler's message);
# the first two are from a real cluster's logs.
NO_DEVICES = ("Pod was rejected: Allocate failed due to requested number of devices unavailable"
              " for edgeplug.io/storm. Requested: 1, Available: 0, which is unexpected")
UNHEALTHY = ("Pod was rejected: Allocate failed due to no healthy devices present; cannot"
             " allocate unhealthy devices edgeplug.io/race-500be8, which is unexpected")
RPC_ERROR = ("Pod was rejected: Allocate failed due to rpc error: code = Unavailable desc ="
             " slot taken, which is unexpected")
OUT_OF = ("Pod was rejected: Node didn't have enough resource: edgeplug.io/cam-a1b2c3,"
          " requested: 1, used: 1, capacity: 1")
OUT_OF_CPU = "Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 0"


@pytest.mark.parametrize(("phase", "reason", "message", "rejected"), [
    ("Failed", "UnexpectedAdmissionError", NO_DEVICES, True),
    ("Failed", "UnexpectedAdmissionError", "", True),
    ("Failed", "TopologyAffinityError", "Pod was rejected: Resources cannot be allocated", True),
    ("Failed", "OutOfedgeplug.io/cam-a1b2c3", OUT_OF, True),
    ("Failed", "SomeOtherAdmissionError", "", True),
    ("Failed", "Error", "container exited with code 1", False),
    ("Failed", "", "", False),
    ("Failed", "Evicted", "The node was low on resource: memory.", False),
    ("Pending", "UnexpectedAdmissionError", NO_DEVICES, False),
    ("Running", "", "", False),
])
def test_rejected_at_admission(phase: str, reason: str, message: str, rejected: bool) -> None:
    assert admission.rejected_at_admission(
        phase=phase, reason=reason, message=message) is rejected


@pytest.mark.parametrize(("reason", "message", "requested", "blamed"), [
    # The message names the configuration-level resource, not the Instance that starts alike.
    ("UnexpectedAdmissionError", NO_DEVICES, ["edgeplug.io/storm", "edgeplug.io/storm-fa77fa"],
     ["edgeplug.io/storm"]),
    ("UnexpectedAdmissionError", UNHEALTHY, ["edgeplug.io/race-500be8", "edgeplug.io/race"],
     ["edgeplug.io/race-500be8"]),
    # An Allocate error that names no resource: every edgeplug resource of the pod.
    ("UnexpectedAdmissionError", RPC_ERROR, ["edgeplug.io/b", "edgeplug.io/a"],
     ["edgeplug.io/a", "edgeplug.io/b"]),
    ("OutOfedgeplug.io/cam-a1b2c3", OUT_OF, ["edgeplug.io/cam-a1b2c3"], ["edgeplug.io/cam-a1b2c3"]),
    ("OutOfedgeplug.io/cam-a1b2c3", "", ["edgeplug.io/cam-a1b2c3"], ["edgeplug.io/cam-a1b2c3"]),
    # A rejection for something else is not edgeplug's to report.
    ("OutOfcpu", OUT_OF_CPU, ["edgeplug.io/cam-a1b2c3"], []),
    ("UnexpectedAdmissionError", NO_DEVICES, [], []),
    # A name is matched whole: a longer name in the message is not this one.
    ("OutOfedgeplug.io/cam-a1b2c3", OUT_OF, ["edgeplug.io/cam"], []),
    ("UnexpectedAdmissionError", NO_DEVICES, ["edgeplug.io/sto", "edgeplug.io/storm"],
     ["edgeplug.io/storm"]),
    # Another vendor's device failed: named, so edgeplug's own resource is not blamed.
    ("UnexpectedAdmissionError",
     "Pod was rejected: Allocate failed due to requested number of devices unavailable for"
     " nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
     ["edgeplug.io/cam", "nvidia.com/gpu"], ["nvidia.com/gpu"]),
    # A resource name override (configuration-level resource of another domain).
    ("UnexpectedAdmissionError",
     "Pod was rejected: Allocate failed due to requested number of devices unavailable for"
     " huawei.com/Ascend910. Requested: 2, Available: 1, which is unexpected",
     ["huawei.com/Ascend910"], ["huawei.com/Ascend910"]),
])
def test_blamed_resources(
    reason: str, message: str, requested: list[str], blamed: list[str]
) -> None:
    assert admission.blamed_resources(
        reason=reason, message=message, requested=requested) == blamed


def test_extended_resources_and_event_names() -> None:
    assert admission.extended_resources(
        ["cpu", "edgeplug.io/b", "memory", "edgeplug.io/a", "edgeplug.io/b", "hugepages-2Mi"]
    ) == ("edgeplug.io/a", "edgeplug.io/b")
    assert admission.event_name("cam-a1b2c3", "0f1e") == "cam-a1b2c3.0f1e"
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    long_name = admission.event_name("a" * 214 + "-b" * 19, uid)  # a 252-character name
    assert len(long_name) <= admission.EVENT_NAME_MAX
    assert long_name.endswith(f"a.{uid}") or long_name.endswith(f"b.{uid}")


def broker(name: str, *, phase: str, reason: str = "", message: str = "",
           finished_s_ago: float | None = None) -> ObservedPod:
    status: dict[str, Any] = {"phase": phase, "reason": reason, "message": message}
    if finished_s_ago is not None:
        status["conditions"] = [{"type": "Ready", "status": "False",
                                 "lastTransitionTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    return ObservedPod.from_object({
        "metadata": {"name": name, "uid": f"uid-{name}",
                     "annotations": {naming.ANNOTATION_SPEC_HASH: "h1"},
                     "creationTimestamp": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": {"nodeName": "n-1"},
        "status": status,
    })


def want(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {naming.ANNOTATION_SPEC_HASH: "h1"}}}


def test_rejected_broker_is_deleted_at_once_whatever_its_restarts() -> None:
    pod = broker("b", phase="Failed", reason="UnexpectedAdmissionError", message=NO_DEVICES)
    # Just failed, and restarted often (a crash loop would wait 10 s): deleted now anyway.
    plan = plans.plan_pods(desired={"b": want("b")}, actual=[pod], now=NOW, policy=POLICY,
                           restarts={"b": 7}, admissions={"b": 0})
    (deletion,) = plan.delete
    assert deletion.reason == plans.REASON_ADMISSION
    assert deletion.uid == "uid-b"
    assert "on node n-1" in deletion.message
    assert NO_DEVICES in deletion.message
    assert deletion.message.endswith("recreating it at once")
    assert plan.retry_after_s is None


def test_rejections_in_a_row_past_the_limit_get_the_ordinary_backoff() -> None:
    pod = broker("b", phase="Failed", reason="UnexpectedAdmissionError", message=NO_DEVICES,
                 finished_s_ago=0)
    limit = plans.ADMISSION_IMMEDIATE_MAX
    below = plans.plan_pods(desired={"b": want("b")}, actual=[pod], now=NOW, policy=POLICY,
                            restarts={}, admissions={"b": limit - 1})
    assert [d.reason for d in below.delete] == [plans.REASON_ADMISSION]
    at = plans.plan_pods(desired={"b": want("b")}, actual=[pod], now=NOW, policy=POLICY,
                         restarts={}, admissions={"b": limit})
    assert at.delete == []
    assert at.retry_after_s == POLICY.backoff_s(0)
    # Once the backoff has passed it is deleted, still as a rejection (counted, reported).
    later = plans.plan_pods(desired={"b": want("b")}, actual=[pod], policy=POLICY,
                            now=NOW + timedelta(seconds=POLICY.backoff_s(0)),
                            restarts={}, admissions={"b": limit})
    (deletion,) = later.delete
    assert deletion.reason == plans.REASON_ADMISSION
    assert deletion.message.endswith("recreating it after a backoff (restart 1)")


def test_a_crashed_broker_keeps_its_backoff() -> None:
    pod = broker("b", phase="Failed", reason="Error", message="exit 1", finished_s_ago=0)
    plan = plans.plan_pods(desired={"b": want("b")}, actual=[pod], now=NOW, policy=POLICY,
                           restarts={}, admissions={})
    assert plan.delete == []
    assert plan.retry_after_s == POLICY.backoff_s(0)


def test_reason_and_message_are_kept_for_a_failed_broker_only() -> None:
    running = broker("b", phase="Running", reason="Whatever", message="moving status text")
    assert (running.reason, running.message) == ("", "")
    failed = broker("b", phase="Failed", reason="UnexpectedAdmissionError", message=NO_DEVICES)
    assert (failed.reason, failed.message) == ("UnexpectedAdmissionError", NO_DEVICES)
    raw = json.dumps({"metadata": {"name": "b", "uid": "u1"},
                      "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                 "message": NO_DEVICES}}).encode()
    decoded, _ = decode.pod(raw)
    assert (decoded.uid, decoded.reason, decoded.message) == (
        "u1", "UnexpectedAdmissionError", NO_DEVICES)


def user_pod(*, labels: dict[str, str] | None = None, phase: str = "Failed",
             reason: str = "UnexpectedAdmissionError", message: str = NO_DEVICES) -> bytes:
    limits = {"cpu": "1", "edgeplug.io/cam-a1b2c3": "1"}
    return json.dumps({
        "metadata": {"name": "app", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                     "labels": labels or {}},
        "spec": {"nodeName": "n-1",
                 "initContainers": [{"name": "i", "resources": {
                     "requests": {"edgeplug.io/storm": "1"}}}],
                 "containers": [{"name": "c", "resources": {
                     "limits": limits}}]},
        "status": {"phase": phase, "reason": reason, "message": message},
    }).encode()


def test_a_users_rejected_pod_is_kept_with_its_extended_resources() -> None:
    record, version = decode.rejected_pod(user_pod())
    assert version == "7"
    assert record is not None
    assert (record.namespace, record.name, record.uid, record.node) == ("ns", "app", "u1", "n-1")
    assert record.resources == ("edgeplug.io/cam-a1b2c3", "edgeplug.io/storm")
    assert record.message == NO_DEVICES


@pytest.mark.parametrize("raw", [
    user_pod(labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
                     naming.LABEL_TARGET_NODE: "n-1"}),  # a broker: its own watch
    user_pod(reason="Error", message="exit 1"),  # failed after it ran
    user_pod(phase="Succeeded", reason="", message=""),
], ids=["broker", "crashed", "succeeded"])
def test_other_pods_are_not_kept(raw: bytes) -> None:
    assert decode.rejected_pod(raw)[0] is None


def test_a_pod_without_extended_resources_is_not_kept() -> None:
    raw = json.dumps({"metadata": {"name": "app", "namespace": "ns"},
                      "spec": {"containers": [{"name": "c", "resources": {
                          "limits": {"cpu": "1"}}}]},
                      "status": {"phase": "Failed", "reason": "OutOfcpu",
                                 "message": OUT_OF_CPU}}).encode()
    assert decode.rejected_pod(raw)[0] is None


def test_the_cache_knows_which_object_serves_a_resource() -> None:
    cache = ClusterState()
    cfg = Configuration.from_object({
        "metadata": {"name": "storm", "namespace": "ns", "uid": "c1"},
        "spec": {"discoveryHandler": {"name": "debugEcho"}}})
    cfg_record = ConfigurationRecord(cfg, {})
    cache.put_configuration(("ns", "storm"), None, cfg_record)
    inst = InstanceRecord(instance=Instance.from_object({
        "metadata": {"name": "storm-fa77fa", "namespace": "ns", "uid": "i1"},
        "spec": {"configurationName": "storm", "nodes": ["n-1"], "capacity": 2,
                 "deviceUsage": {}}}), created_at=None)
    cache.put_instance(("ns", "storm-fa77fa"), None, inst)
    assert cache.resource_owners("edgeplug.io/storm") == [("Configuration", "ns", "storm")]
    assert cache.resource_owners("edgeplug.io/storm-fa77fa") == [
        ("Instance", "ns", "storm-fa77fa")]
    # A changed resourceName moves the configuration-level resource.
    renamed = Configuration.from_object({
        "metadata": {"name": "storm", "namespace": "ns", "uid": "c1"},
        "spec": {"discoveryHandler": {"name": "debugEcho"}, "resourceName": "vendor.io/npu"}})
    cache.put_configuration(("ns", "storm"), cfg_record, ConfigurationRecord(renamed, {}))
    assert cache.resource_owners("edgeplug.io/storm") == []
    assert cache.resource_owners("vendor.io/npu") == [("Configuration", "ns", "storm")]
    # An Instance whose spec changes keeps its resource; one deleted gives it up.
    cache.put_instance(("ns", "storm-fa77fa"), inst, inst)
    assert cache.resource_owners("edgeplug.io/storm-fa77fa") == [
        ("Instance", "ns", "storm-fa77fa")]
    cache.put_instance(("ns", "storm-fa77fa"), inst, None)
    assert cache.resource_owners("edgeplug.io/storm-fa77fa") == []


def instance_record(namespace: str, name: str, configuration: str) -> InstanceRecord:
    return InstanceRecord(instance=Instance.from_object({
        "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"},
        "spec": {"configurationName": configuration, "nodes": ["n-1"], "capacity": 1,
                 "deviceUsage": {}}}), created_at=None)


def test_a_users_pod_is_reported_on_what_serves_the_blamed_resource() -> None:
    cache = ClusterState()
    for namespace in ("a", "b"):  # one Instance name in two namespaces: the pod's own wins
        cache.put_instance((namespace, "cam-a1b2c3"), None,
                           instance_record(namespace, "cam-a1b2c3", "cam"))
    cache.put_instance(("a", "plc-d4e5f6"), None, instance_record("a", "plc-d4e5f6", "plc"))
    reporter = AdmissionReporter(kube=cast(Kube, None), metrics=ControllerMetrics())

    def targets(namespace: str, message: str) -> list[tuple[str, str, str]]:
        pod = RejectedPod(
            namespace=namespace, name="app", uid="u1", node="n-1",
            reason="UnexpectedAdmissionError", message=message,
            resources=("edgeplug.io/cam-a1b2c3", "edgeplug.io/plc-d4e5f6", "nvidia.com/gpu"))
        return [(resource, body["metadata"]["namespace"], configuration)
                for resource, body, configuration in reporter.targets(cache, pod)]

    assert targets("b", OUT_OF) == [("edgeplug.io/cam-a1b2c3", "b", "cam")]
    # Served only in another namespace (a Configuration's namespace, the pod elsewhere).
    assert targets("c", OUT_OF) == [("edgeplug.io/cam-a1b2c3", "a", "cam"),
                                    ("edgeplug.io/cam-a1b2c3", "b", "cam")]
    # Allocate failed without naming a resource: each edgeplug resource the pod asked for.
    assert targets("a", RPC_ERROR) == [("edgeplug.io/cam-a1b2c3", "a", "cam"),
                                       ("edgeplug.io/plc-d4e5f6", "a", "plc")]
    # Another vendor's device failed: nothing of edgeplug's to report.
    assert targets("a", "Pod was rejected: Allocate failed due to requested number of devices"
                        " unavailable for nvidia.com/gpu. Requested: 1, Available: 0") == []
