"""A prepared claim says what it got: after the agent's kubelet plugin prepares a
real, scheduler-allocated claim, the claim's ``status.devices`` holds, for its device, a
``Ready`` condition following the device's health, its properties as ``data`` (never a
Secret's value) and, for a device with an address, ``networkData``, written with the agent's
own token, bound to its node, holding the rights ``CLAIM_STATUS_RIGHTS`` (which deploy/dra
does not grant yet); the kubelet's identity may not write it.

The gRPC client stands for the kubelet's DRA manager, as in test_dra_kubelet_plugin.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.types import PatchType

from agent.dra import slices
from agent.dra.plugin import ClaimPreparer, DraKubeletPlugin
from agent.kube.client import as_dict
from agent.kube.node_reads import NodeReads
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from crds import dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness import echo_handlers
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import (
    Identity,
    kubelet_kubeconfig,
    pod_bound,
    release_agent_pod,
)

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT = "edgeplug-agent"
SECRET_VALUE = "planted-secret-9f3e1d"
HTTP_FORBIDDEN = 403
@pytest.fixture
def node_with_agent_token(control_plane: ControlPlane, tmp_path: Path
                          ) -> Iterator[tuple[str, Identity]]:
    cp = control_plane
    # The agent's rights as installed: deploy/dra's patch of claims' status, confined by its
    # claim status policy.
    for name in ("namespace.yaml", "agent-rbac.yaml"):
        cp.kubectl("apply", "-f", str(MANIFESTS / name))
    cp.kubectl("apply", "-k", str(REPO_ROOT / "deploy" / "dra"))
    node = harness.new_node(control_plane)
    identity = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT, node=node,
                         folder=tmp_path)
    try:
        yield node, identity
    finally:
        release_agent_pod(cp, node)


@contextlib.asynccontextmanager
async def serving(preparer: ClaimPreparer, tmp: Path) -> AsyncIterator[Any]:
    """The plugin's sockets served; yields a DRAPlugin stub on its service socket."""
    plugin = DraKubeletPlugin(preparer=preparer, plugins_dir=tmp / "plugins",
                              registry_dir=tmp / "plugins_registry")
    task = asyncio.create_task(plugin.run())
    try:
        await harness.eventually(lambda: asyncio.to_thread(plugin.service_socket.exists),
                                 what="the plugin's socket")
        async with grpc.aio.insecure_channel(f"unix:{plugin.service_socket}") as channel:
            yield pb_grpc.DRAPluginStub(channel)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _ours(claim: dict[str, Any]) -> dict[str, Any] | None:
    entries = [e for e in (claim.get("status") or {}).get("devices") or []
               if e.get("driver") == dra.DRIVER]
    return entries[0] if len(entries) == 1 else None


async def test_a_prepared_claim_shows_its_devices_data_network_and_ready_condition(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path,
    node_with_agent_token: tuple[str, Identity],
) -> None:
    ns = pod_namespace
    node, identity = node_with_agent_token
    state = tmp_path / "state.json"
    echo_handlers.write_state(state, {"cam": {"properties": {
        "ONVIF_DEVICE_IP_ADDRESS": "10.0.0.7", "ONVIF_DEVICE_MAC_ADDRESS": "00:11:22:33:44:55",
        "ONVIF_DEVICE_SERVICE_URL": "http://10.0.0.7:80/onvif/device_service"}}})
    handler = echo_handlers.install()
    cfg = h.extended_echo_configuration("cams", ["cam"], state)
    # A discovery property from a Secret that the handler (wrongly) copies into a property.
    details = json.loads(cfg["spec"]["discoveryHandler"]["discoveryDetails"])
    details["leakProperty"] = "token"
    cfg["spec"]["discoveryHandler"]["discoveryDetails"] = json.dumps(details)
    cfg["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {"name": "token", "valueFrom": {"secretKeyRef": {"name": "cam-token", "key": "t"}}}]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cam-token"},
              "data": {"t": base64.b64encode(SECRET_VALUE.encode()).decode()}}
    cam = instance_name("cams", "cam", shared=False, node=node)
    agent_client = AsyncClient(KubeConfig.from_file(str(identity.kubeconfig)))
    try:
        async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                    h.dra_agents(control_plane, [node], ns) as agents):
            harness.apply(control_plane, ns, secret, cfg)
            h.apply(control_plane, ns, h.claim_template("cam", dra.device_class_name(ns, "cams")),
                    h.claim_pod("viewer", "cam"))
            claim = await h.allocated_claim(kube, ns, "viewer")
            preparer = ClaimPreparer(reads=NodeReads(kube), node_name=node,
                                     devices=agents[node].agent.devices,
                                     cdi_dir=tmp_path / "cdi",
                                     state_dir=tmp_path / "plugins" / dra.DRIVER,
                                     status_client=agent_client)
            async with serving(preparer, tmp_path) as stub:
                answer = await stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=[claim]))
                assert answer.claims[claim.uid].error == ""

                async def entry(ready: str) -> dict[str, Any] | None:
                    body = as_dict(await kube.get(h.ResourceClaimResource, claim.name,
                                                  namespace=ns))
                    found = _ours(body)
                    if found is None or found["conditions"][0]["status"] != ready:
                        return None
                    return found

                got = await harness.eventually(lambda: entry("True"),
                                               what="the claim's status.devices, Ready")
                assert (got["pool"], got["device"]) == (slices.local_pool(ns, "cams", node),
                                                        slices.device_name(cam))
                (ready,) = got["conditions"]
                assert (ready["type"], ready["reason"]) == ("Ready", "DeviceHealthy")
                assert got["data"]["instance"] == cam
                properties = got["data"]["properties"]
                assert properties["DEBUG_ECHO_DESCRIPTION"] == "cam"
                assert properties["ONVIF_DEVICE_IP_ADDRESS"] == "10.0.0.7"
                assert "LEAKED" not in properties
                assert SECRET_VALUE not in json.dumps(got), "a Secret's value in the claim"
                assert got["networkData"] == {"ips": ["10.0.0.7/32"],
                                              "hardwareAddress": "00:11:22:33:44:55"}

                # The device fails: Ready False, with the handler's reason.
                echo_handlers.write_state(state, {"cam": {"healthy": False,
                                                          "reason": "lens covered"}})
                sick = await harness.eventually(lambda: entry("False"),
                                                what="Ready False once the device fails")
                assert (sick["conditions"][0]["reason"], sick["conditions"][0]["message"]) == (
                    "DeviceUnhealthy", "lens covered")

            # The kubelet's own identity may not write it (the Node authorizer): hence the
            # agent's token and its rights.
            kubelet = AsyncClient(KubeConfig.from_file(
                str(kubelet_kubeconfig(control_plane, node, tmp_path))))
            try:
                with pytest.raises(ApiError) as refused:
                    await kubelet.patch(h.ResourceClaimResource.Status, claim.name,
                                        {"status": {"devices": []}}, namespace=ns,
                                        patch_type=PatchType.MERGE)
                assert refused.value.status.code == HTTP_FORBIDDEN
            finally:
                await kubelet.close()
    finally:
        handler.release()
        await agent_client.close()
