"""The indices the reconciler reads: brokers by Instance, Instances by node and Configuration,
and the status counts kept without a walk over all Instances."""

from __future__ import annotations

from typing import Any

from controller.state.index import ClusterState
from controller.state.records import InstanceRecord, ObservedPod
from crds.instance import Instance


def _instance(name: str, nodes: list[str], cfg: str = "cam") -> InstanceRecord:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"configurationName": cfg, "nodes": nodes, "capacity": 1},
    }
    return InstanceRecord(instance=Instance.from_object(body), created_at=None)


def _pod(name: str, instance: str, *, ready: bool, deleting: bool = False) -> ObservedPod:
    return ObservedPod(name=name, phase="Running" if ready else "Pending", ready=ready,
                       spec_hash="h", deleting=deleting, created_at=None, finished_at=None,
                       instance=instance, configuration="cam", namespace="ns")


def test_counts_follow_instances_and_brokers() -> None:
    cache = ClusterState()
    a, b = _instance("cam-a", ["n-1", "n-2"]), _instance("cam-b", ["n-1"])
    cache.put_instance(("ns", "cam-a"), None, a)
    cache.put_instance(("ns", "cam-b"), None, b)
    assert cache.pod_broker_counts("ns", "cam") == (2, 3, 0)
    assert cache.instances_on("n-1") == [("ns", "cam-a"), ("ns", "cam-b")]

    p1 = _pod("p1", "cam-a", ready=False)
    cache.put_pod(("ns", "p1"), None, p1)
    ready = _pod("p1", "cam-a", ready=True)
    cache.put_pod(("ns", "p1"), p1, ready)
    assert cache.pod_broker_counts("ns", "cam") == (2, 3, 1)
    assert cache.broker_pods("ns", "cam-a") == [ready]

    going = _pod("p1", "cam-a", ready=True, deleting=True)
    cache.put_pod(("ns", "p1"), ready, going)
    assert cache.pod_broker_counts("ns", "cam")[2] == 0, "a broker being deleted is not ready"

    moved = _instance("cam-a", ["n-2"])
    cache.put_instance(("ns", "cam-a"), a, moved)
    assert cache.pod_broker_counts("ns", "cam") == (2, 2, 0)
    assert cache.instances_on("n-1") == [("ns", "cam-b")]

    cache.put_instance(("ns", "cam-b"), b, None)
    cache.put_pod(("ns", "p1"), going, None)
    assert cache.pod_broker_counts("ns", "cam") == (1, 1, 0)
    assert cache.broker_pods("ns", "cam-a") == []
    assert cache.instances_on("n-1") == []
