"""The agent's rights in each allocation mode, on the real API server with the real manifests
and node A's pod-bound agent token.

The default install (``deploy/manifests`` and ``deploy/dra``) grants neither of the
compatibility mode's rights: RBAC refuses the agent a ``nodes/status`` patch and a pods
``watch``; the one pod read both modes need (a ``list`` of the pods bound to its node, for the
orphan freer, docs/slots.md C10) is refused to the token too, since the agent makes it with the
kubelet's certificate (tests/integration/test_kubelet_reads.py). ``deploy/compat`` grants both,
and ``deploy/token-reads`` the list. And an agent of
the default install that serves a shared device pinned to ``devicePlugin`` says once what it
lacks (its log and a Warning Event on the Configuration), retries nothing refused, and still
hands its slot out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from agent.deviceplugins.crossnode.coordinator import MISSING_RIGHTS_REASON
from tests.harness.agent_process import api_client, apply, debug_echo_configuration, eventually
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.offer_grants import wait_offer
from tests.harness.service_accounts import (
    COMPAT,
    Identity,
    agent_on,
    apply_compat,
    apply_manifests,
    release_agent_pod,
)
from tests.integration import test_rbac as rbac

# The agents write with their own token: the offer grants name their Configurations.
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("offers")]

DEFAULT_FILES = ("namespace.yaml", "agent-rbac.yaml", "agent-node-policy.yaml",
                 "agent-instance-policy.yaml", "agent-pod-policy.yaml",
                 "agent-report-policy.yaml")
DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
#: RBAC changes reach the authorizer through its informers: a short while, on a shared machine.
RBAC_ACTIVE_S = 30.0
POLL_S = 0.2
CAM = "edgeplug.io/cam-1a2b3c"


@dataclass(frozen=True)
class World:
    node: str
    agent: Identity


def _without_compat(cp: ControlPlane) -> None:
    """The default install: deploy/compat's grant gone (another module may have applied it)."""
    cp.kubectl("delete", "-k", str(COMPAT), "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    cp = control_plane
    apply_manifests(cp, DEFAULT_FILES)
    cp.kubectl("apply", "-k", str(DRA_MANIFESTS))
    _without_compat(cp)
    node = f"modes-{uuid.uuid4().hex[:6]}"
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    # What a kubelet reports: a device resource in capacity and allocatable.
    cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"capacity": {CAM: "2"}, "allocatable": {CAM: "2"}}}))
    try:
        yield World(node, agent_on(cp, node, tmp_path_factory.mktemp("modes")))
    finally:
        release_agent_pod(cp, node)
        cp.kubectl("delete", "node", node, "--wait=false", check=False)
        apply_compat(cp)  # as the modules that need it found it


def _client(who: Identity) -> Client:
    return Client(KubeConfig.from_file(str(who.kubeconfig)))


def _outcome(call: Callable[[], object]) -> tuple[int, str]:
    """The HTTP status of one call (200 when it succeeded) and the API server's message."""
    try:
        call()
    except ApiError as error:
        return error.status.code or 0, error.status.message or ""
    except httpx.HTTPStatusError as error:  # a refused watch: lightkube hands on httpx's
        return error.response.status_code, ""  # error, its streamed body unread
    return 200, ""


def _lower(who: Identity, node: str) -> tuple[int, str]:
    """What the hand-off gate writes: its Node's allocatable of a device resource."""
    return _outcome(lambda: _client(who).patch(
        Node.Status, node, {"status": {"allocatable": {CAM: "1"}}}, patch_type=PatchType.MERGE))


def _watch_pods(who: Identity, node: str) -> tuple[int, str]:
    """What the demand watch opens: pods bound to its node (the first event, or a refusal)."""
    def call() -> None:
        for _ in _client(who).watch(Pod, namespace="*", fields={"spec.nodeName": node},
                                    on_error=lambda error, count: _raise(error)):
            break

    return _outcome(call)


