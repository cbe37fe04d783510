"""The plan that turns existing brokers into wanted ones: creations, deletions, backoff, grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller import naming
from controller.brokers import plans
from controller.brokers.plans import BrokerPolicy
from controller.state.records import ObservedPod

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
POLICY = BrokerPolicy(pending_grace_s=60, restart_backoff_base_s=2, restart_backoff_max_s=10)


def want(name: str, spec_hash: str = "h1") -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {naming.ANNOTATION_SPEC_HASH: spec_hash}}}


def pod(
    name: str,
    *,
    phase: str = "Running",
    spec_hash: str = "h1",
    age_s: float = 5,
    finished_s_ago: float | None = None,
    deleting: bool = False,
) -> ObservedPod:
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if phase == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if finished_s_ago is not None:
        finished = (NOW - timedelta(seconds=finished_s_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
        status["containerStatuses"] = [{"state": {"terminated": {"finishedAt": finished}}}]
    meta: dict[str, Any] = {
        "name": name,
        "annotations": {naming.ANNOTATION_SPEC_HASH: spec_hash},
        "creationTimestamp": (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return ObservedPod.from_object({"metadata": meta, "status": status})


def plan(
    desired: dict[str, dict[str, Any]], actual: list[ObservedPod], **kw: Any
) -> plans.Plan:
    return plans.plan_pods(
        desired=desired, actual=actual, now=NOW, policy=POLICY, restarts=kw.get("restarts", {})
    )


def test_missing_pods_are_created_and_existing_ones_kept() -> None:
    p = plan({"a": want("a"), "b": want("b")}, [pod("a")])
    assert [c["metadata"]["name"] for c in p.create] == ["b"]
    assert p.delete == []
    assert plan({"a": want("a")}, [pod("a")]).empty


def test_pod_of_a_removed_node_is_deleted() -> None:
    p = plan({"a": want("a")}, [pod("a"), pod("gone")])
    assert [(d.name, d.reason) for d in p.delete] == [("gone", plans.REASON_NODE_GONE)]


def test_changed_spec_deletes_then_recreates_after_the_old_pod_is_gone() -> None:
    p = plan({"a": want("a", "h2")}, [pod("a", spec_hash="h1")])
    assert [(d.name, d.reason) for d in p.delete] == [("a", plans.REASON_SPEC_CHANGED)]
    assert p.create == [], "same name: created only once the old pod is gone"
    p = plan({"a": want("a", "h2")}, [pod("a", spec_hash="h1", deleting=True)])
    assert p.empty, "a pod being deleted is left alone"
    assert len(plan({"a": want("a", "h2")}, []).create) == 1


def test_failed_pod_is_recreated_after_a_doubling_bounded_backoff() -> None:
    failed = pod("a", phase="Failed", finished_s_ago=3)
    assert [d.reason for d in plan({"a": want("a")}, [failed]).delete] == [
        plans.REASON_FAILED
    ]
    waiting = plan({"a": want("a")}, [failed], restarts={"a": 2})  # backoff 8 s, 3 s passed
    assert waiting.delete == []
    assert waiting.retry_after_s == 5
    capped = plan({"a": want("a")}, [pod("a", phase="Failed", finished_s_ago=11)],
                  restarts={"a": 20})
    assert [d.name for d in capped.delete] == ["a"], "backoff is bounded by its maximum"
    done = plan({"a": want("a")}, [pod("a", phase="Succeeded", finished_s_ago=30)])
    assert [d.reason for d in done.delete] == [plans.REASON_FINISHED]


def test_pod_pending_past_the_grace_is_recreated() -> None:
    young = plan({"a": want("a")}, [pod("a", phase="Pending", age_s=10)])
    assert young.empty
    assert young.retry_after_s == 50
    old = plan({"a": want("a")}, [pod("a", phase="Pending", age_s=61)])
    assert [d.reason for d in old.delete] == [plans.REASON_PENDING]


def test_backoff_is_bounded() -> None:
    assert POLICY.backoff_s(0) == 2
    assert POLICY.backoff_s(1) == 4
    assert POLICY.backoff_s(100) == 10


def test_objects_plan_for_jobs_and_services() -> None:
    desired = {"j-3": want("j-3", "h3")}
    jobs = plans.plan_objects(desired=desired, actual={"j-2": "h2"}, update_in_place=False)
    assert [c["metadata"]["name"] for c in jobs.create] == ["j-3"]
    assert [d.name for d in jobs.delete] == ["j-2"]
    svc = plans.plan_objects(
        desired={"s": want("s", "new")}, actual={"s": "old"}, update_in_place=True
    )
    assert [u["metadata"]["name"] for u in svc.update] == ["s"]
    assert svc.create == []
    assert svc.delete == []
    gone = plans.plan_objects(desired={}, actual={"s": "x"}, update_in_place=True)
    assert [d.name for d in gone.delete] == ["s"]
