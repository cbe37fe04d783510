"""The liveness rights, tried with stolen tokens: a node's agent writes only its own node's
Lease, and the controller's DeviceTaintRules taint only edgeplug.io's local pools, NoSchedule.

With deploy/manifests' agent and controller accounts and deploy/dra applied as a user applies
them, on the real API server: node A's agent token (bound to a pod on A, as its DaemonSet pod's
is) renews its own Lease through ``agent.kube.liveness`` and is refused renewing, taking, creating,
reading or deleting node B's; the controller's token writes the rules
``controller.dra.agent_gone_taints`` writes and is refused a rule on another driver, a shared pool,
another taint or ``NoExecute`` (which would evict every pod holding the devices), and any
change to a rule not its own. deploy/README.md says the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.generic_resource import create_global_resource
from lightkube.resources.coordination_v1 import Lease
from lightkube.types import PatchType

from agent.kube.liveness import LivenessLease
from controller.dra.agent_gone_taints import AgentGoneTaints, rule_body
from controller.dra.agent_liveness import AgentLiveness
from controller.kube.rest import Rest
from crds import agent_liveness, dra_slices
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import Identity, apply_manifests, mint, pod_bound

pytestmark = pytest.mark.timeout(180)

DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
SYSTEM_NAMESPACE = "edgeplug-system"
FILES = ("namespace.yaml", "agent-rbac.yaml", "controller-rbac.yaml")
POLICY_ACTIVE_S = 60.0
POLL_S = 0.2
DENIED = "denied request"
AGENT_ONLY = "may write only the liveness Lease of its own node"
RULES_ONLY = "only its own agent-gone DeviceTaintRules"
LOCAL_ONLY = "taint only a local pool of the driver"
RuleV1 = create_global_resource("resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules")


@dataclass(frozen=True)
class Tokens:
    node_a: str
    node_b: str
    agent_a: Identity
    agent_b: Identity
    unbound: Identity
    controller: Identity


@pytest.fixture(scope="module")
def tokens(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Tokens]:
    cp = control_plane
    apply_manifests(cp, FILES)
    cp.kubectl("apply", "-k", str(DRA_MANIFESTS))
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"live-a-{suffix}", f"live-b-{suffix}"
    for node in (node_a, node_b):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    folder = tmp_path_factory.mktemp("liveness")
    account = "edgeplug-agent"
    try:
        yield Tokens(
            node_a, node_b,
            pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=account, node=node_a,
                      folder=folder),
            pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=account, node=node_b,
                      folder=folder),
            mint(cp, namespace=SYSTEM_NAMESPACE, account=account, path=folder / "unbound"),
            mint(cp, namespace=SYSTEM_NAMESPACE, account="edgeplug-controller",
                 path=folder / "controller"))
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"{account}-{node_a}", f"{account}-{node_b}", check=False)
        leases = [f"{agent_liveness.LEASE_PREFIX}{n}" for n in (node_a, node_b)]
        cp.kubectl("delete", "lease", "-n", SYSTEM_NAMESPACE, "--wait=false", *leases,
                   check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _client(who: Identity) -> Client:
    return Client(KubeConfig.from_file(str(who.kubeconfig)), field_manager="attacker")


def _outcome(call: Callable[[], object]) -> tuple[bool, int, str]:
    try:
        call()
    except ApiError as error:
        return False, error.status.code or 0, str(error.status.message)
    return True, 200, ""


def _refused_by_policy(call: Callable[[], object], fragment: str) -> None:
    """Refused by an admission policy (loaded asynchronously: retried until it is)."""
    deadline = time.monotonic() + POLICY_ACTIVE_S
    while True:
        allowed, code, message = _outcome(call)
        if not allowed and DENIED in message:
            break
        assert time.monotonic() < deadline, f"not refused by a policy in time: {message}"
        time.sleep(POLL_S)  # polling a condition with a deadline, not a synchronisation sleep
    assert code == 403, message
    assert fragment in message, message


def _refused_by_rbac(call: Callable[[], object]) -> None:
    allowed, code, message = _outcome(call)
    assert not allowed, "allowed; expected RBAC's refusal"
    assert code == 403, message
    assert "cannot" in message, message


async def _renew_once(who: Identity, node: str) -> None:
    """``agent.kube.liveness`` on ``who``'s token, until it has renewed once."""
    async with AsyncClient(KubeConfig.from_file(str(who.kubeconfig))) as client:
        lease = LivenessLease(client, node=node, namespace=SYSTEM_NAMESPACE, renew_s=0.2)
        task = asyncio.create_task(lease.run())
        deadline = time.monotonic() + POLICY_ACTIVE_S
        while lease.renewals < 1:
            assert time.monotonic() < deadline, f"{node}'s Lease never renewed"
            await asyncio.sleep(POLL_S)
        task.cancel()


