"""A stolen node agent token, tried as an attacker would: every write that would reach past its
own node is refused by the API server, and the writes the agent really makes still pass.

What a node's agent may not do. With deploy/manifests and deploy/dra applied as a user applies them
(the agent's RBAC and admission policies, unchanged files) and the agent's ServiceAccount token
bound to a pod on node A (the node name in ``authentication.kubernetes.io/node-name``, as its
DaemonSet pod's token has it), each attempt below is a real request to the real API server:

- another node's shared Instance: owner references pointed at a missing owner (the garbage
  collector would delete it and its brokers), labels, annotations, finalizers;
- the controller's ``status.claims`` (1024 withholds every slot) and ``status.servedBy``;
- a local Instance created for another node, or for none (squatting), or dressed up (labels,
  finalizers, another owner); another node's fallback name (``<name>.<node>``, which a node whose
  Akri name was squatted publishes under, and serves: its kubelet is offered the slot);
- ``nodes/status`` carrying metadata: NodeRestriction's labels, node roles, another hostname,
  annotations (the controller's pinned-demand among them);
- a ResourceSlice in another node's local pool (a newer generation hides the real one), or a
  local pool dressed as a shared one; any slice of a shared device's pool (the controller's):
  a newer generation listing node A, an update or a delete of the controller's slice;
- every condition of a Configuration's status replaced, another node's condition, the
  controller's fields;
- Events posing as the controller or another node, or about other objects;
- through the controller: an Instance listing node A for a Configuration whose nodeSelector
  selects only node B gets no broker on A, and the Configuration's status names it.

Each refusal asserts the policy's own message; beside each, the write the agent's code makes
(its real functions where they are small: the condition reporter, the Event, the publisher)
passes. What stays reachable, and why, is in deploy/README.md, "What a node's agent can do".
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Event, Node, Secret, ServiceAccount
from lightkube.types import PatchType

from agent.deviceplugins.slots.service import serve_device_plugins
from agent.discovery.events import ConfigurationReporter, emit_event
from agent.discovery.instance_placement import REASON_NAME_COLLISION, REASON_NAME_TAKEN
from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.node_devices import NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.dra.claim_status import ResourceClaimResource
from agent.dra.publisher import ResourceSliceResource
from agent.kube.client import ConfigurationResource, InstanceResource, as_dict, field_manager
from agent.kube.node_account import NodeAccount
from agent.kube.node_instances import serves_label
from agent.metrics import AgentMetrics
from controller.brokers import status as controller_status
from crds import dra
from crds.configuration import Configuration
from crds.naming import (
    device_digest,
    fallback_instance_name,
    instance_digest,
    instance_name,
    instance_names,
    instance_resource_name,
)
from discovery_handlers.contract import Device
from discovery_handlers.registry import load_handler
from tests.harness import agent_process as harness
from tests.harness import controller_process as ctl
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.kube_waits import wait_allocatable
from tests.harness.node_emulator import NodeEmulator
from tests.harness.offer_grants import may_offer, offer_grants, wait_offer
from tests.harness.service_accounts import (
    Identity,
    agent_on,
    apply_compat,
    kubelet_kubeconfig,
    mint,
    pod_bound,
    release_agent_pod,
)
from tests.harness.stand_ins import node_dirs, running_node

pytestmark = pytest.mark.timeout(240)

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
INSTANCES = "instances.edgeplug.io"
#: A newly applied policy is type-checked and loaded asynchronously by the API server.
POLICY_ACTIVE_S = 60.0
POLL_S = 0.2
#: What the API server answers when a ValidatingAdmissionPolicy denies a request.
DENIED = "denied request"
FIELD_MANAGER = "edgeplug-attack-test"
WAIT_S = 60.0


def agent_manifests() -> list[Path]:
    """The files of deploy/manifests a user applies that hold the agent's rights: the
    kustomization's namespace and agent-* files, except the DaemonSet (no kubelet runs it)."""
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    names = [n for n in listed if n == "namespace.yaml"
             or (n.startswith("agent-") and n != "agent-daemonset.yaml")]
    assert "agent-report-policy.yaml" in names
    assert "agent-instance-policy.yaml" in names
    return [MANIFESTS / n for n in names]


@dataclass(frozen=True)
class World:
    namespace: str
    node_a: str
    node_b: str
    agent_a: Identity
    agent_b: Identity
    unbound: Identity
    #: The owner reference an Instance of Configuration ``cam`` carries (as the agent writes it).
    owner: dict[str, Any]


def _apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=admin",
               "-f", "-", stdin=json.dumps(obj))


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    cp = control_plane
    for path in agent_manifests():
        cp.kubectl("apply", "-f", str(path))
    cp.kubectl("apply", "-k", str(DRA_MANIFESTS))
    # The nodes/status attacks are tried on the compatibility mode's grant (without it RBAC
    # alone refuses them: tests/integration/test_agent_rights_modes.py).
    apply_compat(cp)
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"attack-a-{suffix}", f"attack-b-{suffix}"
    namespace = f"attack-{suffix}"
    for node in (node_a, node_b):
        _apply(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "labels": {"kubernetes.io/hostname": node, "site": node}}})
    cp.kubectl("create", "namespace", namespace)
    _apply(cp, debug_echo_configuration("cam", descriptions=["c0"]) | {
        "metadata": {"name": "cam", "namespace": namespace}})
    uid = cp.kubectl("get", "configurations.edgeplug.io", "cam", "-n", namespace,
                     "-o", "jsonpath={.metadata.uid}").stdout.strip()
    owner = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "name": "cam",
             "uid": uid, "controller": True, "blockOwnerDeletion": True}
    folder = tmp_path_factory.mktemp("attacks")
    agent_a = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_a,
                        folder=folder)
    agent_b = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_b,
                        folder=folder)
    unbound = mint(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT,
                   path=folder / "unbound")
    try:
        with offer_grants(cp, folder):
            wait_offer(cp, namespace, "cam", node_a)
            yield World(namespace, node_a, node_b, agent_a, agent_b, unbound, owner)
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"{AGENT_ACCOUNT}-{node_a}", f"{AGENT_ACCOUNT}-{node_b}", check=False)
        cp.kubectl("delete", "resourceslices", "-l",
                   f"edgeplug.io/node in ({node_a},{node_b})", check=False)
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


# -- requests --------------------------------------------------------------------------------


def _client(who: Identity) -> Client:
    return Client(KubeConfig.from_file(str(who.kubeconfig)), field_manager=FIELD_MANAGER)


def _outcome(call: Callable[[], object]) -> tuple[bool, str]:
    try:
        call()
    except ApiError as error:
        return False, f"{error.status.code}: {error.status.message}"
    return True, ""


def _refused(outcome: tuple[bool, str], fragment: str) -> None:
    allowed, message = outcome
    assert not allowed, f"the write was allowed; expected a refusal saying {fragment!r}"
    assert message.startswith("403"), message
    assert DENIED in message, message
    assert fragment in message, message


def _allowed(outcome: tuple[bool, str]) -> None:
    allowed, message = outcome
    assert allowed, message


def _until_refused(call: Callable[[], tuple[bool, str]], what: str) -> tuple[bool, str]:
    """The first refusal by a policy (which the API server loads asynchronously)."""
    deadline = time.monotonic() + POLICY_ACTIVE_S
    while True:
        outcome = call()
        if not outcome[0] and DENIED in outcome[1]:
            return outcome
        assert time.monotonic() < deadline, f"{what}: not enforced in time: {outcome}"
        time.sleep(POLL_S)  # polling a condition with a deadline, not a synchronisation sleep


def _patch(who: Identity, w: World, name: str, patch: dict[str, Any], *,
           status: bool = False) -> tuple[bool, str]:
    resource = InstanceResource.Status if status else InstanceResource
    return _outcome(lambda: _client(who).patch(
        resource, name, patch, namespace=w.namespace, patch_type=PatchType.MERGE))


def _create(who: Identity, body: dict[str, Any]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).create(InstanceResource.from_dict(body)))


def _instance(cp: ControlPlane, w: World, *, nodes: list[str], shared: bool = True,
              status: dict[str, Any] | None = None, name: str = "",
              metadata: dict[str, Any] | None = None, configuration: str = "cam",
              owner: dict[str, Any] | None = None) -> str:
    """An Instance of ``configuration`` (owned by it: ``owner``, ``cam``'s by default) as the
    agents of ``nodes`` would have left it (written by the admin)."""
    name = name or f"cam-{uuid.uuid4().hex[:6]}"
    _apply(cp, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "namespace": w.namespace,
                     "ownerReferences": [owner or w.owner], **(metadata or {})},
        "spec": {"configurationName": configuration,
                 "cdiName": f"edgeplug.io/{configuration}={name[-6:]}",
                 "capacity": 2, "shared": shared, "nodes": nodes,
                 "brokerProperties": {"URL": "rtsp://cam"},
                 "deviceUsage": {f"{name}-0": "", f"{name}-1": ""}},
    })
    if status:
        cp.kubectl("patch", INSTANCES, name, "-n", w.namespace, "--subresource=status",
                   "--type=merge", "-p", json.dumps({"status": status}))
    return name


