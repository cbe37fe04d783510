"""A node's agent token reaches no further than its own node's part of each Instance, and its
own node's pods.

RBAC lets the agent create, patch and delete every Instance (it cannot say
"only this node's entries"); deploy/manifests/agent-instance-policy.yaml narrows that with a
ValidatingAdmissionPolicy keyed on the node name the API server binds into a DaemonSet pod's
token. A stolen node token must not free another node's slot, remove another node, delete its
Instance or label its Node; deploy/manifests/agent-pod-policy.yaml likewise confines the
agent's pods/patch to pods bound to its node and to Huawei's Ascend annotations. Each denial
is a real request to the real API server, made with the agent's own ServiceAccount token bound
to a pod on node A, next to the same kind of write on A's own entries, which must pass (a
policy that refuses everything would pass denials alone).
That the real agent does its whole job under these rights is tests/integration/test_rbac.py's
``test_the_real_agent_works_with_its_token_alone``, which applies this policy too.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from agent.kube.client import InstanceResource
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.offer_grants import offer_grants, wait_offer
from tests.harness.service_accounts import Identity, apply_compat, mint, pod_bound

pytestmark = pytest.mark.timeout(180)

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
POLICY_FILES = ("namespace.yaml", "agent-rbac.yaml", "agent-node-policy.yaml",
                "agent-instance-policy.yaml", "agent-pod-policy.yaml")
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
INSTANCES = "instances.edgeplug.io"
#: How long a newly applied policy may take to be enforced (it is type-checked and loaded
#: asynchronously by the API server); generous, the machine is shared.
POLICY_ACTIVE_S = 60.0
POLL_S = 0.2
#: What the API server answers when a ValidatingAdmissionPolicy denies a request.
DENIED = "denied request"
#: The agent's field manager prefix (agent/kube/client.py field_manager).
FIELD_MANAGER = "edgeplug-agent-rights-test"


@dataclass(frozen=True)
class World:
    namespace: str
    node_a: str
    node_b: str
    agent_a: Identity
    unbound: Identity


def _apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(obj))


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    cp = control_plane
    for name in POLICY_FILES:
        cp.kubectl("apply", "-f", str(MANIFESTS / name))
    apply_compat(cp)  # the node status policy is tried on the compatibility mode's grant
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"rights-a-{suffix}", f"rights-b-{suffix}"
    namespace = f"rights-{suffix}"
    for node in (node_a, node_b):
        _apply(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    cp.kubectl("create", "namespace", namespace)
    folder = tmp_path_factory.mktemp("rights")
    agent_a = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_a,
                        folder=folder)
    unbound = mint(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT,
                   path=folder / "unbound")
    # The Configuration the Instances name, which every node may offer (no nodeSelector).
    _apply(cp, debug_echo_configuration("cam", descriptions=["c0"]) | {
        "metadata": {"name": "cam", "namespace": namespace}})
    try:
        with offer_grants(cp, folder):
            wait_offer(cp, namespace, "cam", node_a)
            yield World(namespace, node_a, node_b, agent_a, unbound)
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"{AGENT_ACCOUNT}-{node_a}", check=False)
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _instance(cp: ControlPlane, world: World, *, nodes: list[str], usage: dict[int, str],
              shared: bool = True, status: dict[str, Any] | None = None,
              name: str = "") -> str:
    """An Instance as the agents of ``nodes`` would have left it, written by the admin."""
    name = name or f"cam-{uuid.uuid4().hex[:6]}"
    _apply(cp, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "namespace": world.namespace},
        "spec": {"configurationName": "cam", "cdiName": f"edgeplug.io/cam={name[-6:]}",
                 "capacity": len(usage), "shared": shared, "nodes": nodes,
                 "brokerProperties": {"URL": "rtsp://cam"},
                 "deviceUsage": {f"{name}-{slot}": value for slot, value in usage.items()}},
    })
    if status:
        cp.kubectl("patch", INSTANCES, name, "-n", world.namespace, "--subresource=status",
                   "--type=merge", "-p", json.dumps({"status": status}))
    return name


def _client(who: Identity) -> Client:
    return Client(KubeConfig.from_file(str(who.kubeconfig)), field_manager=FIELD_MANAGER)


def _outcome(call: Callable[[], object]) -> tuple[bool, str]:
    try:
        call()
    except ApiError as error:
        return False, f"{error.status.code}: {error.status.message}"
    return True, ""


def _patch(who: Identity, world: World, name: str, patch: dict[str, Any], *,
           status: bool = False) -> tuple[bool, str]:
    """A JSON merge patch, as agent/deviceplugins/slots and agent/discovery/device_health.py write
    them."""
    resource = InstanceResource.Status if status else InstanceResource
    return _outcome(lambda: _client(who).patch(
        resource, name, patch, namespace=world.namespace, patch_type=PatchType.MERGE))


def _delete(who: Identity, world: World, name: str) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).delete(InstanceResource, name,
                                                namespace=world.namespace))


def _create(who: Identity, body: dict[str, Any]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).create(InstanceResource.from_dict(body)))


def _patch_pod(who: Identity, name: str, patch: dict[str, Any]) -> tuple[bool, str]:
    """A JSON merge patch of a pod, as agent/deviceplugins/pod_annotations.py writes (and reads)
    them."""
    return _outcome(lambda: _client(who).patch(
        Pod, name, patch, namespace=SYSTEM_NAMESPACE, patch_type=PatchType.MERGE))


def _refused(outcome: tuple[bool, str], fragment: str) -> None:
    allowed, stderr = outcome
    assert not allowed, f"the write was allowed; expected a refusal saying {fragment!r}"
    assert stderr.startswith("403"), stderr
    assert DENIED in stderr, stderr
    assert fragment in stderr, stderr


def _allowed(outcome: tuple[bool, str]) -> None:
    allowed, stderr = outcome
    assert allowed, stderr


@pytest.fixture(scope="module")
def enforced(control_plane: ControlPlane, world: World) -> World:
    """The policy is enforced: the API server loads a new policy asynchronously."""
    cp = control_plane
    name = _instance(cp, world, nodes=[world.node_b], usage={0: ""})
    deadline = time.monotonic() + POLICY_ACTIVE_S
    while True:
        result = world.agent_a.kubectl(cp, "delete", INSTANCES, name, "-n", world.namespace,
                                       "--dry-run=server")
        if DENIED in result.stderr:
            return world
        assert result.returncode == 0 or "forbidden" not in result.stderr.lower(), result.stderr
        assert time.monotonic() < deadline, (
            f"the Instance policy was not enforced within {POLICY_ACTIVE_S}s: {result.stderr}")
        time.sleep(POLL_S)  # polling a condition with a deadline, not a synchronisation sleep


# -- spec.deviceUsage ------------------------------------------------------------------------


def test_agent_cannot_take_or_free_another_nodes_slot(control_plane: ControlPlane,
                                                       enforced: World) -> None:
    cp, w = control_plane, enforced
    name = _instance(cp, w, nodes=[w.node_a, w.node_b],
                     usage={0: w.node_b, 1: f"C:vdev-3:{w.node_b}", 2: ""})
    message = "only deviceUsage slots that are free or its own node's"
    _refused(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-0": w.node_a}}}),
             message)
    _refused(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-1": ""}}}),
             message)
    _refused(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-0": None}}}),
             message)
    # Claiming the free slot, for itself or its configuration plugin, and freeing it again.
    _allowed(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-2": w.node_a}}}))
    _allowed(_patch(w.agent_a, w, name,
                    {"spec": {"deviceUsage": {f"{name}-2": f"C:vdev-0:{w.node_a}"}}}))
    _allowed(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-2": ""}}}))
    # ...but never handing a free slot to another node.
    _refused(_patch(w.agent_a, w, name, {"spec": {"deviceUsage": {f"{name}-2": w.node_b}}}),
             message)


# -- spec.nodes, delete, local Instances -----------------------------------------------------


def test_agent_cannot_remove_or_add_another_node(control_plane: ControlPlane,
                                                 enforced: World) -> None:
    cp, w = control_plane, enforced
    name = _instance(cp, w, nodes=[w.node_a, w.node_b], usage={0: ""})
    message = "only its own node in spec.nodes"
    _refused(_patch(w.agent_a, w, name, {"spec": {"nodes": [w.node_a]}}), message)
    _refused(_patch(w.agent_a, w, name,
                    {"spec": {"nodes": [w.node_a, w.node_b, "rights-elsewhere"]}}), message)
    _allowed(_patch(w.agent_a, w, name, {"spec": {"nodes": [w.node_b]}}))
    _allowed(_patch(w.agent_a, w, name, {"spec": {"nodes": [w.node_b, w.node_a]}}))


def test_agent_deletes_only_an_instance_its_node_alone_holds(control_plane: ControlPlane,
                                                             enforced: World) -> None:
    cp, w = control_plane, enforced
    message = "delete only an Instance its own node alone holds"
    theirs = _instance(cp, w, nodes=[w.node_b], usage={0: ""})
    both = _instance(cp, w, nodes=[w.node_a, w.node_b], usage={0: ""})
    mine = _instance(cp, w, nodes=[w.node_a], usage={0: w.node_a})
    _refused(_delete(w.agent_a, w, theirs), message)
    _refused(_delete(w.agent_a, w, both), message)
    _allowed(_delete(w.agent_a, w, mine))


def test_agent_writes_another_nodes_local_instance_not_at_all(control_plane: ControlPlane,
                                                              enforced: World) -> None:
    cp, w = control_plane, enforced
    local_b = _instance(cp, w, nodes=[w.node_b], usage={0: ""}, shared=False)
    _refused(_patch(w.agent_a, w, local_b, {"spec": {"nodes": [w.node_b, w.node_a]}}),
             "a local (unshared) Instance only on its own node")
    _refused(_patch(w.agent_a, w, local_b,
                    {"spec": {"deviceUsage": {f"{local_b}-0": w.node_a}}}),
             "a local (unshared) Instance only on its own node")
    _refused(_patch(w.agent_a, w, local_b, {"status": {"unhealthy": {w.node_a: "x"}}},
                    status=True), "a local (unshared) Instance only on its own node")


def test_agent_creates_instances_for_its_own_node_only(enforced: World) -> None:
    w = enforced

    # As agent/discovery/instance_publisher.py creates them: owned by their Configuration (whose
    # absence only matters to the garbage collector, later).
    owner = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "name": "cam",
             "uid": str(uuid.uuid4())}

    def create(nodes: list[str], usage: str, *, shared: bool) -> tuple[bool, str]:
        name = f"new-{uuid.uuid4().hex[:6]}"
        body = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
                "metadata": {"name": name, "namespace": w.namespace,
                             "ownerReferences": [owner]},
                "spec": {"configurationName": "cam", "shared": shared, "nodes": nodes,
                         "deviceUsage": {f"{name}-0": usage}}}
        return _create(w.agent_a, body)

    # The first rule broken is the one named: another node in spec.nodes, local or shared.
    _refused(create([w.node_b], "", shared=False), "only its own node in spec.nodes")
    _refused(create([w.node_b], "", shared=True), "only its own node in spec.nodes")
    _refused(create([w.node_a], w.node_b, shared=True),
             "only deviceUsage slots that are free or its own node's")
    # A local Instance names its node from the start (no squatting a name for nobody).
    _refused(create([], "", shared=False),
             "local (unshared) Instance only with spec.nodes exactly its own node")
    _allowed(create([w.node_a], "", shared=False))
    _allowed(create([], "", shared=True))
    _allowed(create([w.node_a], "", shared=True))


def test_agent_cannot_change_a_device_it_does_not_hold(control_plane: ControlPlane,
                                                       enforced: World) -> None:
    cp, w = control_plane, enforced
    theirs = _instance(cp, w, nodes=[w.node_b], usage={0: ""})
    _refused(_patch(w.agent_a, w, theirs,
                    {"spec": {"brokerProperties": {"URL": "rtsp://attacker"}}}),
             "device fields only where its node holds it")
    _refused(_patch(w.agent_a, w, theirs, {"metadata": {"finalizers": ["x.io/stuck"]}}),
             "finalizers")


# -- status ----------------------------------------------------------------------------------


def test_agent_touches_only_its_own_nodes_reservations(control_plane: ControlPlane,
                                                       enforced: World) -> None:
    cp, w = control_plane, enforced
    name = f"cam-{uuid.uuid4().hex[:6]}"
    slot = f"{name}-{{}}".format
    name = _instance(
        cp, w, nodes=[w.node_a, w.node_b], usage={0: "", 1: "", 2: w.node_a, 3: ""}, name=name,
        status={"reservations": {slot(0): w.node_b, slot(2): w.node_b, slot(3): "rights-gone"}},
    )
    message = "reserve only unreserved slots or slots its node holds"
    _refused(_patch(w.agent_a, w, name, {"status": {"reservations": {slot(0): w.node_a}}},
                    status=True), message)
    _refused(_patch(w.agent_a, w, name, {"status": {"reservations": {slot(0): None}}},
                    status=True), message)
    _refused(_patch(w.agent_a, w, name, {"status": {"reservations": {slot(1): w.node_b}}},
                    status=True), message)
    # Unreserved; reserved for a node no longer listed; held by A: A may reserve them.
    _allowed(_patch(w.agent_a, w, name, {"status": {"reservations": {
        slot(1): w.node_a, slot(2): w.node_a, slot(3): w.node_a}}}, status=True))
    _allowed(_patch(w.agent_a, w, name, {"status": {"reservations": {slot(1): None}}},
                    status=True))


def test_agent_writes_only_its_own_demand_and_health(control_plane: ControlPlane,
                                                     enforced: World) -> None:
    cp, w = control_plane, enforced
    name = _instance(cp, w, nodes=[w.node_a, w.node_b], usage={0: ""},
                     status={"demand": {w.node_b: 2}, "unhealthy": {w.node_b: "fault 7"}})
    message = "only its own node's status.demand and status.unhealthy"
    for patch in ({"demand": {w.node_b: None}}, {"demand": {w.node_b: 9}},
                  {"unhealthy": {w.node_b: None}}, {"unhealthy": {"rights-other": "x"}}):
        _refused(_patch(w.agent_a, w, name, {"status": patch}, status=True), message)
    _allowed(_patch(w.agent_a, w, name,
                    {"status": {"demand": {w.node_a: 1}, "unhealthy": {w.node_a: "no signal"},
                                "used": 0}}, status=True))
    # The health mark the controller publishes shared devices by (agent/discovery/device_health.py).
    cp.kubectl("patch", "instances.edgeplug.io", name, "-n", w.namespace, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": {"reported": {w.node_b: True}}}))
    reported = "only its own node's status.reported"
    marks: list[dict[str, Any]] = [{"reported": {w.node_b: None}},
                                   {"reported": {w.node_b: False}},
                                   {"reported": {"rights-other": True}}]
    for mark in marks:
        _refused(_patch(w.agent_a, w, name, {"status": mark}, status=True), reported)
    _allowed(_patch(w.agent_a, w, name, {"status": {"reported": {w.node_a: True}}},
                    status=True))
    _allowed(_patch(w.agent_a, w, name, {"status": {"reported": {w.node_a: None}}},
                    status=True))


# -- tokens and Nodes ------------------------------------------------------------------------


def test_a_token_bound_to_no_node_changes_no_instance(control_plane: ControlPlane,
                                                      enforced: World) -> None:
    cp, w = control_plane, enforced
    name = _instance(cp, w, nodes=[], usage={0: ""})
    _refused(_patch(w.unbound, w, name, {"spec": {"nodes": [w.node_a]}}), "names no node")
    _refused(_delete(w.unbound, w, name), "names no node")


def test_agent_cannot_label_another_node(control_plane: ControlPlane, enforced: World) -> None:
    cp, w = control_plane, enforced
    label = {"metadata": {"labels": {"edgeplug.io/cam": "true"}}}
    other = w.agent_a.kubectl(cp, "patch", "node", w.node_b, "--type=merge",
                              "-p", json.dumps(label))
    assert other.returncode != 0
    assert "only the Node its pod runs on" in other.stderr, other.stderr
    own = w.agent_a.kubectl(cp, "patch", "node", w.node_a, "--type=merge", "-p", json.dumps(label))
    assert own.returncode == 0, own.stderr



def _node_status(cp: ControlPlane, node: str, capacity: dict[str, str]) -> None:
    """What a kubelet reports: device resources in capacity and allocatable."""
    cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"capacity": {**capacity, "cpu": "4"},
                    "allocatable": {**capacity, "cpu": "4"}}}))


def _patch_node_status(who: Identity, node: str, patch: dict[str, Any]) -> tuple[bool, str]:
    """A JSON merge patch of a Node's status, as agent/deviceplugins/crossnode/handoff.py writes
    it."""
    return _outcome(lambda: _client(who).patch(
        Node.Status, node, patch, patch_type=PatchType.MERGE))


def test_agent_sets_only_its_own_nodes_device_allocatable_within_capacity(
        control_plane: ControlPlane, enforced: World) -> None:
    """The hand-off gate lowers its Node's count of a device resource before it gives a slot
    away, and restores it; nothing else of any Node's status is the agent's to write."""
    cp, w = control_plane, enforced
    cam = "edgeplug.io/cam-1a2b3c"
    for node in (w.node_a, w.node_b):
        _node_status(cp, node, {cam: "2", "edgeplug.io/cam": "2"})

    def allocatable(**values: str) -> dict[str, Any]:
        return {"status": {"allocatable": values}}

    deadline = time.monotonic() + POLICY_ACTIVE_S
    while (outcome := _patch_node_status(w.agent_a, w.node_b, allocatable(**{cam: "1"})))[0]:
        assert time.monotonic() < deadline, "the Node status policy was not enforced"
        time.sleep(POLL_S)  # polling a condition with a deadline
    _refused(outcome, "only the status of the Node its pod runs on")
    _refused(_patch_node_status(w.unbound, w.node_a, allocatable(**{cam: "1"})),
             "only the status of the Node its pod runs on")
    beyond = "each at most the Node's capacity of it"
    for wrong in (allocatable(**{cam: "3"}),
                  allocatable(cpu="3"),
                  allocatable(**{"edgeplug.io/other": "1"})):
        _refused(_patch_node_status(w.agent_a, w.node_a, wrong), beyond)
    for wrong in ({"status": {"capacity": {cam: "9"}}},
                  {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}):
        _refused(_patch_node_status(w.agent_a, w.node_a, wrong), "only its Node's edgeplug.io/")
    _allowed(_patch_node_status(w.agent_a, w.node_a, allocatable(**{cam: "1"})))
    _allowed(_patch_node_status(w.agent_a, w.node_a, allocatable(**{"edgeplug.io/cam": "0"})))
    _allowed(_patch_node_status(w.agent_a, w.node_a, allocatable(**{cam: "2"})))
    node = json.loads(cp.kubectl("get", "node", w.node_a, "-o", "json").stdout)
    assert node["status"]["allocatable"] == {cam: "2", "edgeplug.io/cam": "0", "cpu": "4"}
    assert node["status"]["capacity"] == {cam: "2", "edgeplug.io/cam": "2", "cpu": "4"}


# -- pods ------------------------------------------------------------------------------------


def _pod_on(cp: ControlPlane, node: str) -> str:
    """A pod bound to ``node`` (no kubelet runs it), as the admin creates it."""
    name = f"npu-job-{uuid.uuid4().hex[:6]}"
    _apply(cp, {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE,
                             "labels": {"app": "train"}},
                "spec": {"nodeName": node, "serviceAccountName": AGENT_ACCOUNT,
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "train", "image": "train:1"}]}})
    return name


def test_agent_annotates_only_its_own_nodes_pods_with_huaweis_keys(
        control_plane: ControlPlane, enforced: World) -> None:
    cp, w = control_plane, enforced
    mine, theirs = _pod_on(cp, w.node_a), _pod_on(cp, w.node_b)
    ascend = {"metadata": {"annotations": {"huawei.com/Ascend910": "Ascend910-0,Ascend910-1"}}}
    other_node = "may change only pods bound to the Node its pod runs on"
    other_key = "may change only Huawei's Ascend annotations of a pod"
    try:
        # The pod policy is loaded apart from the Instance policy ``enforced`` waited for.
        deadline = time.monotonic() + POLICY_ACTIVE_S
        while (outcome := _patch_pod(w.agent_a, theirs, ascend))[0]:
            assert time.monotonic() < deadline, "the pod policy was not enforced"
            time.sleep(POLL_S)  # polling a condition with a deadline
        _refused(outcome, other_node)
        # Nor may it read another node's pod through the empty patch it reads its own with.
        _refused(_patch_pod(w.agent_a, theirs, {}), other_node)
        _refused(_patch_pod(w.unbound, mine, ascend), other_node)
        _allowed(_patch_pod(w.agent_a, mine, {}))
        _allowed(_patch_pod(w.agent_a, mine, ascend))
        _allowed(_patch_pod(w.agent_a, mine, {"metadata": {"annotations": {
            "huawei.com/AscendReal": "Ascend910-0,Ascend910-1",
            "ascend.kubectl.kubernetes.io/ascend-910-configuration": '{"pod_name":"x"}'}}}))
        for patch in ({"metadata": {"annotations": {"team": "edge"}}},
                      {"metadata": {"annotations": {"huawei.com/Ascend910": None}}},
                      {"metadata": {"labels": {"app": "stolen"}}},
                      {"metadata": {"finalizers": ["x.io/stuck"]}}):
            _refused(_patch_pod(w.agent_a, mine, patch), other_key)
        pod = cp.kubectl("get", "pod", mine, "-n", SYSTEM_NAMESPACE, "-o", "json")
        annotations = json.loads(pod.stdout)["metadata"]["annotations"]
        assert annotations["huawei.com/Ascend910"] == "Ascend910-0,Ascend910-1"
        assert "team" not in annotations
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false", mine, theirs,
                   check=False)
