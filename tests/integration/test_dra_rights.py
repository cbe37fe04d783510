"""DRA's rights (deploy/dra/) on the real API server: the agent's token, bound to its node,
writes only its own node's ResourceSlices, and the real publisher works with that token alone;
the controller's token may keep DeviceClasses and write shared devices' pools of the driver,
nothing else of ResourceSlices."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.dra import slices
from agent.dra.publisher import DraPublisher
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import Identity, mint, pod_bound

# The agent writes with its own token: the offer grants name its Configurations.
pytestmark = pytest.mark.usefixtures("offers")

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT, CONTROLLER = "edgeplug-agent", "edgeplug-controller"
#: A newly applied policy is loaded asynchronously by the API server.
POLICY_ACTIVE_S = 60.0
DENIED = "denied request"
KUBECTL_TIMEOUT_S = 60


@dataclass(frozen=True)
class World:
    node_a: str
    node_b: str
    agent_a: Identity
    controller: Identity


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    cp = control_plane
    for name in ("namespace.yaml", "agent-rbac.yaml", "controller-rbac.yaml"):
        cp.kubectl("apply", "-f", str(MANIFESTS / name))
    cp.kubectl("apply", "-k", str(DRA_MANIFESTS))
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"dra-a-{suffix}", f"dra-b-{suffix}"
    for node in (node_a, node_b):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    folder = tmp_path_factory.mktemp("dra-rights")
    agent_a = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT, node=node_a,
                        folder=folder)
    controller = mint(cp, namespace=SYSTEM_NAMESPACE, account=CONTROLLER,
                      path=folder / "controller")
    try:
        yield World(node_a, node_b, agent_a, controller)
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"{AGENT}-{node_a}", check=False)
        cp.kubectl("delete", "resourceslices", "-l", f"edgeplug.io/node in ({node_a},{node_b})",
                   check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _by_hostname(nodes: list[str], key: str = "kubernetes.io/hostname") -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": key, "operator": "In", "values": nodes}]}]}


def _slice(name: str, *, label_node: str, node_name: str | None = None,
           selector_nodes: list[str] | None = None, driver: str = "edgeplug.io",
           devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A slice bound to ``node_name``, or selecting ``selector_nodes``, or (``devices``) each
    device placing itself (``perDeviceNodeSelection``)."""
    # Pools named as agent/dra/slices.py names them: a node's own, or a shared device's.
    pool = f"ns/{name}/node/{node_name}" if node_name is not None else f"ns/c/shared/{name}"
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool, "generation": 1,
                                                      "resourceSliceCount": 1},
                            "devices": []}  # where it sits is tried, not what it offers
    if node_name is not None:
        spec["nodeName"] = node_name
    elif devices is not None:
        spec["perDeviceNodeSelection"] = True
        spec["devices"] = devices
    else:
        spec["nodeSelector"] = _by_hostname(selector_nodes or [])
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": {"edgeplug.io/node": label_node}},
            "spec": spec}


def _as(cp: ControlPlane, who: Identity, *args: str, body: dict[str, Any] | None = None
        ) -> tuple[bool, str]:
    """``kubectl`` as ``who``; with ``body``, it goes in on stdin (``-f -``)."""
    extra = ["-f", "-"] if body is not None else []
    result = subprocess.run(
        cp.binaries.command("kubectl", f"--kubeconfig={who.kubeconfig}", *args, *extra),
        input=json.dumps(body) if body is not None else None, capture_output=True, text=True,
        check=False, timeout=KUBECTL_TIMEOUT_S)
    return result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def enforced(control_plane: ControlPlane, world: World) -> World:
    """Wait until the API server enforces the policy (it loads a new one asynchronously)."""
    probe = _slice(f"probe-{uuid.uuid4().hex[:6]}", label_node=world.node_b,
                   node_name=world.node_b)
    deadline = time.monotonic() + POLICY_ACTIVE_S
    while True:
        ok, err = _as(control_plane, world.agent_a, "create", "--dry-run=server", body=probe)
        if not ok and DENIED in err:
            return world
        assert time.monotonic() < deadline, f"policy not enforced in time: {ok} {err}"
        time.sleep(0.2)  # polling a condition with a deadline, not a synchronisation sleep