def _body(w: World, name: str, *, nodes: list[str], shared: bool,
          metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """An Instance as agent/discovery/instance_publisher.py creates it."""
    meta = {"name": name, "namespace": w.namespace, "ownerReferences": [w.owner]}
    spec: dict[str, Any] = {"configurationName": "cam", "cdiName": f"edgeplug.io/cam={name[-6:]}",
                            "capacity": 1, "brokerProperties": {}, "shared": shared,
                            "deviceUsage": {f"{name}-0": ""}}
    if nodes:
        spec["nodes"] = nodes
    return {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
            "metadata": meta | (metadata or {}), "spec": spec}


def _get(cp: ControlPlane, *args: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(cp.kubectl("get", *args, "-o", "json").stdout)
    return found


@pytest.fixture(scope="module")
def enforced(control_plane: ControlPlane, world: World) -> World:
    """The Instance policy is enforced (the others are waited for where first used)."""
    theirs = _instance(control_plane, world, nodes=[world.node_b])
    _until_refused(lambda: _patch(world.agent_a, world, theirs,
                                  {"metadata": {"labels": {"x": "y"}}}), "the Instance policy")
    return world


# -- Instances: metadata ---------------------------------------------------------------------


METADATA = "may not change an Instance's metadata"


def test_another_nodes_shared_instance_keeps_its_metadata(control_plane: ControlPlane,
                                                          enforced: World) -> None:
    cp, w = control_plane, enforced
    # Shared with node A too: A is a holder, and still may not touch the metadata.
    name = _instance(cp, w, nodes=[w.node_b, w.node_a],
                     metadata={"labels": {"team": "b"}, "annotations": {"note": "b's"}})
    missing = {**w.owner, "uid": str(uuid.uuid4())}
    for patch in ({"metadata": {"ownerReferences": [missing]}},
                  {"metadata": {"ownerReferences": None}},
                  {"metadata": {"labels": {"team": "a"}}},
                  {"metadata": {"labels": {"team": None}}},
                  {"metadata": {"annotations": {"note": None, "other": "x"}}},
                  {"metadata": {"finalizers": ["attack.io/stuck"]}}):
        _refused(_patch(w.agent_a, w, name, patch), METADATA)
    # The same through a server-side apply (the agent's own kind of write): another owner
    # beside the real one (not its controller: the API server's own validation allows one).
    forged = _body(w, name, nodes=[w.node_a], shared=True,
                   metadata={"ownerReferences": [{**missing, "controller": False}]})
    _refused(_outcome(lambda: _client(w.agent_a).patch(
        InstanceResource, name, forged, namespace=w.namespace, patch_type=PatchType.APPLY,
        field_manager=field_manager(w.node_a), force=True)), METADATA)
    stored = _get(cp, INSTANCES, name, "-n", w.namespace)["metadata"]
    assert [r["uid"] for r in stored["ownerReferences"]] == [w.owner["uid"]]
    assert stored["labels"] == {"team": "b"}
    assert "finalizers" not in stored
    # Control: the agent's apply of its own body (same owner reference, its node) passes.
    body = _body(w, name, nodes=[w.node_a], shared=True)
    del body["spec"]["deviceUsage"]
    _allowed(_outcome(lambda: _client(w.agent_a).patch(
        InstanceResource, name, body, namespace=w.namespace, patch_type=PatchType.APPLY,
        field_manager=field_manager(w.node_a), force=True)))


def test_a_node_adds_and_removes_only_its_own_instance_label(control_plane: ControlPlane,
                                                            enforced: World) -> None:
    """The label that makes the API server send an Instance to a node's agent
    (agent/kube/node_instances.py): node A cannot hide an Instance from node B (remove B's label)
    nor show B another one (add B's label), on create or after; its own label it may."""
    cp, w = control_plane, enforced
    label_a, label_b = serves_label(w.node_a), serves_label(w.node_b)
    name = _instance(cp, w, nodes=[w.node_b, w.node_a],
                     metadata={"labels": {label_b: "true"}})
    for patch in ({"metadata": {"labels": {label_b: None}}},
                  {"metadata": {"labels": {label_b: "false"}}},
                  {"metadata": {"labels": {label_a: "true", label_b: None}}}):
        _refused(_patch(w.agent_a, w, name, patch), METADATA)
    _refused(_patch(w.agent_a, w, name, {"metadata": {"labels": {label_a: "yes"}}}),
             'own Instance label takes the value "true" only')
    theirs = _instance(cp, w, nodes=[w.node_b])
    _refused(_patch(w.agent_a, w, theirs, {"metadata": {"labels": {label_b: "true"}}}),
             METADATA)
    _refused(_create(w.agent_a, _body(w, f"new-{uuid.uuid4().hex[:6]}", nodes=[w.node_a],
                                      shared=False, metadata={"labels": {label_b: "true"}})),
             "only owned by the Configuration it names")
    # Controls: its own label added and removed (merge patches, as agent/kube/node_instances.py
    # writes them), through an apply with its node, and on create.
    _allowed(_patch(w.agent_a, w, name, {"metadata": {"labels": {label_a: "true"}}}))
    _allowed(_patch(w.agent_a, w, name, {"metadata": {"labels": {label_a: None}}}))
    body = _body(w, name, nodes=[w.node_a], shared=True,
                 metadata={"labels": {label_a: "true"}})
    del body["spec"]["deviceUsage"]
    _allowed(_outcome(lambda: _client(w.agent_a).patch(
        InstanceResource, name, body, namespace=w.namespace, patch_type=PatchType.APPLY,
        field_manager=field_manager(w.node_a), force=True)))
    stored = _get(cp, INSTANCES, name, "-n", w.namespace)["metadata"]["labels"]
    assert stored == {label_a: "true", label_b: "true"}
    _allowed(_create(w.agent_a, _body(w, f"new-{uuid.uuid4().hex[:6]}", nodes=[w.node_a],
                                      shared=False, metadata={"labels": {label_a: "true"}})))


def test_status_fields_the_controller_owns_are_refused(control_plane: ControlPlane,
                                                       enforced: World) -> None:
    cp, w = control_plane, enforced
    message = "may not write status.claims or status.servedBy"
    theirs = _instance(cp, w, nodes=[w.node_b, w.node_a], status={"claims": 1, "servedBy": "dra"})
    mine = _instance(cp, w, nodes=[w.node_a], shared=False, status={"claims": 2})
    for name in (theirs, mine):
        for patch in ({"claims": 1024}, {"claims": None}, {"servedBy": "device-plugin"},
                      {"claims": 0, "demand": {w.node_a: 1}}):
            _refused(_patch(w.agent_a, w, name, {"status": patch}, status=True), message)
    # Control: the agent's own status writes beside the controller's fields.
    _allowed(_patch(w.agent_a, w, theirs, {"status": {
        "demand": {w.node_a: 1}, "unhealthy": {w.node_a: "no signal"}, "used": 0}}, status=True))
    assert _get(cp, INSTANCES, theirs, "-n", w.namespace)["status"]["claims"] == 1


# -- Instances: local ones, created -----------------------------------------------------------


def test_a_local_instance_is_created_only_for_the_node_that_creates_it(
        enforced: World) -> None:
    w = enforced

    def new(**kwargs: Any) -> dict[str, Any]:
        return _body(w, f"new-{uuid.uuid4().hex[:6]}", **kwargs)

    local_own = "local (unshared) Instance only with spec.nodes exactly its own node"
    _refused(_create(w.agent_a, new(nodes=[], shared=False)), local_own)
    _refused(_create(w.agent_a, new(nodes=[w.node_b], shared=False)),
             "only its own node in spec.nodes")
    _refused(_create(w.agent_a, new(nodes=[w.node_a, w.node_b], shared=False)),
             "only its own node in spec.nodes")
    dressed = "only owned by the Configuration it names"
    other_owner = {**w.owner, "name": "other", "uid": str(uuid.uuid4())}
    dressings: list[dict[str, Any]] = [
        {"labels": {"edgeplug.io/node": w.node_b}},
        {"labels": {serves_label(w.node_b): "true"}},
        {"annotations": {"x": "y"}},
        {"finalizers": ["attack.io/stuck"]},
        {"ownerReferences": []},
        {"ownerReferences": [other_owner]},
        {"ownerReferences": [w.owner, {**other_owner, "controller": False}]},
        {"ownerReferences": [{**w.owner, "kind": "Node", "apiVersion": "v1"}]},
    ]
    for metadata in dressings:
        _refused(_create(w.agent_a, new(nodes=[w.node_a], shared=False, metadata=metadata)),
                 dressed)
    _refused(_create(w.unbound, new(nodes=[w.node_a], shared=False)), "names no node")
    # Controls: what agent/discovery/instance_publisher.py creates, local (naming its node) and
    # shared (no node yet: the apply that follows adds it).
    _allowed(_create(w.agent_a, new(nodes=[w.node_a], shared=False)))
    _allowed(_create(w.agent_a, new(nodes=[], shared=True)))


def _to_squat(cp: ControlPlane, w: World, prefix: str, ids: list[str], *, shared: bool
              ) -> tuple[str, Callable[..., dict[str, Any]]]:
    """A new debugEcho Configuration of devices ``ids``, and a maker of Instance bodies it owns
    (as agent/discovery/instance_publisher.py creates them)."""
    cfg_name = f"{prefix}-{uuid.uuid4().hex[:4]}"
    _apply(cp, debug_echo_configuration(cfg_name, descriptions=ids, shared=shared)
           | {"metadata": {"name": cfg_name, "namespace": w.namespace}})
    cfg_obj = _get(cp, "configurations.edgeplug.io", cfg_name, "-n", w.namespace)
    owner = {**w.owner, "name": cfg_name, "uid": cfg_obj["metadata"]["uid"]}

    def body(name: str, *, nodes: list[str], shared: bool = False) -> dict[str, Any]:
        made = _body(w, name, nodes=nodes, shared=shared)
        made["metadata"]["ownerReferences"] = [owner]
        made["spec"]["configurationName"] = cfg_name
        return made

    return cfg_name, body


async def test_a_squatted_local_name_sends_the_device_to_its_nodes_fallback_name(
        control_plane: ControlPlane, enforced: World, kube: AsyncClient, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Local names are Akri's 3-byte digest of device id and node, which the API server cannot
    recompute, so node A's token can still create the Instance name node B's local device will
    want (local, for A, or shared, for no node). Node B (a kubelet stand-in, the agent's
    device-plugin side and its real publisher, all on B's pod-bound token) then publishes that
    device as ``<name>.<B>``, which A's token may not create, and serves it; said once; kept
    across a restart of the publisher (no second Instance) and after the squat is deleted
    (moving a served device is churn)."""
    cp, w = control_plane, enforced
    caplog.set_level(logging.WARNING, logger="agent.discovery.instance_placement")
    cfg_name, body = _to_squat(cp, w, "squat", ["d1", "d2", "d3"], shared=False)
    with node_dirs() as dirs:
        async with running_node(NodeEmulator, cp.kubeconfig, dirs) as node:
            b = node.node_name
            agent_b = await asyncio.to_thread(agent_on, cp, b, tmp_path)
            client = AsyncClient(KubeConfig.from_file(str(agent_b.kubeconfig)))
            table = NodeDeviceTable()
            plugins = asyncio.create_task(serve_device_plugins(
                client=client, node_name=b, plugin_dir=dirs.plugin_dir,
                pod_resources_socket=None, devices=table, metrics=AgentMetrics()))
            try:
                await _squat_and_fallback(cp, w, kube, client, table, cfg_name, b, body, caplog)
            finally:
                plugins.cancel()
                await asyncio.gather(plugins, return_exceptions=True)
                await client.close()
                release_agent_pod(cp, b)


async def _squat_and_fallback(
        cp: ControlPlane, w: World, kube: AsyncClient, client: AsyncClient,
        table: NodeDeviceTable, cfg_name: str, b: str,
        body: Callable[..., dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    digest = instance_digest("d1", shared=False, node=b)
    wanted = instance_name(cfg_name, "d1", shared=False, node=b)
    fallback = fallback_instance_name(cfg_name, digest, b)
    other = instance_name(cfg_name, "d2", shared=False, node=b)
    third = instance_name(cfg_name, "d3", shared=False, node=b)
    third_fallback = f"{third}.{b}"
    assert fallback == f"{wanted}.{b}"
    # The squat itself still passes (the policy cannot tell whose digest a name is), as a
    # local Instance of A's or as a shared one of no node (which B may not make local) ...
    _allowed(_create(w.agent_a, body(wanted, nodes=[w.node_a])))
    _allowed(_create(w.agent_a, body(third, nodes=[], shared=True)))
    # ... but B's fallback name is B's alone: not local for A, not shared, not with more after
    # B's name (all after the first '.' is the node, not a suffix of it).
    fallback_own = "named <name>.<node> (a local device's fallback name) only for its own node"
    _refused(_create(w.agent_a, body(fallback, nodes=[w.node_a])), fallback_own)
    _refused(_create(w.agent_a, body(fallback, nodes=[], shared=True)), fallback_own)
    _refused(_create(w.agent_a, body(f"{fallback}.{w.node_a}", nodes=[w.node_a])),
             fallback_own)
    _refused(_create(w.agent_a, body(f"{wanted}.{w.node_a}", nodes=[], shared=True)),
             fallback_own)
    # Control: A's own fallback form of that name, local, for A.
    _allowed(_create(w.agent_a, body(f"{wanted}.{w.node_a}", nodes=[w.node_a])))
    cp.kubectl("delete", INSTANCES, f"{wanted}.{w.node_a}", "-n", w.namespace)

    devices = [Device(id=d, properties={"DEBUG_ECHO_DESCRIPTION": d})
               for d in ("d1", "d2", "d3")]

    async def run_publisher() -> InstancePublisher:
        """One run of node B's discovery side: adopt, then publish and resync twice."""
        cfg = Configuration.from_object(as_dict(
            await client.get(ConfigurationResource, cfg_name, namespace=w.namespace)))
        publisher = InstancePublisher(
            client=client, node_name=b, configuration=cfg, devices=table,
            labels=NodeLabels(client=client, node_name=b), metrics=AgentMetrics())
        await publisher.adopt()
        for _ in range(2):
            await publisher.publish(load_handler("debugEcho"), None, devices, shared=False)
            await publisher.resync()
        await publisher.close()
        return publisher

    def listed() -> dict[str, tuple[list[str], str]]:
        """``kubectl get instances``: this Configuration's, by name: (nodes, uid)."""
        found = _get(cp, INSTANCES, "-n", w.namespace)["items"]
        return {i["metadata"]["name"]: (i["spec"].get("nodes", []), i["metadata"]["uid"])
                for i in found if i["spec"]["configurationName"] == cfg_name}

    def said(name: str = wanted) -> list[str]:
        return [r.getMessage() for r in caplog.records if name in r.getMessage()]

    def events() -> list[dict[str, Any]]:
        found = _get(cp, "events", "-n", w.namespace)["items"]
        return [e for e in found if e.get("reason") == REASON_NAME_TAKEN
                and wanted in e.get("message", "")]

    publisher = await run_publisher()
    mine = {fallback, other, third_fallback}
    assert set(publisher.owned) == mine
    first = listed()
    assert {n: nodes for n, (nodes, _uid) in first.items()} == {
        wanted: [w.node_a], fallback: [b], other: [b], third: [], third_fallback: [b]}
    shown = cp.kubectl("get", INSTANCES, "-n", w.namespace).stdout
    assert fallback in shown, shown
    # Served: B's kubelet is offered the fallback Instance's slot under its own resource.
    resource = instance_resource_name(fallback)
    await wait_allocatable(kube, b, resource, "1")
    await wait_allocatable(kube, b, instance_resource_name(other), "1")
    [message] = said()
    assert f"held by an Instance of node(s) {w.node_a}; published as {fallback} instead" \
        in message, message
    [event] = events()
    assert fallback in event["message"]
    assert event["reportingInstance"] == b
    [message] = said(third)
    assert f"held by a shared Instance of node(s) none; published as {third_fallback}" \
        in message, message
    await wait_allocatable(kube, b, instance_resource_name(third_fallback), "1")

    # A restart of B's discovery side adopts the fallback: same Instance, nothing new, no word.
    publisher = await run_publisher()
    assert set(publisher.owned) == mine
    assert listed() == first
    assert len(said()) == 1

    # The squat goes: B stays on its fallback (its pods keep their slots); the Akri name stays
    # free.
    cp.kubectl("delete", INSTANCES, wanted, "-n", w.namespace)
    publisher = await run_publisher()
    assert set(publisher.owned) == mine
    assert listed() == {n: v for n, v in first.items() if n != wanted}
    await wait_allocatable(kube, b, resource, "1")
    assert len(said()) == 1
    assert len(events()) == 1


async def test_a_squatted_shared_name_costs_the_other_nodes_that_device_only(
        control_plane: ControlPlane, enforced: World, caplog: pytest.LogCaptureFixture) -> None:
    """What stays reachable: a shared device's names (its Akri name and its collision name,
    both digests of its id alone, the same on every node) can be created by node A's token as
    local Instances of A's. With both held, node B's real publisher publishes B's other
    devices and says, once, which name is held; before, its refused apply (``shared`` is
    immutable) ended every pass before any device was served. Once the collision name is free,
    B publishes the device there (every node that sees it computes the same name)."""
    cp, w = control_plane, enforced
    caplog.set_level(logging.WARNING, logger="agent.discovery.instance_placement")
    cfg_name, body = _to_squat(cp, w, "shsq", ["s1", "s2"], shared=True)
    wanted, second = instance_names(cfg_name, "s1", shared=True, node=w.node_b)
    _allowed(_create(w.agent_a, body(wanted, nodes=[w.node_a])))
    _allowed(_create(w.agent_a, body(second, nodes=[w.node_a])))
    client = AsyncClient(KubeConfig.from_file(str(w.agent_b.kubeconfig)))
    try:
        cfg = Configuration.from_object(as_dict(
            await client.get(ConfigurationResource, cfg_name, namespace=w.namespace)))
        table = NodeDeviceTable()
        publisher = InstancePublisher(
            client=client, node_name=w.node_b, configuration=cfg, devices=table,
            labels=NodeLabels(client=client, node_name=w.node_b), metrics=AgentMetrics())
        devices = [Device(id=d, properties={"DEBUG_ECHO_DESCRIPTION": d}) for d in ("s1", "s2")]
        for _ in range(2):
            await publisher.publish(load_handler("debugEcho"), None, devices, shared=True)
            await publisher.resync()
        other = instance_name(cfg_name, "s2", shared=True, node=w.node_b)
        assert set(publisher.owned) == {other}
        assert [instance for _namespace, instance in table.snapshot()] == [other]
        assert _get(cp, INSTANCES, other, "-n", w.namespace)["spec"]["nodes"] == [w.node_b]
        assert _get(cp, INSTANCES, wanted, "-n", w.namespace)["spec"]["nodes"] == [w.node_a]

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if wanted in r.getMessage()]

        assert len(said()) == 1, said()
        assert (f"a shared device's Instance name {wanted} is held by a local Instance of "
                f"node(s) {w.node_a}; the device is not published") in said()[0]
        listed = _get(cp, "events", "-n", w.namespace)["items"]
        assert [e["reportingInstance"] for e in listed
                if e.get("reason") == REASON_NAME_TAKEN and wanted in e["message"]] == [w.node_b]
        # The collision name's squat goes: B publishes s1 there, and says nothing more.
        cp.kubectl("delete", INSTANCES, second, "-n", w.namespace)
        await publisher.resync()
        assert set(publisher.owned) == {other, second}
        moved = _get(cp, INSTANCES, second, "-n", w.namespace)["spec"]
        assert (moved["nodes"], moved["shared"], moved["brokerProperties"]) == (
            [w.node_b], True, {"DEBUG_ECHO_DESCRIPTION": "s1"})
        assert len(said()) == 1, said()
        await publisher.close()
    finally:
        await client.close()


def _colliding_pair(configuration: str) -> tuple[str, str]:
    """Two debugEcho ids whose shared Akri names under ``configuration`` are alike, the one
    with the larger device digest first (alone, the smaller would take the Akri name)."""
    seen: dict[str, str] = {}
    for index in range(100_000):
        device = f"d{index}"
        name = instance_name(configuration, device, shared=True, node="")
        if name in seen:
            pair = sorted((seen[name], device),
                          key=lambda d: device_digest(d, shared=True, node=""))
            return pair[1], pair[0]
        seen[name] = device
    raise AssertionError(f"no colliding ids under {configuration}")


async def test_colliding_shared_devices_two_nodes_agree_and_a_digest_is_kept(
        control_plane: ControlPlane, enforced: World) -> None:
    """Two devices of one Akri name, published by both nodes' real publishers on their
    pod-bound tokens: every write they make passes the Instance policy. Node A, seeing only the
    first, wins the Akri name for it; node B, seeing both, agrees (the API server's record
    counts, not its own order) and publishes the second under its collision name, a name
    without '.' any node may create, which A joins once it sees that device too. What the
    record protects: a node that does not hold an Instance may not write its deviceDigest, and
    no holder may change it once set (the CRD's rule)."""
    cp, w = control_plane, enforced
    # The publishers are handed the device lists; the Configuration's own list is not read.
    cfg_name, _ = _to_squat(cp, w, "coll", ["unread"], shared=True)
    first, second = _colliding_pair(cfg_name)
    akri, _ = instance_names(cfg_name, first, shared=True, node="")
    _, other = instance_names(cfg_name, second, shared=True, node="")
    devices = {d: Device(id=d, properties={"DEBUG_ECHO_DESCRIPTION": d}) for d in (first, second)}
    clients = {n: AsyncClient(KubeConfig.from_file(str(who.kubeconfig)))
               for n, who in ((w.node_a, w.agent_a), (w.node_b, w.agent_b))}
    try:
        cfg = Configuration.from_object(as_dict(
            await clients[w.node_a].get(ConfigurationResource, cfg_name, namespace=w.namespace)))
        publishers = {n: InstancePublisher(
            client=c, node_name=n, configuration=cfg, devices=NodeDeviceTable(),
            labels=NodeLabels(client=c, node_name=n), metrics=AgentMetrics())
            for n, c in clients.items()}
        seen = {w.node_a: [first], w.node_b: [second, first]}
        for node in (w.node_a, w.node_b, w.node_a):
            await publishers[node].publish(
                load_handler("debugEcho"), None, [devices[d] for d in seen[node]], shared=True)
            seen[w.node_a] = [first, second]
        for publisher in publishers.values():
            assert set(publisher.owned) == {akri, other}
        both = sorted([w.node_a, w.node_b])
        for name, device in ((akri, first), (other, second)):
            spec = _get(cp, INSTANCES, name, "-n", w.namespace)["spec"]
            assert sorted(spec["nodes"]) == both
            assert spec["deviceDigest"] == device_digest(device, shared=True, node="")
            assert spec["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": device}
        # Said by B, which placed the second device first; A joined B's Instance of it.
        listed = _get(cp, "events", "-n", w.namespace)["items"]
        said = [e for e in listed if e.get("reason") == REASON_NAME_COLLISION
                and akri in e["message"] and other in e["message"]]
        assert [e["reportingInstance"] for e in said] == [w.node_b]

        # Only a holder writes the record of an Instance written before records were kept ...
        unrecorded = _instance(cp, w, nodes=[w.node_b])
        record = {"spec": {"deviceDigest": "0123456789abcdef"}}
        _refused(_patch(w.agent_a, w, unrecorded, record),
                 "may change an Instance's device fields only where its node holds it")
        _allowed(_patch(w.agent_b, w, unrecorded, record))
        # ... and nobody changes it once written.
        for who in (w.agent_a, w.agent_b):
            allowed, message = _patch(who, w, akri, {"spec": {"deviceDigest": "f" * 16}})
            assert not allowed
            assert "spec.deviceDigest is immutable" in message, message
        # Both leave (their nodes' Configuration labels go with their last Instance).
        for publisher in publishers.values():
            await publisher.withdraw()
        assert not [i for i in _get(cp, INSTANCES, "-n", w.namespace)["items"]
                    if i["spec"]["configurationName"] == cfg_name]
    finally:
        for client in clients.values():
            await client.close()


# -- Nodes -----------------------------------------------------------------------------------


def _node_status(who: Identity, node: str, patch: dict[str, Any]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).patch(Node.Status, node, patch,
                                               patch_type=PatchType.MERGE))


def _node(who: Identity, node: str, patch: dict[str, Any]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).patch(Node, node, patch, patch_type=PatchType.MERGE))


def test_node_status_writes_keep_the_nodes_metadata(control_plane: ControlPlane,
                                                    enforced: World) -> None:
    cp, w = control_plane, enforced
    device = "edgeplug.io/cam-9f9f9f"
    cp.kubectl("patch", "node", w.node_a, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": {"capacity": {device: "2", "cpu": "4"},
                                      "allocatable": {device: "2", "cpu": "4"}}}))
    through_status = "may not change a Node's labels, annotations, owner references or finalizers"
    labels = ({"node-restriction.kubernetes.io/zone": "trusted"},
              {"node-role.kubernetes.io/control-plane": ""},
              {"kubernetes.io/hostname": w.node_b},
              {"site": w.node_b},
              {"edgeplug.io/cam": "true"})
    first = _until_refused(lambda: _node_status(w.agent_a, w.node_a,
                                                {"metadata": {"labels": labels[0]}}),
                           "the Node status policy")
    _refused(first, through_status)
    for label in labels[1:]:
        _refused(_node_status(w.agent_a, w.node_a, {"metadata": {"labels": label}}),
                 through_status)
    for patch in ({"metadata": {"labels": {"site": None}}},
                  {"metadata": {"annotations": {"edgeplug.io/pinned-demand": "{}"}}},
                  {"metadata": {"annotations": {"edgeplug.io/labels": "{}"}}},
                  {"metadata": {"finalizers": ["attack.io/stuck"]}},
                  {"metadata": {"ownerReferences": [{
                      "apiVersion": "v1", "kind": "Namespace", "name": w.namespace,
                      "uid": str(uuid.uuid4())}]}},
                  # Metadata riding along with the one status write the agent makes.
                  {"metadata": {"labels": {"node-role.kubernetes.io/master": ""}},
                   "status": {"allocatable": {device: "1"}}}):
        _refused(_node_status(w.agent_a, w.node_a, patch), through_status)
    node = _get(cp, "node", w.node_a)
    assert node["metadata"]["labels"] == {"kubernetes.io/hostname": w.node_a, "site": w.node_a}
    # Through the Node itself: owner references and finalizers are not labels either.
    for patch in ({"metadata": {"finalizers": ["attack.io/stuck"]}},
                  {"metadata": {"ownerReferences": [{
                      "apiVersion": "v1", "kind": "Namespace", "name": w.namespace,
                      "uid": str(uuid.uuid4())}]}}):
        _refused(_node(w.agent_a, w.node_a, patch), "may change only edgeplug.io/ labels")
    # Controls: what agent/deviceplugins/crossnode/handoff.py and agent/discovery/node_labels.py
    # write.
    _allowed(_node_status(w.agent_a, w.node_a, {"status": {"allocatable": {device: "1"}}}))
    _allowed(_node_status(w.agent_a, w.node_a, {"status": {"allocatable": {device: "2"}}}))
    _allowed(_node(w.agent_a, w.node_a, {"metadata": {
        "labels": {"edgeplug.io/cam": "true"},
        "annotations": {"edgeplug.io/labels": json.dumps({"ns/cam": ["edgeplug.io/cam"]})}}}))


