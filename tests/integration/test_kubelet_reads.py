"""The agent's reads of its own node are made as the kubelet: node A's certificate lists the
pods bound to A and reads the claim of a pod bound to A, and is refused B's pods and B's claim;
the agent's own token may do neither; a rotated certificate is used from the next read on.

No cluster-wide reads an agent does not need. The harness API
server runs the Node authorizer and NodeRestriction, as every real cluster does. The agent runs
as its process with deploy/manifests' and deploy/dra's rights through its pod-bound token, plus
node A's kubelet client certificate (signed by the cluster CA, ``system:node:A`` in
``system:nodes``, one PEM file with its key as the kubelet's rotated
``kubelet-client-current.pem`` is); the kubelet's NodePrepareResources is called over the
agent's own socket, and the claims are real: made by the kube-controller-manager from a template
and allocated by the kube-scheduler from the agents' slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.slots.bound_pods import BoundPodsReader, pods_bound_here
from agent.dra import plugin as dra_plugin
from agent.dra.plugin import ResourceClaimResource
from agent.kube.client import as_dict
from agent.kube.node_reads import KubeletCertificate, NodeReads
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from crds import dra, dra_slices
from tests.harness import agent_process as harness
from tests.harness import cdi
from tests.harness import dra as h
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import (
    AGENT_ACCOUNT,
    SYSTEM_NAMESPACE,
    Identity,
    kubelet_certificate,
    pod_bound,
)
from tests.integration.test_attacks_agent import agent_manifests

# The agents write with their own token: the offer grants name their Configurations.
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("offers")]

DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
#: The Node authorizer's words when a node asks for an object none of its pods references.
NO_RELATIONSHIP = "no relationship found between node"
KUBECTL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    """The agent's rights applied as a user applies them (deploy/manifests' agent files,
    deploy/dra)."""
    cp = control_plane
    for path in agent_manifests():
        cp.kubectl("apply", "-f", str(path))
    cp.kubectl("apply", "-k", str(DRA_MANIFESTS))
    return cp


def _get_as(cp: ControlPlane, who: Identity, namespace: str, claim: str) -> tuple[bool, str]:
    result = subprocess.run(
        cp.binaries.command("kubectl", f"--kubeconfig={who.kubeconfig}", "get",
                            "resourceclaims.resource.k8s.io", claim, "-n", namespace),
        capture_output=True, text=True, check=False, timeout=KUBECTL_TIMEOUT_S)
    return result.returncode == 0, result.stderr


def _pinned_claim_pod(name: str, template: str, node: str) -> dict[str, Any]:
    pod = h.claim_pod(name, template)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory short enough for Unix sockets (108 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def admin(cp: ControlPlane) -> AsyncIterator[AsyncClient]:
    client = harness.api_client(cp)
    try:
        yield client
    finally:
        await client.close()


async def _exists(path: Path) -> Path | None:
    return path if await asyncio.to_thread(path.exists) else None


def _names(plane: ControlPlane, prefix: str, *, nodes: bool) -> tuple[str, str, str]:
    """A fresh namespace and two node names (the Nodes made too when ``nodes``)."""
    suffix = uuid.uuid4().hex[:6]
    ns, node_a, node_b = f"{prefix}-{suffix}", f"{prefix}-a-{suffix}", f"{prefix}-b-{suffix}"
    plane.kubectl("create", "namespace", ns)
    for node in (node_a, node_b) if nodes else ():
        plane.kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    return ns, node_a, node_b


async def test_the_agent_prepares_its_nodes_claims_as_the_kubelet_and_reads_no_other(
    plane: ControlPlane, tmp_path: Path
) -> None:
    ns, node_a, node_b = _names(plane, "claims", nodes=False)  # ready_nodes makes them
    harness.apply(plane, ns, harness.debug_echo_configuration(
        "echo", descriptions=["lamp"], shared=False, broker_properties={"ROOM": "7"}))
    token_a = pod_bound(plane, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_a,
                        folder=tmp_path)
    with short_dir() as dirs:
        cdi_dir = dirs / "cdi"
        cdi_dir.mkdir()
        agent = harness.AgentSubprocess(
            plane, node_name=node_a, namespace=ns, log_path=tmp_path / "agent-a.log",
            extra_env={"KUBECONFIG": str(token_a.kubeconfig), "DRA": "on",
                       "DRA_PLUGINS_DIR": str(dirs / "plugins"),
                       "DRA_REGISTRY_DIR": str(dirs / "registry"),
                       "CDI_SPEC_DIR": str(cdi_dir),
                       "KUBELET_CLIENT_CERT": str(kubelet_certificate(plane, node_a, tmp_path))})
        async with (admin(plane) as kube, h.ready_nodes(kube, [node_a, node_b]),
                    h.device_classes(kube, ns), h.dra_agents(plane, [node_b], ns)):
            agent.start()
            try:
                await harness.eventually(lambda: h.device_class(kube, ns, "echo"),
                                         what="the DeviceClass")
                h.apply(plane, ns, h.claim_template("lamp", dra.device_class_name(ns, "echo")),
                        _pinned_claim_pod("user-a", "lamp", node_a),
                        _pinned_claim_pod("user-b", "lamp", node_b))
                claim_a = await h.allocated_claim(kube, ns, "user-a")
                claim_b = await h.allocated_claim(kube, ns, "user-b")
                socket = dirs / "plugins" / dra.DRIVER / dra_plugin.SERVICE_SOCKET
                await harness.eventually(lambda: _exists(socket), what="the DRA socket")
                async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
                    stub = pb_grpc.DRAPluginStub(channel)
                    mine = await stub.NodePrepareResources(
                        pb.NodePrepareResourcesRequest(claims=[claim_a]))
                    theirs = await stub.NodePrepareResources(
                        pb.NodePrepareResourcesRequest(claims=[claim_b]))
            finally:
                agent.stop()
        log = (tmp_path / "agent-a.log").read_text()
        prepared = mine.claims[claim_a.uid]
        assert prepared.error == "", f"{prepared.error}\n{log}"
        (device,) = prepared.devices
        assert device.pool_name == dra_slices.local_pool(ns, "echo", node_a)
        edits = cdi.resolve([cdi_dir], list(device.cdi_device_ids))
        assert edits.env["ROOM"] == "7"
    # The claim of a pod on node B: the API server refused node A's kubelet, by relationship.
    refused = theirs.claims[claim_b.uid]
    assert f"system:node:{node_a}" in refused.error, refused.error
    assert NO_RELATIONSHIP in refused.error, refused.error
    assert "this node's pods and claims are read as the kubelet" in log
    # The agent's own token holds no claim right, not even of its own node's pod.
    for claim in (claim_a, claim_b):
        allowed, message = _get_as(plane, token_a, ns, claim.name)
        assert not allowed, f"the agent's token read claim {claim.name}"
        assert "forbidden" in message, message
        assert 'cannot get resource "resourceclaims"' in message, message
    plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    plane.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                  f"{AGENT_ACCOUNT}-{node_a}", check=False)


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                "deviceClassName": "absent.example.com"}}]}}}


def _bound_pod(name: str, claim: str, node: str) -> dict[str, Any]:
    """A pod bound to ``node`` (no scheduler, no kubelet) referencing ``claim``: the Node
    authorizer's graph ties the claim to the node."""
    pod = h.claim_pod(name, "")
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimName": claim}]
    pod["spec"]["nodeName"] = node
    return pod