def test_the_tokens_hold_the_rights_the_code_uses(control_plane: ControlPlane,
                                                  world: World) -> None:
    cp = control_plane
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert world.agent_a.can(cp, verb, "resourceslices.resource.k8s.io"), verb
    # Claims are read with the kubelet's certificate (tests/integration/test_kubelet_reads.py).
    assert not world.agent_a.can(cp, "get", "resourceclaims.resource.k8s.io",
                                 namespace="default")
    assert not world.agent_a.can(cp, "update", "resourceclaims.resource.k8s.io",
                                 namespace="default")
    assert not world.agent_a.can(cp, "create", "deviceclasses.resource.k8s.io")
    for verb in ("list", "watch", "create", "patch", "delete"):
        assert world.controller.can(cp, verb, "deviceclasses.resource.k8s.io"), verb
    # Shared devices' pools (controller/dra/shared_pools.py); servedBy (dra/dra_usage.py).
    for verb in ("list", "watch", "create", "patch", "delete"):
        assert world.controller.can(cp, verb, "resourceslices.resource.k8s.io"), verb
    # Brokers' claim templates; servedBy and claims of Instances (controller/dra/dra_usage.py).
    assert world.controller.can(cp, "create", "resourceclaimtemplates.resource.k8s.io",
                                namespace="default")
    for verb in ("list", "watch"):
        assert world.controller.can(cp, verb, "resourceclaims.resource.k8s.io"), verb
    assert world.controller.can(cp, "patch", "instances.edgeplug.io", namespace="default",
                                subresource="status")
    assert not world.controller.can(cp, "create", "resourceclaims.resource.k8s.io",
                                    namespace="default")


def test_the_agent_writes_only_its_own_nodes_slices(control_plane: ControlPlane,
                                                    enforced: World) -> None:
    cp, w = control_plane, enforced
    suffix = uuid.uuid4().hex[:6]
    own = _slice(f"own-{suffix}", label_node=w.node_a, node_name=w.node_a)
    assert _as(cp, w.agent_a, "create", body=own) == (True, "")
    refused = {
        "a shared pool listing it": _slice(f"r0-{suffix}", label_node=w.node_a,
                                           selector_nodes=[w.node_a, w.node_b]),
        "another node's label": _slice(f"r1-{suffix}", label_node=w.node_b, node_name=w.node_b),
        "bound to another node": _slice(f"r2-{suffix}", label_node=w.node_a,
                                        node_name=w.node_b),
        "a set without its node": _slice(f"r3-{suffix}", label_node=w.node_a,
                                          selector_nodes=[w.node_b]),
        "a pool of devices each naming nodes": _slice(
            f"r5-{suffix}", label_node=w.node_a,
            devices=[{"name": "d0", "nodeSelector": _by_hostname([w.node_a])}]),
        "another driver": _slice(f"r4-{suffix}", label_node=w.node_a, node_name=w.node_a,
                                 driver="gpu.example.com"),
    }
    for what, body in refused.items():
        ok, err = _as(cp, w.agent_a, "create", body=body)
        assert not ok, f"{what}: allowed"
        assert DENIED in err, f"{what}: {err}"
    # Node B's slice, written by someone else: the agent of A may neither take nor delete it.
    theirs = _slice(f"theirs-{suffix}", label_node=w.node_b, node_name=w.node_b)
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(theirs))
    taken = json.loads(json.dumps(theirs))
    taken["metadata"]["labels"]["edgeplug.io/node"] = w.node_a  # relabelled as its own
    ok, err = _as(cp, w.agent_a, "apply", "--server-side", "--force-conflicts", body=taken)
    assert not ok, "took another node's slice"
    assert DENIED in err, err
    ok, err = _as(cp, w.agent_a, "delete", "resourceslice", theirs["metadata"]["name"])
    assert not ok, "deleted another node's slice"
    assert DENIED in err, err
    assert _as(cp, w.agent_a, "delete", "resourceslice", own["metadata"]["name"]) == (True, "")