# -- ResourceSlices --------------------------------------------------------------------------


def _slice(name: str, *, label_node: str, pool: str, node_name: str | None = None,
           selector: list[str] | None = None, generation: int = 1) -> dict[str, Any]:
    # No device: what these slices try is where they sit, not what they offer (an offer is
    # tried in test_a_node_offers_only_what_a_configuration_selects_it_for).
    spec: dict[str, Any] = {"driver": "edgeplug.io", "devices": [],
                            "pool": {"name": pool, "generation": generation,
                                     "resourceSliceCount": 1}}
    if node_name is not None:
        spec["nodeName"] = node_name
    else:
        spec["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": selector}]}]}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": {"edgeplug.io/node": label_node}},
            "spec": spec}


def _create_slice(who: Identity, body: dict[str, Any]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).create(ResourceSliceResource.from_dict(body)))


def _until_allowed(call: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    """A token bound to a pod just created may be refused for a moment (the policy reads the
    node name the API server bound into it): the first outcome that is not a refusal."""
    deadline = time.monotonic() + POLICY_ACTIVE_S
    while True:
        outcome = call()
        if outcome[0] or time.monotonic() > deadline:
            return outcome
        time.sleep(POLL_S)  # polling a condition with a deadline, not a synchronisation sleep


def test_a_resourceslice_pool_belongs_to_the_node_that_writes_it(
        control_plane: ControlPlane, world: World) -> None:
    cp, w = control_plane, world
    s = uuid.uuid4().hex[:6]
    pool_b = f"{w.namespace}/cam/node/{w.node_b}"
    _apply(cp, _slice(f"b-{s}", label_node=w.node_b, pool=pool_b, node_name=w.node_b))
    own_pools = "may publish only its own node's pools"
    # Node B's local pool, one generation up, bound to node A: the scheduler would read only it.
    hijack = _slice(f"h-{s}", label_node=w.node_a, pool=pool_b, node_name=w.node_a,
                    generation=2)
    _refused(_until_refused(lambda: _create_slice(w.agent_a, hijack), "the slice policy"),
             own_pools)
    for name, body in {
        # B's local pool offered to a set of nodes including A.
        "as a set": _slice(f"h1-{s}", label_node=w.node_a, pool=pool_b,
                           selector=[w.node_a, w.node_b], generation=2),
        # A pool named like neither kind, bound to A.
        "unnamed": _slice(f"h2-{s}", label_node=w.node_a, pool=f"{w.namespace}/cam/x",
                          node_name=w.node_a),
        # A shared pool's name, bound to A alone (no node's local pool, but not A's either).
        "shared as local": _slice(f"h3-{s}", label_node=w.node_a,
                                  pool=f"{w.namespace}/cam/shared/cam-123456",
                                  node_name=w.node_a),
        # The digest form of a long local pool name, for node B.
        "digest of b": _slice(f"h4-{s}", label_node=w.node_a,
                              pool=f"edgeplug/0123abcd/node/{w.node_b}",
                              selector=[w.node_a]),
    }.items():
        outcome = _create_slice(w.agent_a, body)
        assert not outcome[0], f"{name}: allowed"
        assert DENIED in outcome[1], f"{name}: {outcome[1]}"
    stored = _get(cp, "resourceslices", "-l", f"edgeplug.io/node={w.node_a}")["items"]
    assert not [x for x in stored if x["metadata"]["name"].endswith(s)], "a refused slice stored"
    # Controls: agent/dra/slices.py's local pool (short and digested).
    for body in (_slice(f"a-{s}", label_node=w.node_a, pool=f"{w.namespace}/cam/node/{w.node_a}",
                        node_name=w.node_a),
                 _slice(f"a2-{s}", label_node=w.node_a,
                        pool=f"edgeplug/0123abcd/node/{w.node_a}", node_name=w.node_a)):
        _allowed(_create_slice(w.agent_a, body))


def test_a_shared_devices_pool_is_no_agents_to_write(control_plane: ControlPlane,
                                                     world: World) -> None:
    """The controller publishes shared devices' pools (controller/dra/shared_pools.py): a node's
    token can neither publish a newer generation of one that lists itself (the scheduler would
    read only it), nor rewrite or delete the controller's slice."""
    cp, w = control_plane, world
    s = uuid.uuid4().hex[:6]
    agent = _client(w.agent_a)
    names: list[str] = []
    try:
        for index, pool in enumerate((f"{w.namespace}/cam/shared/cam-{s}",
                                      f"edgeplug/{s}0123abcd")):
            theirs = _slice(f"c{index}-{s}", label_node=w.node_b, pool=pool,
                            selector=[w.node_b])
            theirs["metadata"]["labels"] = {
                "app.kubernetes.io/managed-by": "edgeplug-controller"}
            _apply(cp, theirs)
            name = theirs["metadata"]["name"]
            names.append(name)
            newer = _slice(f"n{index}-{s}", label_node=w.node_a, pool=pool,
                           selector=[w.node_a, w.node_b], generation=2)

            def publish_newer(body: dict[str, Any] = newer) -> tuple[bool, str]:
                return _create_slice(w.agent_a, body)

            _refused(_until_refused(publish_newer, "the slice policy"), "bound to its own node")
            alone = _slice(f"a{index}-{s}", label_node=w.node_a, pool=pool,
                           selector=[w.node_a], generation=2)
            _refused(_create_slice(w.agent_a, alone), "bound to its own node")
            taken = json.loads(json.dumps(theirs))
            taken["metadata"]["labels"]["edgeplug.io/node"] = w.node_a
            taken["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0][
                "values"] = [w.node_a]

            def take(body: dict[str, Any] = taken) -> object:
                return agent.patch(ResourceSliceResource, body["metadata"]["name"], body,
                                   patch_type=PatchType.APPLY, force=True)

            def delete(slice_name: str = name) -> object:
                return agent.delete(ResourceSliceResource, slice_name)

            _refused(_outcome(take), "labelled with its own node")
            _refused(_outcome(delete), "labelled with its own node")
            # Even labelled as node A's, the controller's slice is not A's to delete.
            cp.kubectl("label", "resourceslice", name, f"edgeplug.io/node={w.node_a}")
            _refused(_outcome(delete), "bound to its own node")
            assert _get(cp, "resourceslices", name)["spec"]["pool"]["generation"] == 1
        stored = _get(cp, "resourceslices")["items"]
        assert not [x["metadata"]["name"] for x in stored
                    if x["metadata"]["name"].endswith(s) and x["metadata"]["name"] not in names
                    ], "a refused slice stored"
    finally:
        if names:
            cp.kubectl("delete", "resourceslice", *names, check=False)


# -- Offers: only what a Configuration selects the node for ---------------------------------


OFFER = "may not offer devices of Configuration"


def _offered(namespace: str, configuration: str, instance: str) -> dict[str, Any]:
    """A device as crds/dra_slices.py lists one of ``configuration``'s."""
    values = dra.attributes(namespace=namespace, configuration=configuration, instance=instance,
                            properties={"DEBUG_ECHO_DESCRIPTION": "c0"}).values
    return _device(instance, {k: {"string": v} for k, v in values.items()})


def test_a_node_offers_only_what_a_configuration_selects_it_for(
        control_plane: ControlPlane, world: World, tmp_path: Path) -> None:
    """Node A publishes, in its own local pool, a device carrying the attributes of a
    Configuration whose nodeSelector selects only node B: that Configuration's DeviceClass
    would match it and the scheduler would place B's tenant's pod on A. Refused at write, with
    A's agent token and with A's kubelet certificate; so is joining or creating that
    Configuration's shared Instance (the controller would list A in the device's pool) and
    writing its health. B may do all of it, until B is no longer selected."""
    cp, w = control_plane, world
    s = uuid.uuid4().hex[:6]
    cfg = f"only-b-{s}"
    _apply(cp, debug_echo_configuration(cfg, descriptions=["c0"], node_selector={
        "matchLabels": {"site": w.node_b}}) | {"metadata": {"name": cfg, "namespace": w.namespace}})
    wait_offer(cp, w.namespace, cfg, w.node_b)
    assert not may_offer(cp, w.namespace, cfg, w.node_a)

    def local(node: str, devices: list[dict[str, Any]], tag: str) -> dict[str, Any]:
        body = _slice(f"{tag}-{s}", label_node=node, pool=f"{w.namespace}/{cfg}/node/{node}",
                      node_name=node)
        body["spec"]["devices"] = devices
        return body

    lure = local(w.node_a, [_offered(w.namespace, cfg, f"{cfg}-x")], "lure")
    _refused(_create_slice(w.agent_a, lure), OFFER)
    kubelet_a = Identity("kubelet", kubelet_kubeconfig(cp, w.node_a, tmp_path))
    _refused(_create_slice(kubelet_a, lure), "a kubelet may write no ResourceSlice")
    # The same attributes in the edgeplug.io domain read the same to a class: refused as such.
    qualified = _device("q", {f"edgeplug.io/{k}": v for k, v in
                              _offered(w.namespace, cfg, "q")["attributes"].items()})
    _refused(_create_slice(w.agent_a, local(w.node_a, [qualified], "qa")), "no attribute named")
    # One pool is one Configuration's: a selected device cannot carry an unselected one along.
    mixed = local(w.node_a, [_offered(w.namespace, "cam", "cam-m"),
                             _offered(w.namespace, cfg, f"{cfg}-m")], "mixed")
    _refused(_create_slice(w.agent_a, mixed), "of the one Configuration of its pool")
    # Instances of that Configuration: created, joined, or their health written by A.
    owner = w.owner | {"name": cfg, "uid": cp.kubectl(
        "get", "configurations.edgeplug.io", cfg, "-n", w.namespace,
        "-o", "jsonpath={.metadata.uid}").stdout.strip()}
    squat = _body(w, f"{cfg}-sq", nodes=[w.node_a], shared=True)
    squat["metadata"]["ownerReferences"] = [owner]
    squat["spec"]["configurationName"] = cfg
    _refused(_create(w.agent_a, squat), OFFER)
    theirs = _instance(cp, w, nodes=[w.node_b], name=f"{cfg}-b", configuration=cfg,
                       owner=owner)
    _refused(_patch(w.agent_a, w, theirs, {"spec": {"nodes": [w.node_b, w.node_a]}}), OFFER)
    _refused(_patch(w.agent_a, w, theirs, {"spec": {"nodes": [w.node_b, w.node_a]},
                                           "status": {"reported": {w.node_a: True}}},
                    status=True), OFFER)
    # Controls: node B, which the Configuration selects, does what its agent does.
    _allowed(_until_allowed(lambda: _create_slice(
        w.agent_b, local(w.node_b, [_offered(w.namespace, cfg, f"{cfg}-x")], "own"))))
    _allowed(_patch(w.agent_b, w, theirs, {"status": {"reported": {w.node_b: True}}},
                    status=True))
    # B leaves the selection (the label the selector reads changes): its grant goes with it.
    cp.kubectl("label", "node", w.node_b, "site=elsewhere", "--overwrite")
    try:
        wait_offer(cp, w.namespace, cfg, w.node_b, granted=False)
        _refused(_create_slice(w.agent_b, local(
            w.node_b, [_offered(w.namespace, cfg, f"{cfg}-y")], "late")), OFFER)
        _refused(_patch(w.agent_b, w, theirs, {"status": {"unhealthy": {w.node_b: "gone"}}},
                        status=True), OFFER)
        # It may still leave the Instance, as its agent does when no longer selected.
        _allowed(_patch(w.agent_b, w, theirs, {"spec": {"nodes": []}}))
    finally:
        cp.kubectl("label", "node", w.node_b, f"site={w.node_b}", "--overwrite")
        cp.kubectl("delete", "resourceslice", f"own-{s}", check=False)


# -- Camera passwords: only the nodes that need them ----------------------------------------


NODE_ACCOUNTS = f"{SYSTEM_NAMESPACE}-nodes"
OWN_ACCOUNT = "may create and mint only the account of its own node"


HTTP_FORBIDDEN = 403


def _account_body(name: str, *, mounts: bool) -> ServiceAccount:
    return cast(ServiceAccount, ServiceAccount.from_dict({
        "metadata": {"name": name, "namespace": NODE_ACCOUNTS},
        "automountServiceAccountToken": mounts}))


def _mint(client: Client, account: str, bound: dict[str, str] | None, seconds: int) -> object:
    """A TokenRequest for ``account`` in the node-accounts namespace."""
    body = _token_request(bound, seconds) | {"metadata": {"name": account,
                                                          "namespace": NODE_ACCOUNTS}}
    return client.create(cast(Any, ServiceAccount.Token.from_dict(body)), account,
                         namespace=NODE_ACCOUNTS)


def _token_request(bound: dict[str, str] | None, seconds: int = 3600) -> dict[str, Any]:
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if bound is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", **bound}
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


async def test_a_node_reads_only_the_secrets_of_configurations_selecting_it(
        control_plane: ControlPlane, world: World, tmp_path: Path) -> None:
    """Every agent runs as one ServiceAccount, so a grant to it hands every camera
    password any Configuration names to every node. Each node reads as its own account
    (agent/kube/node_account.py, with node A's agent token): node A reads the Secret of a
    Configuration selecting A, not the one of a Configuration selecting only B (another
    tenant's namespace), not even through node B's account, which A's token can neither make
    nor mint a token for; nor can it mint its own account's token unbound, bound to another
    Node, or for longer than an hour."""
    cp, w = control_plane, world
    s = uuid.uuid4().hex[:6]
    ours, theirs = f"pw-a-{s}", f"pw-b-{s}"
    for namespace, node, secret in ((ours, w.node_a, "a-login"), (theirs, w.node_b, "b-login")):
        cp.kubectl("create", "namespace", namespace)
        cp.kubectl("create", "secret", "generic", secret, "-n", namespace,
                   "--from-literal=password=s3cret")
        _apply(cp, debug_echo_configuration(
            "cams", descriptions=["c0"], node_selector={"matchLabels": {"site": node}},
            discovery_properties=[{"name": "password", "valueFrom": {
                "secretKeyRef": {"name": secret, "key": "password"}}}]) | {
            "metadata": {"name": "cams", "namespace": namespace}})
    agent = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
    account = NodeAccount(agent, base=KubeConfig.from_file(str(w.agent_a.kubeconfig)),
                          namespace=NODE_ACCOUNTS, node=w.node_a)
    try:
        await account.start()

        async def reads(namespace: str, secret: str) -> bool:
            try:
                await account.client.get(Secret, secret, namespace=namespace)
            except ApiError as error:
                if error.status.code != HTTP_FORBIDDEN:
                    raise
                return False
            return True

        await harness.eventually(lambda: reads(ours, "a-login"),
                                 what="node A's read of its Configuration's Secret",
                                 deadline=WAIT_S)
        assert not await reads(theirs, "b-login"), "node A reads node B's camera password"
        assert not await reads(ours, "unnamed")
        # Node B's account: A's token may neither make it nor mint its token.
        b_account = f"node-{w.node_b}"
        cp.kubectl("create", "serviceaccount", b_account, "-n", NODE_ACCOUNTS, check=False)
        client = _client(w.agent_a)
        _refused(_outcome(lambda: client.create(_account_body(f"node-x{s}", mounts=False))),
                 OWN_ACCOUNT)
        node_b_uid = _get(cp, "node", w.node_b)["metadata"]["uid"]
        node_a_uid = _get(cp, "node", w.node_a)["metadata"]["uid"]
        for name, bound, seconds, why in (
                (b_account, {"kind": "Node", "name": w.node_b, "uid": node_b_uid}, 3600,
                 OWN_ACCOUNT),
                (f"node-{w.node_a}", None, 3600, "only bound to its own Node"),
                (f"node-{w.node_a}", {"kind": "Node", "name": w.node_b, "uid": node_b_uid},
                 3600, "only bound to its own Node"),
                (f"node-{w.node_a}", {"kind": "Node", "name": w.node_a, "uid": node_a_uid},
                 7200, "for at most an hour")):
            _refused(_outcome(functools.partial(_mint, client, name, bound, seconds)), why)
        # Its own account, made as agent/kube/node_account.py makes it, with a token that mounts.
        _refused(_outcome(lambda: client.create(_account_body(f"node-{w.node_a}", mounts=True))),
                 "mounts no token")
    finally:
        await account.close()
        await agent.close()
        cp.kubectl("delete", "namespace", ours, theirs, "--wait=false", check=False)


# -- Claim status: only the driver's entries of claims on its node -------------------------


def _allocated_claim(cp: ControlPlane, namespace: str, name: str, node: str) -> None:
    """A claim allocated one edgeplug.io device on ``node`` (as the scheduler would write it,
    written by the admin), with another driver's device beside it."""
    _apply(cp, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [{"name": "cam", "exactly": {
                    "deviceClassName": "anything"}}]}}})
    allocation = {"devices": {"results": [
        {"request": "cam", "driver": "edgeplug.io", "pool": f"{namespace}/cam/node/{node}",
         "device": "cam-1"},
        {"request": "cam", "driver": "gpu.example.com", "pool": node, "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    cp.kubectl("patch", "resourceclaim", name, "-n", namespace, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": {"allocation": allocation}}))


def _device_status(driver: str, pool: str, device: str) -> dict[str, Any]:
    return {"driver": driver, "pool": pool, "device": device,
            "conditions": [{"type": "Ready", "status": "True", "reason": "DeviceHealthy",
                            "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z"}]}


def test_claim_status_only_its_drivers_entries_of_claims_on_its_node(
        control_plane: ControlPlane, world: World) -> None:
    """The claim status (agent/dra/claim_status.py) gives the agent patch on every
    claim's status. Node A's token tries: its driver's entry on a claim allocated on node B;
    on a claim on A, another driver's entry, the pods reserving the claim; an unallocated
    claim allocated to itself. Each is refused, by the API server where it guards claims'
    status by driver and node (v1.36+), by the policy elsewhere; its own entry on its own
    claim passes."""
    cp, w = control_plane, world
    s = uuid.uuid4().hex[:6]
    on_a, on_b = f"on-a-{s}", f"on-b-{s}"
    _allocated_claim(cp, w.namespace, on_a, w.node_a)
    _allocated_claim(cp, w.namespace, on_b, w.node_b)
    client = _client(w.agent_a)

    def status(name: str, body: dict[str, Any]) -> tuple[bool, str]:
        return _outcome(lambda: client.patch(
            ResourceClaimResource.Status, name, {"status": body}, namespace=w.namespace,
            patch_type=PatchType.MERGE))

    ours_a = _device_status("edgeplug.io", f"{w.namespace}/cam/node/{w.node_a}", "cam-1")
    ours_b = _device_status("edgeplug.io", f"{w.namespace}/cam/node/{w.node_b}", "cam-1")
    # Where the API server checks the node itself (granular status authorization, v1.36+:
    # "arbitrary-node:patch" is not granted) it refuses first; elsewhere the policy does.
    allowed_b, message_b = status(on_b, {"devices": [ours_b]})
    assert not allowed_b, "node A wrote the status of a claim on node B"
    assert "arbitrary-node:patch" in message_b or "allocated on its node" in message_b, (
        message_b)
    # Allocating a claim nobody allocated yet, to itself; adding a pod reserving its own. The
    # API server refuses both where it guards the binding (resourceclaims/binding, v1.36+),
    # the policy elsewhere.
    _apply(cp, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"free-{s}", "namespace": w.namespace},
                "spec": {"devices": {"requests": [{"name": "cam", "exactly": {
                    "deviceClassName": "anything"}}]}}})
    taken = _get(cp, "resourceclaim", on_a, "-n", w.namespace)["status"]["allocation"]
    for name, body in ((f"free-{s}", {"allocation": taken}),
                       (on_a, {"reservedFor": [{"resource": "pods", "name": "intruder",
                                                "uid": str(uuid.uuid4())}]})):
        allowed, message = status(name, body)
        assert not allowed, f"node A changed {name}'s {next(iter(body))}"
        assert ("resourceclaims/binding" in message or "allocated on its node" in message
                or "may not change a claim's allocation or reservedFor" in message), message
    allowed, message = status(on_a, {"devices": [
        ours_a, _device_status("gpu.example.com", w.node_a, "gpu-0")]})
    assert not allowed, "node A wrote another driver's device status"
    assert ('"gpu.example.com" is forbidden' in message
            or "only the driver edgeplug.io's status.devices" in message), message
    _allowed(status(on_a, {"devices": [ours_a]}))