def _lease(name: str, holder: str) -> Lease:
    return cast(Lease, Lease.from_dict({"metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
                            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 6}}))


def test_a_node_writes_only_its_own_liveness_lease(control_plane: ControlPlane,
                                                   tokens: Tokens) -> None:
    t = tokens
    asyncio.run(_renew_once(t.agent_b, t.node_b))  # B's agent, on B's token: its own Lease
    theirs = f"{agent_liveness.LEASE_PREFIX}{t.node_b}"
    attacker = _client(t.agent_a)
    renewed = {"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}
    # A keeps B "alive" (its devices offered while its agent is dead), or takes B's Lease.
    _refused_by_policy(lambda: attacker.patch(Lease, theirs, renewed, namespace=SYSTEM_NAMESPACE,
                                              patch_type=PatchType.MERGE), AGENT_ONLY)
    _refused_by_policy(lambda: attacker.patch(
        Lease, theirs, {"spec": {"holderIdentity": t.node_a}}, namespace=SYSTEM_NAMESPACE,
        patch_type=PatchType.MERGE), AGENT_ONLY)
    # A Lease for a node A is not, and A's own name held by another node.
    _refused_by_policy(lambda: attacker.create(_lease(
        f"{agent_liveness.LEASE_PREFIX}other-{t.node_b}", f"other-{t.node_b}")), AGENT_ONLY)
    _refused_by_policy(lambda: attacker.create(_lease(
        f"{agent_liveness.LEASE_PREFIX}{t.node_a}", t.node_b)), AGENT_ONLY)
    # No read, no delete at all (RBAC): B's Lease cannot be removed to hide B's agent's death
    # from nobody, nor read.
    _refused_by_rbac(lambda: attacker.delete(Lease, theirs, namespace=SYSTEM_NAMESPACE))
    _refused_by_rbac(lambda: attacker.get(Lease, theirs, namespace=SYSTEM_NAMESPACE))
    # A token bound to no node writes no Lease.
    _refused_by_policy(lambda: _client(t.unbound).patch(
        Lease, theirs, renewed, namespace=SYSTEM_NAMESPACE, patch_type=PatchType.MERGE),
        AGENT_ONLY)
    stored = json.loads(control_plane.kubectl(
        "get", "lease", theirs, "-n", SYSTEM_NAMESPACE, "-o", "json").stdout)
    assert stored["spec"]["holderIdentity"] == t.node_b
    assert not stored["spec"]["renewTime"].startswith("2030"), stored["spec"]
    # The control: A's agent renews its own.
    asyncio.run(_renew_once(t.agent_a, t.node_a))


def _served(cp: ControlPlane) -> bool:
    return "devicetaintrules" in cp.kubectl(
        "api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout


def _rule(name: str, driver: str, pool: str, key: str, effect: str) -> Any:
    return RuleV1.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": driver, "pool": pool},
                 "taint": {"key": key, "value": "x", "effect": effect}}})


