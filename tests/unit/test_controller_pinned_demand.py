"""The controller's count of pods pinned to each node, and when it rewrites a Node's record."""

from __future__ import annotations

import json
from typing import Any

from controller.brokers.pinned_demand import PinnedDemand, PinnedPod, node_totals, pinned_pod
from crds import pinning


def _pod(name: str, *, node_selector: str | None = None, node_name: str = "",
         phase: str = "Pending", limits: dict[str, str] | None = None,
         affinity_node: str | None = None) -> bytes:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "limits": limits if limits is not None else {"edgeplug.io/cam": "1"}}}]}
    if node_selector:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_selector}
    if affinity_node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [affinity_node]}]}]}}}
    if node_name:
        spec["nodeName"] = node_name
    return json.dumps({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"},
                       "spec": spec, "status": {"phase": phase}}).encode()


def test_only_pending_pinned_pods_with_extended_requests_are_kept() -> None:
    kept, version = pinned_pod(_pod("p", node_selector="n1"))
    assert kept == PinnedPod("ns", "p", "n1", (("edgeplug.io/cam", 1),))
    assert version == "7"
    assert pinned_pod(_pod("q", affinity_node="n2"))[0] == PinnedPod(
        "ns", "q", "n2", (("edgeplug.io/cam", 1),))
    # Bound and not started yet, it is still counted: its agent may not have seen the binding.
    assert pinned_pod(_pod("bound", node_selector="n1", node_name="n1"))[0] == PinnedPod(
        "ns", "bound", "n1", (("edgeplug.io/cam", 1),))
    for raw in (_pod("unpinned"), _pod("elsewhere", node_selector="n1", node_name="n2"),
                _pod("running", node_selector="n1", node_name="n1", phase="Running"),
                _pod("cpu", node_selector="n1", limits={"cpu": "1"})):
        assert pinned_pod(raw)[0] is None, raw


async def test_a_node_is_rewritten_only_when_its_total_changes_and_cleared_when_none() -> None:
    pods = [PinnedPod("ns", "p", "n1", (("edgeplug.io/cam", 1),)),
            PinnedPod("ns", "q", "n1", (("edgeplug.io/cam", 2), ("edgeplug.io/cam-abc", 1)))]
    annotations = {"n1": "", "n2": '{"edgeplug.io/cam":1}', "n3": '{"edgeplug.io/cam":1}'}
    writes: list[tuple[str, str | None]] = []

    async def write(node: str, text: str | None) -> None:
        writes.append((node, text))
        annotations[node] = text or ""

    demand = PinnedDemand(pods=lambda: pods, annotations=lambda: annotations, write=write)
    assert node_totals(pods) == {"n1": {"edgeplug.io/cam": 3, "edgeplug.io/cam-abc": 1}}
    assert demand.stale_nodes() == ["n1", "n2", "n3"]
    for node in demand.stale_nodes():
        await demand.sync(node)
    assert writes == [("n1", '{"edgeplug.io/cam":3,"edgeplug.io/cam-abc":1}'),
                      ("n2", None), ("n3", None)]
    await demand.sync("n1")
    assert len(writes) == 3, "an unchanged total is not written again"
    assert demand.stale_nodes() == []
    assert PinnedDemand.changed_nodes(pods[0], None) == {"n1"}
    assert PinnedDemand.changed_nodes(pods[0], pods[0]) == set()


async def _never_written(node: str, text: str | None) -> None:
    raise AssertionError(f"no write expected ({node}: {text})")


def test_requests_for_resources_the_scheduler_allocates_are_left_out() -> None:
    """A pinned pod's request for a resource a DeviceClass maps (DRA) waits for no device
    plugin: only its device-plugin requests count on the Node."""
    pod = PinnedPod(namespace="ns", name="p", node="n1",
                    requests=(("edgeplug.io/plug", 1), ("edgeplug.io/sched", 1)))
    only = PinnedPod(namespace="ns", name="q", node="n1", requests=(("edgeplug.io/sched", 1),))
    demand = PinnedDemand(pods=lambda: [pod, only], annotations=dict, write=_never_written)
    assert demand.wanted_text("n1") == pinning.format_pinned_demand(
        {"edgeplug.io/plug": 1, "edgeplug.io/sched": 2})
    demand.leave_out(lambda: frozenset({"edgeplug.io/sched"}))
    assert demand.wanted_text("n1") == pinning.format_pinned_demand({"edgeplug.io/plug": 1})
    assert demand.stale_nodes() == ["n1"]