# -- DeviceClasses -------------------------------------------------------------------------


def _device(name: str, attributes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "attributes": attributes}


def _local_slice(namespace: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """A slice of ``node``'s local pool of ``cam``, as agent/dra/slices.py names it."""
    body = _slice(f"{node}-cam", label_node=node, pool=f"{namespace}/cam/node/{node}",
                  node_name=node)
    body["spec"]["devices"] = devices
    return body


async def test_a_device_without_edgeplugs_attributes_breaks_no_class(
        control_plane: ControlPlane, world: World, pod_namespace: str, kube: AsyncClient,
        tmp_path: Path) -> None:
    """The scheduler evaluates a claim's class on every device of every pool a
    candidate node reaches, and a CEL error there (not a false) fails the pod's scheduling on
    every node. Node A's own token may not publish, in its own local pool, a device without
    edgeplug's attributes or one whose attributes have the wrong types (a version, an int, a
    bool: a version compared with a string is CEL's "no such overload"): the slice policy
    refuses them. Such a slice can still exist (written before the policy was installed, or
    by an admin): a claim for the Configuration's class, whose one real device is on node B,
    is still allocated there."""
    cp, ns = control_plane, pod_namespace
    node_a, node_b = harness.new_node(cp), harness.new_node(cp)
    async with h.ready_nodes(kube, [node_a, node_b]):
        agent_a = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_a,
                            folder=tmp_path)
        agent_b = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_b,
                            folder=tmp_path)
        try:
            made = cp.kubectl("apply", "-f", "-", stdin=json.dumps(dra.device_class(ns, "cam")),
                              check=False)
            assert made.returncode == 0, made.stderr
            _apply(cp, debug_echo_configuration("cam", descriptions=["c0"]) | {
                "metadata": {"name": "cam", "namespace": ns}})
            wait_offer(cp, ns, "cam", node_b)
            real = dra.attributes(namespace=ns, configuration="cam", instance="cam-b",
                                  properties={"DEBUG_ECHO_DESCRIPTION": "c0"}).values
            _allowed(_until_allowed(lambda: _create_slice(agent_b, _local_slice(ns, node_b, [
                _device("cam-b", {k: {"string": v} for k, v in real.items()})]))))
            lure = _local_slice(ns, node_a, [
                _device("bare", {}),
                _device("typed", {dra.ATTR_NAMESPACE: {"version": "1.0.0"},
                                  dra.ATTR_CONFIGURATION: {"int": 7},
                                  dra.ATTR_INSTANCE: {"bool": True}}),
                _device("foreign", {"example.com/namespace": {"string": ns}}),
            ])
            _refused(_until_refused(lambda: _create_slice(agent_a, lure), "the slice policy"),
                     "carries the string attributes namespace and configuration")
            _apply(cp, lure)
            h.apply(cp, ns, h.claim_template("cam", dra.device_class_name(ns, "cam")),
                    h.claim_pod("user", "cam"))
            try:
                got = await harness.eventually(lambda: h.pod_claim(kube, ns, "user"),
                                               what="pod user bound with its claim allocated",
                                               deadline=h.SCHEDULE_DEADLINE)
            except AssertionError as error:
                raise AssertionError(f"{error}\n{await h.describe(kube, ns)}") from None
            assert got.node == node_b
            (result,) = got.results
            assert (result["pool"], result["device"]) == (f"{ns}/cam/node/{node_b}", "cam-b")
        finally:
            cp.kubectl("delete", "deviceclass", dra.device_class_name(ns, "cam"), check=False)
            release_agent_pod(cp, node_a)
            release_agent_pod(cp, node_b)