def _point(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename, as the kubelet rotates its certificate."""
    fresh = link.with_name(link.name + ".new")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(target)
    os.replace(fresh, link)


async def test_a_rotated_kubelet_certificate_is_used_from_the_next_read(
    plane: ControlPlane, tmp_path: Path
) -> None:
    ns, node_a, node_b = _names(plane, "rotate", nodes=True)
    h.apply(plane, ns, _claim("lamp-a"), _bound_pod("user-a", "lamp-a", node_a))
    current = tmp_path / "kubelet-client-current.pem"
    _point(current, kubelet_certificate(plane, node_b, tmp_path))
    pem_a = kubelet_certificate(plane, node_a, tmp_path)
    async with admin(plane) as own:
        reads = NodeReads.as_kubelet(own, base=KubeConfig.from_file(str(plane.kubeconfig)),
                                     certificate=KubeletCertificate(current), node_name=node_a)

        async def read() -> dict[str, Any]:
            client = await reads.client()
            found: dict[str, Any] = as_dict(
                await client.get(ResourceClaimResource, "lamp-a", namespace=ns))
            return found

        try:
            with pytest.raises(ApiError) as refused:
                await read()
            _point(current, pem_a)
            claim = await harness.eventually(read, what="the claim read with the new certificate")
        finally:
            await reads.close()
    assert refused.value.status.code == 403
    assert f"system:node:{node_b}" in str(refused.value.status.message)
    assert NO_RELATIONSHIP in str(refused.value.status.message)
    assert claim["metadata"]["name"] == "lamp-a"
    plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    plane.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _plain_pod(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "busybox:1.36"}]}}


async def test_the_kubelets_certificate_lists_the_pods_bound_to_its_node_and_no_other(
    plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the orphan freer and the hand-off gate read (agent/deviceplugins/slots/bound_pods.py):
    as the kubelet, the pods bound to its node; another node's, or every pod, is refused by the Node
    authorizer; the agent's token is refused the list, and the reader says so once."""
    ns, node_a, node_b = _names(plane, "pods", nodes=True)
    h.apply(plane, ns, _plain_pod("on-a", node_a), _plain_pod("on-b", node_b))
    token_a = pod_bound(plane, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node_a,
                        folder=tmp_path)
    caplog.set_level(logging.WARNING, logger="agent.deviceplugins.slots.bound_pods")
    async with admin(plane) as own:
        reads = NodeReads.as_kubelet(
            own, base=KubeConfig.from_file(str(plane.kubeconfig)),
            certificate=KubeletCertificate(kubelet_certificate(plane, node_a, tmp_path)),
            node_name=node_a)
        token = AsyncClient(KubeConfig.from_file(str(token_a.kubeconfig)))
        try:
            bound = await BoundPodsReader(reads=reads, node=node_a)()
            kubelet = await reads.client()
            with pytest.raises(ApiError) as theirs:
                await pods_bound_here(kubelet, node_b)
            with pytest.raises(ApiError) as every:
                [pod async for pod in kubelet.list(Pod, namespace="*")]
            by_token = BoundPodsReader(reads=NodeReads(token), node=node_a)
            refused = await by_token()
        finally:
            await token.close()
            await reads.close()
    assert bound is not None
    assert {p["metadata"]["name"] for p in bound if p["metadata"]["namespace"] == ns} == {"on-a"}
    for error in (theirs.value, every.value):
        assert error.status.code == 403
        assert f"system:node:{node_a}" in str(error.status.message)
        assert "spec.nodeName field selector" in str(error.status.message)
    assert refused is None
    assert not by_token.permitted
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "the agent's own token" in warning
    assert "KUBELET_CLIENT_CERT" in warning
    plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    plane.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                  f"{AGENT_ACCOUNT}-{node_a}", check=False)
    plane.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)
