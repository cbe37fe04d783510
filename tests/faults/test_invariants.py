"""The fault suite's recorder flags what it must, and only that: each rule over small states.

A recorder that never flags anything would make every fault scenario pass.
These cases feed it states in the kubelet's records format (``DeviceNode``'s records file,
tests/harness/kubebin/devicenode_records.go) and the API's Instance and Pod shapes, without a
cluster, and check each violation is reported, and that a legitimate state is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.faults.invariants import (
    Holder,
    InvariantRecorder,
    KubeletView,
    instance_users,
    live_brokers,
    overused,
    recorded_slots,
    slot_conflicts,
    slot_holders,
)

#: The Instance plugin's device ids of one pod: slot 0 of Instance cam-abc.
SLOT0 = {"edgeplug.io/cam-abc": ["cam-abc-0"]}


def records(path: Path, *pods: tuple[str, str, dict[str, list[str]], bool, str]) -> KubeletView:
    """A kubelet records file holding ``(name, uid, resource → ids, live, phase)`` pods."""
    path.write_text(json.dumps({"pods": [
        {"namespace": "ns", "name": name, "uid": uid, "live": live, "admitted": live,
         "phase": phase, "reason": "UnexpectedAdmissionError" if phase == "Failed" else "",
         "message": "", "containers": [{"name": "main", "deviceIDs": ids}]}
        for name, uid, ids, live, phase in pods]}))
    return KubeletView(path.stem, path)


def instance(name: str, usage: dict[str, str], uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid},
            "spec": {"configurationName": "cam", "deviceUsage": usage}}


def broker(name: str, instance_: str, node: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/component": "broker", "edgeplug.io/instance": instance_,
        "edgeplug.io/target-node": node}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running"}}


def test_a_slot_on_two_nodes_is_a_conflict_and_one_holder_is_not(tmp_path: Path) -> None:
    a = records(tmp_path / "a.json", ("p", "1", SLOT0, True, "Running"))
    b = records(tmp_path / "b.json", ("q", "2", SLOT0, True, "Running"))
    instances = {"cam-abc": instance("cam-abc", {"cam-abc-0": "a", "cam-abc-1": ""})}
    holders, unmapped = slot_holders([a, b], instances)
    assert holders == {"cam-abc-0": {Holder("a", "ns", "p", "1"), Holder("b", "ns", "q", "2")}}
    assert unmapped == []
    found = slot_conflicts(holders, recorded_slots(instances))
    assert any("held by 2 live pods" in v for v in found.values())
    assert any("deviceUsage gives it to a" in v for v in found.values())
    alone, _ = slot_holders([a], instances)
    assert slot_conflicts(alone, recorded_slots(instances)) == {}


def test_configuration_ids_map_onto_slots_through_device_usage(tmp_path: Path) -> None:
    a = records(tmp_path / "a.json", ("p", "1", {"edgeplug.io/cam": ["cam-v0", "cam-v9"]}, True,
                                      "Running"))
    instances = {"cam-abc": instance("cam-abc", {"cam-abc-0": "C:cam-v0:a", "cam-abc-1": ""})}
    holders, unmapped = slot_holders([a], instances)
    assert holders == {"cam-abc-0": {Holder("a", "ns", "p", "1")}}
    assert unmapped == ["edgeplug.io/cam cam-v9 of ns/p@a"]


def test_ended_pods_hold_nothing(tmp_path: Path) -> None:
    a = records(tmp_path / "a.json", ("p", "1", {"edgeplug.io/cam-abc": ["cam-abc-0"]}, False,
                                      "Succeeded"))
    assert slot_holders([a], {"cam-abc": instance("cam-abc", {})}) == ({}, [])


def test_two_live_brokers_for_one_instance_and_node_are_reported() -> None:
    pods = [broker("b1", "cam-abc", "a"), broker("b2", "cam-abc", "a"),
            broker("b3", "cam-abc", "b"), broker("old", "cam-abc", "b", deleting=True)]
    assert live_brokers(pods) == {("cam-abc", "a"): ["b1", "b2"], ("cam-abc", "b"): ["b3"]}


def test_the_recorder_flags_a_conflict_seen_twice_and_a_failed_admission(tmp_path: Path) -> None:
    views = [records(tmp_path / "a.json", ("p", "1", SLOT0, True, "Running"),
                     ("r", "3", {}, False, "Failed")),
             records(tmp_path / "b.json", ("q", "2", SLOT0, True, "Running"))]
    recorder = InvariantRecorder(kubeconfig=tmp_path / "none", namespace="ns",
                                 kubelets=lambda: views)
    recorder.instances["cam-abc"] = instance("cam-abc", {"cam-abc-0": "a"})
    recorder._check_slots()
    assert [v for v in recorder.violations if "slot" in v] == []  # one reading is not enough
    assert any("pod r failed on a: UnexpectedAdmissionError" in v for v in recorder.violations)
    recorder._check_slots()
    assert any("held by 2 live pods" in v for v in recorder.violations)


def test_the_recorder_flags_an_instance_gone_or_recreated_without_cause(tmp_path: Path) -> None:
    recorder = InvariantRecorder(kubeconfig=tmp_path / "none", namespace="ns",
                                 kubelets=lambda: [])
    recorder._on_instance("ADDED", instance("kept", {}, uid="u1"))
    recorder._on_instance("MODIFIED", instance("kept", {}, uid="u2"))
    recorder._on_instance("ADDED", instance("went", {}))
    recorder.allow_gone("went")
    recorder._on_instance("DELETED", instance("went", {}))
    recorder._on_instance("ADDED", instance("went", {}, uid="u9"))
    recorder._on_instance("DELETED", instance("kept", {}, uid="u2"))
    assert recorder.violations == [
        "Instance kept re-created (uid u1 → u2) without cause",
        "Instance kept deleted though its device never vanished",
    ]


def test_the_recorder_flags_a_pod_failed_at_admission(tmp_path: Path) -> None:
    recorder = InvariantRecorder(kubeconfig=tmp_path / "none", namespace="ns",
                                 kubelets=lambda: [])
    pod = broker("b1", "cam-abc", "a")
    recorder._on_pod("ADDED", pod)
    recorder._on_pod("ADDED", broker("b2", "cam-abc", "a"))
    failed = {"metadata": {"name": "x", "uid": "9"},
              "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                         "message": "Allocate failed"}}
    recorder._on_pod("MODIFIED", failed)
    assert recorder.violations == [
        "2 live brokers for cam-abc on a: ['b1', 'b2']",
        "pod x failed: UnexpectedAdmissionError Allocate failed",
    ]


def test_containers_beyond_capacity_are_flagged_by_what_they_got_not_by_device_usage(
    tmp_path: Path,
) -> None:
    """A double hand-out: two pods on the Configuration resource and one on the
    Instance's, for a device of capacity 2, while ``deviceUsage`` (the freed record) shows
    nothing wrong. Only the containers' environments tell which Instance served them."""
    def pod(name: str, ids: dict[str, list[str]], envs: dict[str, str]) -> dict[str, Any]:
        return {"namespace": "ns", "name": name, "uid": name, "live": True, "admitted": True,
                "phase": "Running", "containers": [
                    {"name": "main", "deviceIDs": ids, "envs": envs}]}
    served_by_abc = {"DEBUG_ECHO_DESCRIPTION_ABC123": "cam0", "DEBUG_ECHO_DESCRIPTION": "cam0"}
    served_by_def = {"DEBUG_ECHO_DESCRIPTION_DEF456": "cam1", "DEBUG_ECHO_DESCRIPTION": "cam1"}
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"pods": [
        pod("p1", {"edgeplug.io/cam": ["cam-v0"]}, served_by_abc),
        pod("p2", {"edgeplug.io/cam": ["cam-v2"]}, served_by_abc),
        pod("p3", {"edgeplug.io/cam-abc123": ["cam-abc123-0"]}, served_by_abc),
        pod("p4", {"edgeplug.io/cam": ["cam-v1"]}, served_by_def)]}))
    views = [KubeletView("a", path)]
    capacities = {"cam-abc123": 2, "cam-def456": 2}
    users = instance_users(views, capacities)
    assert {k: len(v) for k, v in users.items()} == {"cam-abc123": 3, "cam-def456": 1}
    assert list(overused(users, capacities).values()) == [
        "Instance cam-abc123 of capacity 2 serves 3 live containers at once: "
        "ns/p1@a/main#0, ns/p2@a/main#0, ns/p3@a/main#0"]

    recorder = InvariantRecorder(kubeconfig=tmp_path / "none", namespace="ns",
                                 kubelets=lambda: views)
    for name in capacities:
        recorder.instances[name] = {"metadata": {"name": name, "uid": "u"}, "spec": {
            "configurationName": "cam", "capacity": 2,
            "deviceUsage": {f"{name}-0": "", f"{name}-1": ""}}}
    recorder._check_slots()
    recorder._check_slots()
    assert any("cam-abc123 of capacity 2 serves 3" in v for v in recorder.violations)
    assert not any("cam-def456" in v for v in recorder.violations)
