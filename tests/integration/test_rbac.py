"""The RBAC in deploy/manifests is enough for the real agent and controller, and no more.

A ClusterRole that misses one verb shows up only in a cluster, as a 403 in a
log. Here the manifests are applied to the real API server (RBAC authorization on), a token is
minted for each ServiceAccount through the TokenRequest API, and the real agent and the real
controller run with nothing but that token: Instances appear, the node is labelled, a pod gets a
slot, Events and conditions are written, broker pods and services are created. The tokens are
also asked (SelfSubjectAccessReview) about what they must not do, and the admission policy that
confines the agent to edgeplug.io/ labels on its own Node is shown refusing the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Event, Node, Pod, Secret, ServiceAccount
from lightkube.types import PatchType

from agent.discovery.events import (
    REASON_INVALID_DETAILS,
    REASON_PROPERTY_UNAVAILABLE,
    condition_type_for,
)
from agent.discovery.node_labels import LABEL_VALUE, label_key
from agent.kube.client import ConfigurationResource, as_dict
from agent.main import run_agent
from agent.settings import AgentSettings
from controller.grants.agent_access import AgentAccess
from crds.naming import instance_name
from tests.harness import hermetic
from tests.harness.agent_process import (
    api_client,
    apply,
    debug_echo_configuration,
    eventually,
    instances,
)
from tests.harness.aio_process import stop_popen, task_running
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.node_emulator import NodeEmulator
from tests.harness.offer_grants import offer_grants, wait_offer
from tests.harness.service_accounts import (
    Identity,
    apply_compat,
    kubelet_certificate,
    mint,
    pod_bound,
)

pytestmark = pytest.mark.timeout(300)

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
PEERING_CRDS = REPO_ROOT / "deploy" / "kopf-peering.yaml"
#: The agent's Instance policy too: the real agent below must do its whole job under it.
RBAC_FILES = ("namespace.yaml", "agent-rbac.yaml", "agent-node-policy.yaml",
              "agent-instance-policy.yaml", "agent-pod-policy.yaml",
              "agent-node-account-policy.yaml", "controller-rbac.yaml",
              "controller-node-policy.yaml", "controller-policy.yaml")
SYSTEM_NAMESPACE = "edgeplug-system"
#: The nodes' own accounts (agent/kube/node_account.py), as the DaemonSet names them.
NODE_ACCOUNTS = f"{SYSTEM_NAMESPACE}-nodes"
AGENT_ACCOUNT = "edgeplug-agent"
CONTROLLER_ACCOUNT = "edgeplug-controller"
#: Generous: the machine is shared; no deadline here is a pass/fail timing.
WAIT_S = 60.0
POLL_S = 0.2
CONTROLLER_STOP_S = 10.0
#: Short intervals so the controller resyncs and heartbeats while the test watches.
CONTROLLER_ARGS = ("--resync-interval", "1", "--peering-lifetime", "4")
#: Log lines that mean the API server refused a call for lack of permission...
PERMISSION_MARKERS = ("HTTP/1.1 403", "Forbidden", "forbidden", "Not enough permissions")
#: ...except a write into a namespace an earlier test deleted (the parts watch cluster-wide).
TERMINATING_NAMESPACE = "because it is being terminated"


# -- identities ----------------------------------------------------------------------------


def _agent_on(cp: ControlPlane, node: str, folder: Path) -> Identity:
    """The agent's token as its DaemonSet pod on ``node`` gets it (the node policy reads it)."""
    return pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node,
                     folder=folder)


@pytest.fixture(scope="module")
def identities(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Identity]]:
    cp = control_plane
    cp.kubectl("apply", "-f", str(PEERING_CRDS))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/kopfpeerings.kopf.dev", "crd/clusterkopfpeerings.kopf.dev")
    for name in RBAC_FILES:
        cp.kubectl("apply", "-f", str(MANIFESTS / name))
    apply_compat(cp)  # the real agent below serves a shared device through device plugins
    folder = tmp_path_factory.mktemp("rbac")
    # The agents' writes name Configurations the controller's offer grants must name.
    with offer_grants(cp, folder):
        yield {account: mint(cp, namespace=SYSTEM_NAMESPACE, account=account,
                             path=folder / account)
               for account in (AGENT_ACCOUNT, CONTROLLER_ACCOUNT)}