async def test_the_publisher_works_with_the_agents_token_alone(
    control_plane: ControlPlane, enforced: World, namespace: str
) -> None:
    w = enforced
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "rights", descriptions=["a"], shared=False, allocator="dra"))
    # The Instance as node A's agent makes it (discovery runs as admin here: only the
    # publisher's rights are under test).
    async with harness.agent_in_process(control_plane, node_name=w.node_a,
                                        namespace=namespace) as agent:
        client = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
        publisher = DraPublisher(client=client, node_name=w.node_a, namespace=None,
                                 devices=agent.devices)
        task = asyncio.create_task(publisher.run())
        try:
            admin = harness.api_client(control_plane)
            pool = slices.local_pool(namespace, "rights", w.node_a)

            async def published() -> bool:
                return len(h.pool_devices(await h.pool_slices(admin, pool))) == 1

            await harness.eventually(published, what=f"{pool} published with the agent's token")
            await admin.close()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


def test_the_controller_writes_only_shared_pools_of_the_driver(control_plane: ControlPlane,
                                                              enforced: World) -> None:
    cp, w = control_plane, enforced
    suffix = uuid.uuid4().hex[:6]

    def controllers(body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "edgeplug-controller"}
        return body

    shared = controllers(_slice(f"cs-{suffix}", label_node="", selector_nodes=[w.node_a]))
    deadline = time.monotonic() + POLICY_ACTIVE_S
    refused = {
        "a node's local pool": controllers(_slice(f"cr1-{suffix}", label_node="",
                                                  node_name=w.node_a)),
        "another driver": controllers(_slice(f"cr2-{suffix}", label_node="",
                                             selector_nodes=[w.node_a],
                                             driver="gpu.example.com")),
        "not labelled as the controller's": _slice(f"cr3-{suffix}", label_node=w.node_a,
                                                   selector_nodes=[w.node_a]),
        "a device bound to one node": controllers(_slice(
            f"cr4-{suffix}", label_node="", devices=[
                {"name": "d0", "nodeSelector": _by_hostname([w.node_a])},
                {"name": "d1", "nodeName": w.node_b}])),
        "a device on every node": controllers(_slice(
            f"cr5-{suffix}", label_node="", devices=[{"name": "d0", "allNodes": True}])),
        "a device selecting nodes by another label": controllers(_slice(
            f"cr6-{suffix}", label_node="",
            devices=[{"name": "d0", "nodeSelector": _by_hostname(["x"], key="zone")}])),
    }
    for what, body in refused.items():
        while True:  # the policy is loaded asynchronously: the first refusal waits for it
            ok, err = _as(cp, w.controller, "create", body=body)
            if not ok or time.monotonic() > deadline:
                break
            cp.kubectl("delete", "resourceslice", body["metadata"]["name"], check=False)
            time.sleep(0.2)  # polling a condition with a deadline, not a synchronisation sleep
        assert not ok, f"{what}: allowed"
        assert DENIED in err, f"{what}: {err}"
    pooled = controllers(_slice(f"cp-{suffix}", label_node="", devices=[
        {"name": "d0", "nodeSelector": _by_hostname([w.node_a])},
        {"name": "d1", "nodeSelector": _by_hostname([w.node_a, w.node_b])}]))
    for body in (shared, pooled):
        assert _as(cp, w.controller, "create", body=body) == (True, "")
        assert _as(cp, w.controller, "delete", "resourceslice", body["metadata"]["name"]) == (
            True, "")