# -- Configuration status --------------------------------------------------------------------


async def test_only_its_own_nodes_conditions_on_a_configuration(
        control_plane: ControlPlane, enforced: World) -> None:
    cp, w = control_plane, enforced
    cfg_name = f"cond-{uuid.uuid4().hex[:4]}"
    _apply(cp, debug_echo_configuration(cfg_name, descriptions=["c0"])
           | {"metadata": {"name": cfg_name, "namespace": w.namespace}})
    stamp = "2026-01-01T00:00:00Z"

    def condition(kind: str, state: str = "True") -> dict[str, Any]:
        return {"type": kind, "status": state, "reason": "Set", "message": "set",
                "lastTransitionTime": stamp}

    theirs = [condition(controller_status.CONDITION_BROKER_SPEC_VALID),
              condition(controller_status.CONDITION_BROKERS_READY),
              condition(f"DiscoveryReady.{w.node_b}", "False")]
    cp.kubectl("patch", "configurations.edgeplug.io", cfg_name, "-n", w.namespace,
               "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                   "observedGeneration": 1, "instanceCount": 3,
                   "brokers": {"desired": 3, "ready": 3}, "conditions": theirs}}))

    def status(patch: dict[str, Any], who: Identity = w.agent_a) -> tuple[bool, str]:
        return _outcome(lambda: _client(who).patch(
            ConfigurationResource.Status, cfg_name, {"status": patch}, namespace=w.namespace,
            patch_type=PatchType.MERGE))

    own_only = "may change only its own discovery conditions"
    first = _until_refused(lambda: status({"conditions": []}), "the condition policy")
    _refused(first, own_only)
    for patch in ({"conditions": [condition(f"DiscoveryReady.{w.node_a}", "False")]},
                  {"conditions": [*theirs[:2], condition(f"DiscoveryReady.{w.node_b}")]},
                  {"conditions": [{**theirs[0], "status": "False"}, *theirs[1:]]},
                  {"conditions": [*theirs, condition("BrokerNodesSelected")]},
                  {"instanceCount": 0},
                  {"brokers": {"desired": 0, "ready": 0}},
                  {"observedGeneration": None}):
        _refused(status(patch), own_only)
    _refused(status({"conditions": [*theirs, condition(f"DiscoveryReady.{w.node_a}")]},
                    w.unbound), "names no node")
    # Controls: the real reporter writes A's condition and the shared one, and withdraws A's.
    client = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
    try:
        cfg = Configuration.from_object(as_dict(
            await client.get(ConfigurationResource, cfg_name, namespace=w.namespace)))
        reporter = ConfigurationReporter(client=client, node_name=w.node_a, configuration=cfg)
        await reporter.problem("DiscoveryFailed", "the handler failed on this node")
        await reporter.warnings(["a warning"])
        await reporter.problem("InvalidDiscoveryDetails", "descriptions: not a list")
        await reporter.ok("discovery running")
    finally:
        await client.close()
    stored = _get(cp, "configurations.edgeplug.io", cfg_name, "-n", w.namespace)["status"]
    kinds = {c["type"]: c for c in stored["conditions"]}
    assert {c["type"] for c in theirs} <= set(kinds)
    assert kinds[f"DiscoveryReady.{w.node_b}"] == theirs[2]
    assert kinds[f"DiscoveryHealthy.{w.node_a}"]["status"] == "False"
    assert kinds["DiscoveryDetailsValid"]["status"] == "True"
    assert (stored["instanceCount"], stored["brokers"]) == (3, {"desired": 3, "ready": 3})


