"""What a watch event costs the controller: nothing when nothing it keeps changed; the right
change callbacks otherwise, including after a relist; garbage skipped, never fatal."""

from __future__ import annotations

import json
from typing import Any

from controller import naming
from controller.kube.watching import Kind, Watcher
from controller.state import decode
from controller.state.records import ObservedPod


def _pod(*, phase: str = "Pending", conditions: list[dict[str, Any]] | None = None,
         version: str = "1", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "cam-abcdef-n-1-pod", "namespace": "ns", "resourceVersion": version,
        "creationTimestamp": "2026-01-01T12:00:00Z",
        "labels": {naming.LABEL_INSTANCE: "cam-abcdef", naming.LABEL_CONFIGURATION: "cam"},
        "annotations": {naming.ANNOTATION_SPEC_HASH: "h1"},
        "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:01:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "broker", "image": "b:1"}]},
            "status": {"phase": phase, "conditions": conditions or []}}


def _unschedulable(message: str, at: str) -> list[dict[str, Any]]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": message, "lastProbeTime": None, "lastTransitionTime": at}]


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[Any, Any, Any]] = []

    def __call__(self, key: Any, old: Any, new: Any) -> None:
        self.changes.append((key, old, new))


def _watcher(recorder: Recorder) -> Watcher[tuple[str, str], ObservedPod]:
    kind: Kind[tuple[str, str], ObservedPod] = Kind(
        name="pods", path="/api/v1/pods", decode=decode.pod,
        key=lambda pod: (pod.namespace, pod.name),
    )
    return Watcher(http=None, kind=kind, on_change=recorder)  # type: ignore[arg-type]


def test_a_status_rewrite_by_the_scheduler_changes_nothing_the_controller_keeps() -> None:
    recorder = Recorder()
    watcher = _watcher(recorder)
    watcher._event(_line("ADDED", _pod()))
    assert len(recorder.changes) == 1
    # The scheduler marks it unschedulable, then again with a new message and time.
    watcher._event(_line("MODIFIED", _pod(
        conditions=_unschedulable("0/20 nodes are available", "2026-01-01T12:00:01Z"),
        version="2")))
    watcher._event(_line("MODIFIED", _pod(
        conditions=_unschedulable("0/21 nodes are available", "2026-01-01T12:05:01Z"),
        version="3")))
    assert len(recorder.changes) == 1, "no work for a change the controller does not read"
    assert watcher.version == "3", "but the watch resumes from the newest version"


def test_phase_readiness_and_deletion_are_changes() -> None:
    recorder = Recorder()
    watcher = _watcher(recorder)
    watcher._event(_line("ADDED", _pod()))
    ready = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T12:00:02Z"}]
    watcher._event(_line("MODIFIED", _pod(phase="Running", conditions=ready, version="2")))
    watcher._event(_line("MODIFIED", _pod(phase="Running", conditions=ready, version="3",
                                          deleting=True)))
    watcher._event(_line("DELETED", _pod(phase="Running", version="4", deleting=True)))
    _, old, new = recorder.changes[1]
    assert (old.phase, new.phase, new.ready) == ("Pending", "Running", True)
    assert recorder.changes[2][2].deleting
    assert recorder.changes[3][2] is None
    assert watcher.store == {}


def test_bookmarks_move_the_version_only() -> None:
    recorder = Recorder()
    watcher = _watcher(recorder)
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "99"}}
    watcher._event(_line("BOOKMARK", bookmark))
    assert recorder.changes == []
    assert watcher.version == "99"


def test_a_garbage_object_is_skipped_and_the_watch_goes_on() -> None:
    recorder = Recorder()
    watcher = _watcher(recorder)
    garbage = {"metadata": {"name": 7, "resourceVersion": "5"}, "status": "nonsense"}
    watcher._event(_line("ADDED", garbage))
    watcher._event(_line("ADDED", _pod(version="6")))
    assert len(recorder.changes) == 1