def test_the_controllers_taint_rules_reach_only_edgeplugs_local_pools(
        control_plane: ControlPlane, tokens: Tokens, tmp_path: Path) -> None:
    cp, t = control_plane, tokens
    ctl = _client(t.controller)
    # The controller reads the agents' Leases where it is installed, and no other namespace's.
    list(ctl.list(Lease, namespace=SYSTEM_NAMESPACE))  # allowed
    _refused_by_rbac(lambda: list(ctl.list(Lease, namespace="kube-node-lease")))
    if not _served(cp):
        # v1.35: DeviceTaintRule is not served; AgentGoneTaints finds so and writes nothing.
        async def found() -> str | None:
            single = KubeConfig.from_file(str(t.controller.kubeconfig)).get()
            assert single is not None
            http = Rest(single, connections=1)
            try:
                async with AsyncClient(KubeConfig.from_file(str(t.controller.kubeconfig))) as c:
                    taints = AgentGoneTaints(c, http)
                    await taints.run()  # ends at once: nothing to keep
                    return taints.version
            finally:
                await http.close()
        assert asyncio.run(found()) is None
        return
    s = uuid.uuid4().hex[:6]
    local = dra_slices.local_pool("default", "cams", t.node_a)
    shared = dra_slices.shared_pool("default", "cams", "cams-0a0b0c")
    key = agent_liveness.TAINT_AGENT_GONE
    # Another driver's pool, a shared pool (one slice for every node), NoExecute (evicts).
    for body in (_rule(f"x1-{s}", "gpu.example.com", local, key, "NoSchedule"),
                 _rule(f"x2-{s}", "edgeplug.io", shared, key, "NoSchedule"),
                 _rule(f"x3-{s}", "edgeplug.io", local, key, "NoExecute")):
        _refused_by_policy(functools.partial(ctl.create, body), LOCAL_ONLY)
    _refused_by_policy(lambda: ctl.create(_rule(f"x4-{s}", "edgeplug.io", local,
                                                "example.com/other", "NoSchedule")), RULES_ONLY)
    # Another's rule (an admin's NoExecute on a GPU) is neither changed nor deleted.
    theirs = f"gpu-{s}"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(_rule(
        theirs, "gpu.example.com", "node-a", "example.com/broken", "NoExecute").to_dict()))
    try:
        _refused_by_policy(lambda: ctl.patch(RuleV1, theirs, {"spec": {"taint": {
            "key": key, "effect": "NoSchedule"}}}, patch_type=PatchType.MERGE), RULES_ONLY)
        _refused_by_policy(lambda: ctl.delete(RuleV1, theirs), RULES_ONLY)
    finally:
        cp.kubectl("delete", "devicetaintrule", theirs, check=False)
    # The control: the rule controller/dra/agent_gone_taints.py writes, applied and deleted.
    body = rule_body("v1", t.node_a, local)
    ctl.patch(RuleV1, body["metadata"]["name"], body, patch_type=PatchType.APPLY,
              field_manager="edgeplug-controller/agent-gone", force=True)
    ctl.delete(RuleV1, body["metadata"]["name"])


async def test_a_controller_refused_the_leases_says_so_and_judges_nobody(
        tokens: Tokens, caplog: pytest.LogCaptureFixture) -> None:
    """A controller whose deploy/dra predates the Lease read (here: a token without it) says
    once what it lacks, starts no watch to retry in the log, and takes no node for gone."""
    single = KubeConfig.from_file(str(tokens.unbound.kubeconfig)).get()
    assert single is not None
    http = Rest(single, connections=1)
    seen: list[frozenset[str]] = []
    liveness = AgentLiveness(http, namespace=SYSTEM_NAMESPACE, grace_s=1.0,
                             listeners=(seen.append,))
    task = asyncio.create_task(liveness.run())
    try:
        deadline = time.monotonic() + POLICY_ACTIVE_S
        while "may not list Leases" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(POLL_S)
        assert "agent leases:" not in caplog.text  # the watch never ran
        assert seen == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await http.close()