# -- Events ----------------------------------------------------------------------------------


async def test_events_name_the_agent_on_its_own_node_and_edgeplug_objects(
        enforced: World) -> None:
    w = enforced
    involved = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "name": "cam",
                "namespace": w.namespace}

    def event(**changes: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "cam.", "namespace": w.namespace},
            "involvedObject": involved, "reason": "Attack", "message": "m", "type": "Warning",
            "source": {"component": "edgeplug-agent", "host": w.node_a},
            "reportingComponent": "edgeplug-agent", "reportingInstance": w.node_a,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
            "count": 1}
        return body | changes

    def post(body: dict[str, Any], who: Identity = w.agent_a) -> tuple[bool, str]:
        event_obj = cast(Event, Event.from_dict(body))
        return _outcome(lambda: _client(who).create(event_obj))

    as_itself = "may post Events only as edgeplug-agent on its own node"
    first = _until_refused(lambda: post(event(reportingInstance=w.node_b)), "the Event policy")
    _refused(first, as_itself)
    for body in (event(source={"component": "edgeplug-controller"},
                       reportingComponent="edgeplug-controller", reportingInstance=""),
                 event(source={"component": "edgeplug-agent", "host": w.node_b}),
                 event(source={"component": "kubelet", "host": w.node_a}),
                 event(reportingComponent="default-scheduler")):
        _refused(post(body), as_itself)
    about = "may post Events only about Configurations and Instances"
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "victim", "namespace": w.namespace}
    for body in (event(involvedObject=pod),
                 event(related=pod),
                 event(involvedObject={**involved, "apiVersion": "v1", "kind": "Node"})):
        _refused(post(body), about)
    _refused(post(event(), w.unbound), as_itself)
    # Control: the agent's own emit_event, on its own token.
    client = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
    try:
        await emit_event(client, node=w.node_a, kind="Instance", name="cam-123456",
                         namespace=w.namespace, uid="", reason="DeviceUnhealthy",
                         message=f"device unhealthy on node {w.node_a}: test", warning=True)
    finally:
        await client.close()