# -- the manifests themselves --------------------------------------------------------------


def test_every_manifest_passes_the_api_servers_strict_validation(
    control_plane: ControlPlane, identities: dict[str, Identity]
) -> None:
    result = control_plane.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-k", str(MANIFESTS), check=False
    )
    assert result.returncode == 0, result.stderr
    for applied in ("daemonset.apps/edgeplug-agent", "deployment.apps/edgeplug-controller",
                    "clusterrole.rbac.authorization.k8s.io/edgeplug-agent"):
        assert applied in result.stdout, result.stdout


# -- what each token may and may not do ----------------------------------------------------

#: (verb, resource, subresource, cluster-wide?) the agent's code needs.
AGENT_NEEDS = [
    ("watch", "configurations.edgeplug.io", None),
    ("list", "configurations.edgeplug.io", None),
    ("get", "configurations.edgeplug.io", None),
    ("patch", "configurations.edgeplug.io", "status"),
    ("create", "instances.edgeplug.io", None),
    ("patch", "instances.edgeplug.io", None),
    ("delete", "instances.edgeplug.io", None),
    ("watch", "instances.edgeplug.io", None),
    ("patch", "instances.edgeplug.io", "status"),
    ("get", "nodes", None),
    ("patch", "nodes", None),
    ("create", "events", None),
    ("watch", "pods", None),
    ("patch", "pods", None),
]
AGENT_MUST_NOT = [
    ("create", "pods", None),
    # Pods are read by watch (Pending ones) and by an empty patch the pod policy confines to
    # the agent's node (agent/deviceplugins/pod_annotations.py), never by a get on any pod; the pods
    # bound to its node are listed with the kubelet's certificate (agent/kube/node_reads.py).
    ("get", "pods", None),
    ("list", "pods", None),
    ("patch", "pods", "status"),
    # Only the Secrets and ConfigMaps Configurations name, granted per namespace by the
    # controller (controller/grants/agent_access.py); nothing cluster-wide.
    ("get", "secrets", None),
    ("watch", "secrets", None),
    ("watch", "configmaps", None),
    ("list", "secrets", None),
    ("create", "secrets", None),
    ("update", "secrets", None),
    ("delete", "nodes", None),
    ("create", "configurations.edgeplug.io", None),
    ("patch", "configurations.edgeplug.io", None),
    ("delete", "configurations.edgeplug.io", None),
    ("update", "instances.edgeplug.io", None),
    ("create", "leases.coordination.k8s.io", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
]
CONTROLLER_NEEDS = [
    ("watch", "configurations.edgeplug.io", None),
    ("patch", "configurations.edgeplug.io", None),
    ("patch", "configurations.edgeplug.io", "status"),
    ("watch", "instances.edgeplug.io", None),
    ("patch", "instances.edgeplug.io", None),
    ("delete", "instances.edgeplug.io", None),
    ("create", "pods", None),
    ("delete", "pods", None),
    ("create", "jobs.batch", None),
    ("patch", "services", None),
    ("watch", "nodes", None),
    ("patch", "nodes", None),
    ("create", "events", None),
    ("patch", "clusterkopfpeerings.kopf.dev", None),
    # controller/grants/agent_access.py: the agent's one Role and RoleBinding, by name (server-side
    # apply names it; so does the list, by field selector).
    ("create", "roles.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
    ("patch", "roles.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
    ("escalate", "roles.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
    ("bind", "roles.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
    ("patch", "rolebindings.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
    ("list", "roles.rbac.authorization.k8s.io/edgeplug-agent-properties", None),
]
CONTROLLER_MUST_NOT = [
    # No Secret or ConfigMap read at all: the agent's Roles are written by escalate and bind
    # on their one name (tests/integration/test_attacks_controller.py tries the rest).
    ("get", "secrets", None),
    ("watch", "secrets", None),
    ("list", "secrets", None),
    ("get", "configmaps", None),
    ("watch", "configmaps", None),
    ("list", "configmaps", None),
    ("escalate", "roles.rbac.authorization.k8s.io", None),
    ("bind", "roles.rbac.authorization.k8s.io", None),
    ("bind", "clusterroles.rbac.authorization.k8s.io", None),
    ("create", "roles.rbac.authorization.k8s.io", None),
    ("create", "rolebindings.rbac.authorization.k8s.io", None),
    ("list", "roles.rbac.authorization.k8s.io", None),
    ("patch", "clusterroles.rbac.authorization.k8s.io", None),
    ("update", "validatingwebhookconfigurations.admissionregistration.k8s.io", None),
    ("impersonate", "serviceaccounts", None),
    ("delete", "nodes", None),
    ("create", "instances.edgeplug.io", None),
    ("create", "configurations.edgeplug.io", None),
    ("delete", "configurations.edgeplug.io", None),
    ("update", "pods", None),
    ("create", "pods", "exec"),
    ("create", "deployments.apps", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
]


def _verdicts(cp: ControlPlane, who: Identity,
              table: list[tuple[str, str, str | None]]) -> dict[str, bool]:
    return {
        f"{verb} {resource}{'/' + sub if sub else ''}": who.can(cp, verb, resource,
                                                                 subresource=sub)
        for verb, resource, sub in table
    }


@pytest.mark.parametrize(
    ("account", "needs", "must_not"),
    [
        (AGENT_ACCOUNT, AGENT_NEEDS, AGENT_MUST_NOT),
        (CONTROLLER_ACCOUNT, CONTROLLER_NEEDS, CONTROLLER_MUST_NOT),
    ],
)
def test_token_may_do_what_the_code_needs_and_not_more(
    control_plane: ControlPlane,
    identities: dict[str, Identity],
    account: str,
    needs: list[tuple[str, str, str | None]],
    must_not: list[tuple[str, str, str | None]],
) -> None:
    who = identities[account]
    denied = [action for action, ok in _verdicts(control_plane, who, needs).items() if not ok]
    assert not denied, f"{account} lacks permissions its code uses: {denied}"
    allowed = [action for action, ok in _verdicts(control_plane, who, must_not).items() if ok]
    assert not allowed, f"{account} holds permissions it should not: {allowed}"


def test_a_token_is_refused_by_the_api_server_outside_its_role(
    control_plane: ControlPlane, identities: dict[str, Identity], namespace: str
) -> None:
    """Not only the access review: a real request with the agent's token is refused."""
    result = identities[AGENT_ACCOUNT].kubectl(control_plane, "get", "secrets", "-n", namespace)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower(), result.stderr


# -- the real agent on its own token -------------------------------------------------------


@contextlib.asynccontextmanager
async def emulated_node(cp: ControlPlane) -> AsyncIterator[NodeEmulator]:
    # Short paths: a Unix socket path must fit in 108 bytes.
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-rbac-dp-", dir="/tmp"))
    resources_dir = Path(tempfile.mkdtemp(prefix="ep-rbac-pr-", dir="/tmp"))
    emulator = NodeEmulator(
        node_name=f"rbac-{uuid.uuid4().hex[:8]}", kubeconfig=cp.kubeconfig,
        plugin_dir=plugin_dir, pod_resources_socket=resources_dir / "kubelet.sock",
    )
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop(delete_node=True)
        shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(resources_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def agent_on_its_token(
    cp: ControlPlane, folder: Path, name: str
) -> AsyncIterator[tuple[NodeEmulator, asyncio.Task[None], Identity]]:
    """The whole agent (``run_agent``) as a task, on an emulated node, with nothing but the
    token its DaemonSet pod there gets and the node's kubelet certificate (the node's own
    reads); the pod it is bound to is deleted on leaving."""
    async with emulated_node(cp) as node:
        identity = _agent_on(cp, node.node_name, folder)
        try:
            async with task_running(run_agent(AgentSettings(
                node_name=node.node_name, kubeconfig=identity.kubeconfig,
                plugin_dir=node.plugin_dir, pod_resources_socket=node.pod_resources_socket,
                kubelet_client_cert=kubelet_certificate(cp, node.node_name, folder),
                node_accounts_namespace=NODE_ACCOUNTS,
            )), name=name) as agent:
                yield node, agent, identity
        finally:
            cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                       f"{AGENT_ACCOUNT}-{node.node_name}", check=False)



def refusals(lines: list[str]) -> list[str]:
    return [line for line in lines
            if any(marker in line for marker in PERMISSION_MARKERS)
            and TERMINATING_NAMESPACE not in line]


async def test_the_real_agent_works_with_its_token_alone(
    control_plane: ControlPlane,
    identities: dict[str, Identity],
    namespace: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert identities, "the RBAC is applied by this fixture"
    caplog.set_level(logging.INFO)
    cp, admin = control_plane, api_client(control_plane)
    secret = Secret.from_dict({"metadata": {"name": "cam-login", "namespace": namespace},
                               "stringData": {"password": "s3cret"}})
    good = debug_echo_configuration(
        "rbac-cam", descriptions=["cam0"], discovery_properties=[
            {"name": "password",
             "valueFrom": {"secretKeyRef": {"name": "cam-login", "key": "password"}}}])
    bad = debug_echo_configuration("rbac-bad", descriptions=[], raw_details="descriptions: 7")
    # The controller's part: each node may read exactly the Secrets Configurations selecting
    # it name, as its own account.
    access = asyncio.create_task(
        AgentAccess(admin, account=(SYSTEM_NAMESPACE, AGENT_ACCOUNT),
                    node_accounts=NODE_ACCOUNTS).run())
    try:
        apply(cp, namespace, good, bad)

        async def granted() -> bool:
            found = cp.kubectl("get", "role", "edgeplug-agent-properties", "-n", namespace,
                               check=False)
            return found.returncode == 0

        await eventually(granted, what="the agent's Role for the named Secret")
        # And the controller's offer grant (tests/harness/offer_grants.py, kept by the
        # identities fixture): before it, the agent's first writes would be refused.
        await asyncio.to_thread(wait_offer, cp, namespace, "rbac-cam", "any-node")
        async with agent_on_its_token(cp, tmp_path, "agent-with-its-token") as (
                node, agent, agent_identity):
            # Problems are told on the Configuration: Events and status are writable.
            await _assert_problem_reported(admin, namespace, node.node_name, agent,
                                           "rbac-bad", REASON_INVALID_DETAILS)
            await _assert_problem_reported(admin, namespace, node.node_name, agent,
                                           "rbac-cam", REASON_PROPERTY_UNAVAILABLE)
            # The Secret appears: only a Secret watch can restart the run.
            await admin.create(cast(Secret, secret))
            await _assert_agent_published(admin, namespace, node.node_name, agent)
            # ... and no other: a Secret no Configuration names stays unreadable.
            await admin.create(cast(Secret, Secret.from_dict({
                "metadata": {"name": "unnamed", "namespace": namespace},
                "stringData": {"password": "other"}})))
            unnamed = agent_identity.kubectl(cp, "get", "secret", "unnamed", "-n", namespace)
            assert unnamed.returncode != 0
            assert "forbidden" in unnamed.stderr.lower(), unnamed.stderr
            # The agents' shared account reads no Secret at all: the node's own does.
            named = agent_identity.kubectl(cp, "get", "secret", "cam-login", "-n", namespace)
            assert named.returncode != 0
            assert "forbidden" in named.stderr.lower(), named.stderr
            own = mint(cp, namespace=NODE_ACCOUNTS, account=f"node-{node.node_name}",
                       path=tmp_path / "node-account")
            named = own.kubectl(cp, "get", "secret", "cam-login", "-n", namespace)
            assert named.returncode == 0, named.stderr
            await assert_pod_got_a_slot(admin, namespace, node.node_name, agent)
            await _assert_agent_leaves(cp, admin, namespace, node.node_name, agent,
                                       offline=tmp_path / "offline")
            assert not agent.done(), "the agent stopped"
    finally:
        access.cancel()
        await asyncio.gather(access, return_exceptions=True)
        await admin.close()
    complaints = refusals(
        [record.getMessage() for record in caplog.records if record.name.startswith("agent")]
    )
    assert not complaints, f"the agent was refused: {complaints}"


def _alive(agent: asyncio.Task[None]) -> None:
    if agent.done():
        raise AssertionError(f"the agent stopped: {agent.exception()!r}")


async def _assert_agent_published(
    admin: AsyncClient, namespace: str, node: str, agent: asyncio.Task[None]
) -> None:
    name = instance_name("rbac-cam", "cam0", shared=True, node=node)

    async def published() -> dict[str, Any] | None:
        _alive(agent)
        found = (await instances(admin, namespace)).get(name)
        # created, and named in spec.nodes by the apply that follows the create
        return found if found is not None and "nodes" in found["spec"] else None

    found = await eventually(
        published, what=f"Instance {name} (once the Secret watch restarts the run)",
        deadline=WAIT_S,
    )
    assert found["spec"]["nodes"] == [node]

    async def labelled() -> bool:
        _alive(agent)
        labels = (await admin.get(Node, node)).metadata.labels or {}  # type: ignore[union-attr]
        return labels.get(label_key("rbac-cam")) == LABEL_VALUE

    await eventually(labelled, what=f"node {node} labelled {label_key('rbac-cam')}",
                     deadline=WAIT_S)


async def assert_pod_got_a_slot(
    admin: AsyncClient, namespace: str, node: str, agent: asyncio.Task[None]
) -> None:
    """Allocate claims the slot in deviceUsage: the agent's Instance patches are allowed."""
    name = instance_name("rbac-cam", "cam0", shared=True, node=node)

    async def has_account() -> bool:
        await admin.get(ServiceAccount, "default", namespace=namespace)
        return True

    await eventually(has_account, what=f"ServiceAccount default in {namespace}", deadline=WAIT_S)
    pod = Pod.from_dict({
        "metadata": {"name": "uses-cam", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                            "resources": {"limits": {f"edgeplug.io/{name}": "1"}}}],
        },
    })
    await admin.create(cast(Pod, pod))

    async def claimed() -> list[str] | None:
        _alive(agent)
        usage = (await instances(admin, namespace))[name]["spec"]["deviceUsage"]
        return list(usage.values()) if list(usage.values()) == [node] else None

    await eventually(claimed, what=f"the slot of {name} claimed by {node}", deadline=WAIT_S)

    async def running() -> bool:
        found = await admin.get(Pod, "uses-cam", namespace=namespace)
        return found.status is not None and found.status.phase == "Running"

    await eventually(running, what="pod uses-cam Running", deadline=WAIT_S)


async def _assert_agent_leaves(
    cp: ControlPlane, admin: AsyncClient, namespace: str, node: str, agent: asyncio.Task[None],
    *, offline: Path,
) -> None:
    """Devices gone: the agent leaves a shared Instance (server-side apply without its node,
    then delete) and deletes a local one; the Instance policy must let it do both."""
    shared = debug_echo_configuration("rbac-leave", descriptions=["cam1"], grace=0,
                                      availability_file=offline)
    local = debug_echo_configuration("rbac-local", descriptions=["cam2"], shared=False,
                                     availability_file=offline)
    names = [instance_name("rbac-leave", "cam1", shared=True, node=node),
             instance_name("rbac-local", "cam2", shared=False, node=node)]
    apply(cp, namespace, shared, local)

    async def published() -> bool:
        _alive(agent)
        found = await instances(admin, namespace)
        return all(found.get(name, {}).get("spec", {}).get("nodes") == [node] for name in names)

    await eventually(published, what=f"Instances {names} on {node}", deadline=WAIT_S)
    # The debugEcho handler's "every device offline".
    await asyncio.to_thread(offline.write_text, "OFFLINE\n")

    async def left() -> bool:
        _alive(agent)
        found = await instances(admin, namespace)
        return not any(name in found for name in names)

    await eventually(left, what=f"Instances {names} left and deleted by the agent",
                     deadline=WAIT_S)


async def _assert_problem_reported(
    admin: AsyncClient, namespace: str, node: str, agent: asyncio.Task[None],
    configuration: str, reason: str,
) -> None:
    """A Warning Event and this node's False condition, both with ``reason``."""

    async def condition() -> dict[str, Any] | None:
        _alive(agent)
        cfg = as_dict(await admin.get(ConfigurationResource, configuration, namespace=namespace))
        for cond in (cfg.get("status") or {}).get("conditions") or []:
            if cond["type"] == condition_type_for(reason, node) and cond["status"] == "False":
                return cast(dict[str, Any], cond)
        return None

    cond = await eventually(condition, what=f"condition {condition_type_for(reason, node)}=False",
                            deadline=WAIT_S)
    assert cond["reason"] == reason

    async def event() -> Event | None:
        async for found in admin.list(Event, namespace=namespace):
            if found.involvedObject.name == configuration and found.reason == reason:
                return found
        return None

    warning = await eventually(event, what=f"a Warning Event {reason} on {configuration}",
                               deadline=WAIT_S)
    assert warning.type == "Warning"


# -- the real controller on its own token --------------------------------------------------


@pytest.fixture
def controller(
    control_plane: ControlPlane, identities: dict[str, Identity], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``python -m controller.main`` cluster-wide with peering, as the Deployment runs it."""
    kubeconfig = identities[CONTROLLER_ACCOUNT].kubeconfig
    log = tmp_path / "controller.log"
    env = hermetic.controller_environment(
        {**control_plane.env(), "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"})
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "controller.main", "--kubeconfig", str(kubeconfig),
             *CONTROLLER_ARGS],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield process, log
    finally:
        stop_popen(process, grace_s=CONTROLLER_STOP_S)


def _publish(cp: ControlPlane, namespace: str, configuration: dict[str, Any], node: str) -> str:
    """Apply ``configuration`` and the Instance an agent on ``node`` would publish for it (the
    agent's own RBAC is tested above); returns the Instance's name."""
    apply(cp, namespace, configuration)
    cfg = configuration["metadata"]["name"]
    created = cp.get_json(f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/configurations/"
                          f"{cfg}")
    assert created is not None
    owner = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "name": cfg,
             "uid": cast(dict[str, Any], created["metadata"])["uid"]}
    name = instance_name(cfg, "cam0", shared=True, node=node)
    apply(cp, namespace, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "labels": {"edgeplug.io/configuration": cfg},
                     "ownerReferences": [owner]},
        "spec": {"configurationName": cfg, "cdiName": f"edgeplug.io/{cfg}={name[-6:]}",
                 "capacity": 1, "shared": True, "nodes": [node],
                 "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "cam0"},
                 "deviceUsage": {f"{name}-0": ""}},
    })
    return name


async def test_the_real_controller_works_with_its_token_alone(
    control_plane: ControlPlane,
    namespace: str,
    controller: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, log = controller
    cp = control_plane
    node = f"rbac-{uuid.uuid4().hex[:8]}"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    container = {"name": "broker", "image": "registry.invalid/broker:1",
                 "resources": {"limits": {"{{PLACEHOLDER}}": "1"}}}
    pods = debug_echo_configuration("rbac-brokers", descriptions=["cam0"])
    pods["spec"]["brokerSpec"] = {"brokerPodSpec": {"containers": [container]}}
    pods["spec"]["instanceServiceSpec"] = {"type": "ClusterIP",
                                           "ports": [{"name": "grpc", "port": 80}]}
    jobs = debug_echo_configuration("rbac-jobs", descriptions=["cam0"])
    jobs["spec"]["brokerSpec"] = {"brokerJobSpec": {"template": {"spec": {
        "containers": [container], "restartPolicy": "Never"}}}}
    by_pod = _publish(cp, namespace, pods, node)
    by_job = _publish(cp, namespace, jobs, node)
    admin = api_client(cp)
    try:
        await _assert_brokers_made(admin, cp, namespace, by_pod, process, log)
        await _assert_job_made(cp, namespace, by_job, process, log)
        # The node goes: the controller takes it out of the Instances (patch or delete).
        cp.kubectl("delete", "node", node)
        await _assert_node_dropped(cp, namespace, by_pod, node, process, log)
    finally:
        await admin.close()
        cp.kubectl("delete", "node", node, "--ignore-not-found", check=False)
    text = log.read_text(errors="replace")
    complaints = refusals(text.splitlines())
    assert not complaints, "the controller was refused:\n" + "\n".join(complaints)


def _alive_controller(process: subprocess.Popen[bytes], log: Path) -> None:
    if process.poll() is not None:
        raise AssertionError(f"the controller exited ({process.returncode}):\n"
                             + log.read_text(errors="replace")[-4000:])


async def _assert_job_made(cp: ControlPlane, namespace: str, instance: str,
                           process: subprocess.Popen[bytes], log: Path) -> None:
    async def job() -> dict[str, Any] | None:
        _alive_controller(process, log)
        found = cp.get_json(f"/apis/batch/v1/namespaces/{namespace}/jobs")
        for item in cast(list[dict[str, Any]], (found or {}).get("items") or []):
            if (item["metadata"].get("labels") or {}).get("edgeplug.io/instance") == instance:
                return item
        return None

    await eventually(job, what=f"a broker Job for {instance}", deadline=WAIT_S)


async def _assert_node_dropped(cp: ControlPlane, namespace: str, instance: str, node: str,
                               process: subprocess.Popen[bytes], log: Path) -> None:
    async def dropped() -> bool:
        _alive_controller(process, log)
        found = cp.get_json(f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances/"
                            f"{instance}")
        return found is None or node not in cast(dict[str, Any], found["spec"])["nodes"]

    await eventually(dropped, what=f"node {node} taken out of Instance {instance}",
                     deadline=WAIT_S)


async def _assert_brokers_made(
    admin: AsyncClient, cp: ControlPlane, namespace: str, instance: str,
    process: subprocess.Popen[bytes], log: Path,
) -> None:
    def alive() -> None:
        _alive_controller(process, log)

    async def broker() -> Pod | None:
        alive()
        async for pod in admin.list(Pod, namespace=namespace):
            labels = (pod.metadata.labels if pod.metadata else None) or {}
            if labels.get("edgeplug.io/instance") == instance:
                return pod
        return None

    pod = await eventually(broker, what=f"a broker pod for {instance}", deadline=WAIT_S)
    assert pod.spec is not None
    limits = pod.spec.containers[0].resources.limits or {}  # type: ignore[union-attr]
    assert limits.get(f"edgeplug.io/{instance}") == "1"

    async def service() -> dict[str, Any] | None:
        alive()
        found = cp.get_json(f"/api/v1/namespaces/{namespace}/services")
        items = cast(list[dict[str, Any]], (found or {}).get("items") or [])
        return items[0] if items else None

    await eventually(service, what="the Instance service", deadline=WAIT_S)

    async def status() -> dict[str, Any] | None:
        alive()
        cfg = as_dict(await admin.get(ConfigurationResource, "rbac-brokers",
                                      namespace=namespace))
        found = cast(dict[str, Any], cfg.get("status") or {})
        return found if found.get("instanceCount") == 1 else None

    await eventually(status, what="Configuration status.instanceCount 1", deadline=WAIT_S)

    async def event() -> Event | None:
        alive()
        async for found in admin.list(Event, namespace=namespace):
            if found.involvedObject.name == "rbac-brokers" and found.type == "Normal":
                return found
        return None

    await eventually(event, what="an Event on Configuration rbac-brokers", deadline=WAIT_S)

    async def heartbeat() -> bool:
        alive()
        found = cp.get_json("/apis/kopf.dev/v1/clusterkopfpeerings")
        peerings = cast(list[dict[str, Any]], (found or {}).get("items") or [])
        return any(p.get("status") for p in peerings)

    await eventually(heartbeat, what="a heartbeat in a ClusterKopfPeering", deadline=WAIT_S)


# -- the node policy -------------------------------------------------------------------------


def test_agent_may_change_only_edgeplug_labels_and_its_record_on_its_own_node(
    control_plane: ControlPlane, identities: dict[str, Identity], tmp_path: Path
) -> None:
    """RBAC grants nodes/patch on every Node; the admission policy narrows it."""
    cp = control_plane
    own, other = (f"rbac-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for node in (own, other):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    agent = _agent_on(cp, own, tmp_path)
    unbound = identities[AGENT_ACCOUNT]
    try:
        mine = agent.kubectl(cp, "label", "node", own, "edgeplug.io/cam=true")
        assert mine.returncode == 0, mine.stderr

        def refused(who: Identity, *args: str) -> str | None:
            result = who.kubectl(cp, *args)
            return result.stderr if result.returncode != 0 else None

        def eventually_refused(who: Identity, *args: str, because: str) -> None:
            # An admission policy takes effect shortly after it is created; wait for that.
            message = wait_for(lambda: refused(who, *args), what=f"{args} refused")
            assert because in message, message

        eventually_refused(agent, "label", "node", other, "edgeplug.io/cam=true",
                           because="only the Node its pod runs on")
        eventually_refused(unbound, "label", "node", own, "edgeplug.io/x=true",
                           because="only the Node its pod runs on")
        eventually_refused(agent, "label", "node", own, "team=edge",
                           because="only edgeplug.io/ labels")
        # Huawei's Ascend plugin's labels (Volcano and MindCluster read them): set, and changed,
        # but never removed (an NPU node's accelerator label is often its admin's own).
        for label in ("accelerator=huawei-Ascend910", "servertype=Ascend910B-20",
                      "accelerator=huawei-Ascend310P"):
            huawei = agent.kubectl(cp, "label", "--overwrite", "node", own, label)
            assert huawei.returncode == 0, huawei.stderr
        eventually_refused(agent, "label", "node", own, "accelerator-",
                           because="only edgeplug.io/ labels")
        eventually_refused(agent, "label", "node", own, "node.kubernetes.io/instance-type=x",
                           because="only edgeplug.io/ labels")
        # (kubectl cordon exits 0 even when refused; a plain patch says what happened.)
        eventually_refused(agent, "patch", "node", own, "-p", '{"spec":{"unschedulable":true}}',
                           because="only edgeplug.io/ labels")
        eventually_refused(agent, "annotate", "node", own, "team=edge",
                           because="only its edgeplug.io/labels annotation")
        eventually_refused(agent, "annotate", "node", own, "edgeplug.io/other=x",
                           because="only its edgeplug.io/labels annotation")
        record = agent.kubectl(cp, "annotate", "node", own,
                               'edgeplug.io/labels={"ns/cam":["edgeplug.io/cam"]}')
        assert record.returncode == 0, record.stderr
        removed = agent.kubectl(cp, "label", "node", own, "edgeplug.io/cam-")
        assert removed.returncode == 0, removed.stderr
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, f"edgeplug-agent-{own}",
                   "--wait=false", check=False)
        cp.kubectl("delete", "node", own, other, "--wait=false", check=False)


def wait_for(check: Callable[[], str | None], *, what: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while (result := check()) is None:
        assert time.monotonic() < deadline, f"waited {WAIT_S:.0f}s for {what}"
        time.sleep(POLL_S)
    return result


def test_controller_may_change_only_the_pinned_demand_annotation_on_nodes(
    control_plane: ControlPlane, identities: dict[str, Identity]
) -> None:
    """RBAC grants the controller nodes/patch on every Node; its node policy narrows it to the
    one annotation controller/brokers/pinned_demand.py writes (a merge patch, as the controller
    sends: kubectl's label and patch commands would read the Node first, which it may not)."""
    cp = control_plane
    node = f"rbac-{uuid.uuid4().hex[:8]}"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    controller = Client(KubeConfig.from_file(str(identities[CONTROLLER_ACCOUNT].kubeconfig)))

    def patch(body: dict[str, Any]) -> str | None:
        """None when allowed, else the API server's refusal."""
        try:
            controller.patch(Node, node, body, patch_type=PatchType.MERGE)
        except ApiError as error:
            return str(error.status.message)
        return None

    try:
        for body in ({"metadata": {"labels": {"team": "edge"}}},
                     {"metadata": {"annotations": {"edgeplug.io/labels": "x"}}},
                     {"spec": {"unschedulable": True}}):
            message = wait_for(functools.partial(patch, body), what=f"{body} refused")
            assert "only the edgeplug.io/pinned-demand annotation" in message, message
        assert patch({"metadata": {"annotations": {
            "edgeplug.io/pinned-demand": '{"edgeplug.io/cam":1}'}}}) is None
        assert patch({"metadata": {"annotations": {"edgeplug.io/pinned-demand": None}}}) is None
    finally:
        controller.close()
        cp.kubectl("delete", "node", node, "--wait=false", check=False)
