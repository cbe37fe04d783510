"""End to end with a secured server: a real server that offers Basic256Sha256 SignAndEncrypt and
trusts one client certificate is checked by the agent with the client certificate and key of a
Kubernetes Secret (binary data: DER certificate, PEM key); its Instance is published healthy,
and the key appears in no Instance, no Event and no log line. A server that does not trust the
Secret's certificate still has its Instance, unhealthy, with the reason on its status.

The agent is the product (in this process, so its log lines are captured); the kubelet is the
node emulator; the server is real, on loopback, of three implementations: asyncua (accepting
only the secured endpoint), open62541 (the ``o6`` build in its own process, offering security
None beside it) and node-opcua (a Node.js process; it refuses an untrusted certificate with a
ServiceFault asyncua cannot read).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name
from tests.harness.aio_process import task_running
from tests.harness.controller_process import apply, configuration, items, secret_property
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.node_emulator import NodeEmulator
from tests.harness.opcua_nodeopcua import NodeOpcuaServer
from tests.harness.opcua_open62541 import Open62541Server
from tests.harness.opcua_servers import Certificates, TestServer, make_certificates

POLL_S = 0.1
SECURE_URI = "urn:edgeplug:test:secure-press"
UNTRUSTED = ("secure channel refused: BadSecurityChecksFailed "
             "(the server may not trust the client certificate)")
Implementation = type[TestServer | Open62541Server | NodeOpcuaServer]


def secret(namespace: str, certs: Certificates) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "opcua-client", "namespace": namespace},
        "data": {"certificate": base64.b64encode(certs.client_cert.read_bytes()).decode(),
                 "privateKey": base64.b64encode(certs.client_key.read_bytes()).decode()},
    }


def secure_configuration(namespace: str, url: str) -> dict[str, Any]:
    details = (f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n"
               "discoveryIntervalSeconds: 0.5\n"
               "security:\n  policy: Basic256Sha256\n  mode: SignAndEncrypt\n")
    return configuration(
        namespace, "presses", handler="opcua", details=details,
        properties=[secret_property("clientCertificate", "opcua-client", "certificate"),
                    secret_property("clientPrivateKey", "opcua-client", "privateKey")])


@pytest.mark.parametrize("implementation", [TestServer, Open62541Server, NodeOpcuaServer],
                         ids=["asyncua", "open62541", "node-opcua"])
async def test_secure_server_checked_with_a_secrets_certificate_and_nothing_leaks(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture, implementation: Implementation,
) -> None:
    caplog.set_level(logging.DEBUG)
    certs = await make_certificates(tmp_path, server_uri=SECURE_URI)
    server = await implementation("secure-press", application_uri=SECURE_URI,
                                  secure_with=certs).start()
    key = certs.client_key.read_bytes()
    key_line = key.split(b"\n")[1].decode()  # a line of the key's own material
    node = f"node-{uuid.uuid4().hex[:8]}"
    inst = instance_name("presses", server.url, shared=True, node=node)
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir)
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=namespace)
    await emulator.start()
    instances = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    try:
        async with task_running(run_agent(settings), name=f"agent-{node}"):
            apply(control_plane, secret(namespace, certs))
            apply(control_plane, secure_configuration(namespace, server.url))
            [instance] = await until(lambda: items(control_plane, instances), what="the Instance")
            assert instance["metadata"]["name"] == inst
            resource = f"edgeplug.io/{inst}"
            await until(lambda: emulator.healthy_device_ids(resource),
                        what="the secured server's slot healthy (checked with the Secret's cert)")
            [instance] = items(control_plane, instances)
            assert not (instance.get("status") or {}).get("unhealthy")
            assert instance["spec"]["brokerProperties"]["OPCUA_DISCOVERY_URL"] == server.url
            events = control_plane.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
            for shown, where in ((json.dumps(instance), "the Instance"), (events, "an Event"),
                                 (caplog.text, "a log line")):
                assert key_line not in shown, f"the private key appears in {where}"
    finally:
        await emulator.stop(delete_node=True)
        await server.stop()
        if isinstance(server, Open62541Server | NodeOpcuaServer):
            await server.close()


@pytest.mark.parametrize("implementation", [Open62541Server, NodeOpcuaServer],
                         ids=["open62541", "node-opcua"])
async def test_a_server_that_refuses_the_secrets_certificate_is_listed_unhealthy(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    implementation: type[Open62541Server | NodeOpcuaServer],
) -> None:
    """The server trusts another certificate than the Secret's: it refuses the secure channel
    (node-opcua with a ServiceFault inside the secured reply, open62541 with an error message),
    and its Instance is there all the same, its slot Unhealthy, the reason on its status."""
    trusted = await make_certificates(tmp_path / "trusted", server_uri=SECURE_URI)
    ours = await make_certificates(tmp_path / "ours", server_uri=SECURE_URI)
    server = await implementation("refusing-press", application_uri=SECURE_URI,
                                  secure_with=trusted).start()
    node = f"node-{uuid.uuid4().hex[:8]}"
    inst = instance_name("presses", server.url, shared=True, node=node)
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir)
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=namespace)
    await emulator.start()
    instances = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"

    def unhealthy_reason() -> str | None:
        found = items(control_plane, instances)
        status = (found[0].get("status") or {}) if found else {}
        reason: str | None = (status.get("unhealthy") or {}).get(node)
        return reason if reason and emulator.plugin_connected(f"edgeplug.io/{inst}") else None

    try:
        async with task_running(run_agent(settings), name=f"agent-{node}"):
            apply(control_plane, secret(namespace, ours))
            apply(control_plane, secure_configuration(namespace, server.url))
            assert await until(unhealthy_reason, what="the Instance, unhealthy") == UNTRUSTED
            [instance] = items(control_plane, instances)
            assert instance["metadata"]["name"] == inst
            assert emulator.healthy_device_ids(f"edgeplug.io/{inst}") == []
    finally:
        await emulator.stop(delete_node=True)
        await server.close()