# -- through the controller ------------------------------------------------------------------


async def test_a_node_listed_but_not_selected_gets_no_broker_and_is_shown(
        control_plane: ControlPlane, enforced: World, namespace: str,
        controller: ctl.ControllerProcess) -> None:
    """The controller makes brokers only where the Configuration's nodeSelector selects: node
    A listed in a shared Instance of a Configuration that selects only node B, and in one of
    its own (A's token is refused both; an Instance written while A was selected has them);
    neither gets a broker on A (no pod, so no ServiceAccount token
    or Secret volume there), and the status names both. Relabelled to be selected, A gets one."""
    cp, w = control_plane, enforced
    cfg_name = f"b-only-{uuid.uuid4().hex[:4]}"
    cfg = ctl.configuration(namespace, cfg_name, pod_spec=ctl.broker_pod_spec())
    cfg["spec"]["nodeSelector"] = {"matchLabels": {"site": w.node_b}}
    ctl.apply(cp, cfg)
    uid = _get(cp, "configurations.edgeplug.io", cfg_name, "-n", namespace)["metadata"]["uid"]
    owner = {**w.owner, "name": cfg_name, "uid": uid}
    joined = f"{cfg_name}-0a0a0a"
    ctl.apply(cp, ctl.instance(namespace, joined, configuration_name=cfg_name,
                               nodes=[w.node_b]))
    ns_world = World(namespace, w.node_a, w.node_b, w.agent_a, w.agent_b, w.unbound, owner)
    # A's token is refused both writes (test_a_node_offers_only_what_a_configuration_selects_it
    # _for); the admin makes them, as A's agent could have while A was selected: the
    # controller, too, acts only where the Configuration selects.
    _refused(_patch(w.agent_a, ns_world, joined, {"spec": {"nodes": [w.node_b, w.node_a]}}),
             OFFER)
    cp.kubectl("patch", INSTANCES, joined, "-n", namespace, "--type=merge", "-p",
               json.dumps({"spec": {"nodes": [w.node_b, w.node_a]}}))
    made = _body(ns_world, f"{cfg_name}-0b0b0b", nodes=[w.node_a], shared=True)
    made["spec"]["configurationName"] = cfg_name
    _refused(_create(w.agent_a, made), OFFER)
    _apply(cp, made)

    def pods_on(node: str) -> list[dict[str, Any]]:
        return [p for p in ctl.broker_pods(cp, namespace)
                if p["metadata"]["labels"].get("edgeplug.io/target-node") == node]

    def shown() -> dict[str, Any] | None:
        found = ctl.get(cp, ctl.configuration_path(namespace, cfg_name)) or {}
        for c in (found.get("status") or {}).get("conditions") or []:
            if (c["type"] == controller_status.CONDITION_BROKER_NODES_SELECTED
                    and made["metadata"]["name"] in c["message"] and joined in c["message"]):
                return dict(c)
        return None

    condition = ctl.wait_until(shown, what="the status naming the unselected node",
                               deadline=WAIT_S)
    assert condition["status"] == "False"
    assert condition["reason"] == controller_status.REASON_NODE_NOT_SELECTED
    assert f"Instance {joined} lists {w.node_a}" in condition["message"]
    ctl.wait_until(lambda: pods_on(w.node_b), what="the broker on node B", deadline=WAIT_S)
    # The status is written after the reconcile that made no broker on A: it did not act.
    assert pods_on(w.node_a) == [], "a broker on a node the Configuration does not select"
    status = (ctl.get(cp, ctl.configuration_path(namespace, cfg_name)) or {})["status"]
    assert status["brokers"]["desired"] == 1, status
    # A relabelled to be selected: its brokers come, and the condition goes.
    cp.kubectl("label", "node", w.node_a, f"site={w.node_b}", "--overwrite")
    try:
        ctl.wait_until(lambda: len(pods_on(w.node_a)) == 2, what="brokers on relabelled A",
                       deadline=WAIT_S)
        ctl.wait_until(lambda: shown() is None, what="the condition withdrawn", deadline=WAIT_S)
    finally:
        cp.kubectl("label", "node", w.node_a, f"site={w.node_a}", "--overwrite")