def _raise(error: Exception) -> Any:
    raise error


def _list_pods(who: Identity, node: str) -> tuple[int, str]:
    return _outcome(lambda: list(_client(who).list(Pod, namespace="*",
                                                   fields={"spec.nodeName": node})))


def _eventually(check: Callable[[], tuple[int, str]], code: int, what: str) -> tuple[int, str]:
    deadline = time.monotonic() + RBAC_ACTIVE_S
    while (outcome := check())[0] != code:
        assert time.monotonic() < deadline, f"{what}: {outcome}"
        time.sleep(POLL_S)  # polling the authorizer's state, with a deadline
    return outcome


def test_the_default_install_refuses_the_compatibility_modes_rights(
        control_plane: ControlPlane, world: World) -> None:
    cp, w = control_plane, world
    code, message = _eventually(lambda: _lower(w.agent, w.node), 403,
                                "nodes/status refused without deploy/compat")
    assert 'cannot patch resource "nodes/status"' in message, message
    code, message = _watch_pods(w.agent, w.node)
    assert code == 403, (code, message)
    # The one pod read both modes make goes as the kubelet, not with the token.
    code, message = _list_pods(w.agent, w.node)
    assert code == 403, (code, message)
    assert 'cannot list resource "pods"' in message, message
    # Control: deploy/compat grants both; the node policy still judges the write.
    apply_compat(cp)
    try:
        _eventually(lambda: _lower(w.agent, w.node), 200, "nodes/status with deploy/compat")
        assert _watch_pods(w.agent, w.node)[0] != 403
    finally:
        _without_compat(cp)
    _eventually(lambda: _lower(w.agent, w.node), 403, "nodes/status refused again")


async def test_an_agent_without_the_rights_says_so_once_and_still_serves(
    control_plane: ControlPlane, world: World, namespace: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Configuration pinned to devicePlugin on the default install: one error naming both
    rights, one Warning Event on the Configuration, no refused call retried, the slot served."""
    caplog.set_level(logging.INFO)
    cp, admin = control_plane, api_client(control_plane)
    _eventually(lambda: _lower(world.agent, world.node), 403, "the default install")
    pinned = debug_echo_configuration("rbac-cam", descriptions=["cam0"])
    pinned["spec"]["sharedDeviceAllocation"] = "devicePlugin"
    try:
        apply(cp, namespace, pinned)
        await asyncio.to_thread(wait_offer, cp, namespace, "rbac-cam", world.node)
        async with rbac.agent_on_its_token(cp, tmp_path, "agent-without-compat-rights") as (
                node, agent, _):
            event = await eventually(lambda: _missing_rights_event(admin, namespace),
                                     what="the Warning Event naming the missing rights",
                                     deadline=rbac.WAIT_S)
            for named in ("watch pods", "patch nodes/status", "deploy/compat"):
                assert named in event, event
            await rbac.assert_pod_got_a_slot(admin, namespace, node.node_name, agent)
            # Many reconcile passes later (the pod's claim, its start): still one Event.
            assert len(await _events(admin, namespace)) == 1
    finally:
        await admin.close()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("agent")]
    said = [line for line in lines if "without rights that mode needs" in line]
    assert len(said) == 1, said
    for named in ("watch pods", "patch nodes/status"):
        assert named in said[0], said[0]
    # Nothing refused was tried, so nothing was retried: no 403 anywhere in the agent's log.
    assert not rbac.refusals(lines), rbac.refusals(lines)


async def _events(admin: AsyncClient, namespace: str) -> list[str]:
    return [e.message or "" async for e in admin.list(Event, namespace=namespace)
            if e.reason == MISSING_RIGHTS_REASON and e.involvedObject.name == "rbac-cam"]


async def _missing_rights_event(admin: AsyncClient, namespace: str) -> str | None:
    found = await _events(admin, namespace)
    return found[0] if found else None

