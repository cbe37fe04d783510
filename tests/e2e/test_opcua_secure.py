"""End to end with a secured server: a real server that offers Basic256Sha256 SignAndEncrypt and
trusts one client certificate is checked by the agent with the client certificate and key of a
Kubernetes Secret (binary data: DER certificate, PEM key); its Instance is published healthy,
and the key appears in no Instance, no Event and no log line.

The agent is the product (in this process, so its log lines are captured); the kubelet is the
node emulator; the server is real, on loopback, of two implementations: asyncua (accepting only
the secured endpoint) and open62541 (the ``o6`` build in its own process, offering security
None beside it).
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
from tests.harness.opcua_open62541 import Open62541Server
from tests.harness.opcua_servers import TestServer, make_certificates

POLL_S = 0.1
SECURE_URI = "urn:edgeplug:test:secure-press"




def secure_configuration(namespace: str, url: str) -> dict[str, Any]:
    details = (f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n"
               "discoveryIntervalSeconds: 0.5\n"
               "security:\n  policy: Basic256Sha256\n  mode: SignAndEncrypt\n")
    return configuration(
        namespace, "presses", handler="opcua", details=details,
        properties=[secret_property("clientCertificate", "opcua-client", "certificate"),
                    secret_property("clientPrivateKey", "opcua-client", "privateKey")])


@pytest.mark.parametrize("implementation", [TestServer, Open62541Server],
                         ids=["asyncua", "open62541"])
async def test_secure_server_checked_with_a_secrets_certificate_and_nothing_leaks(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture, implementation: type[TestServer | Open62541Server],
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
            apply(control_plane, {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "opcua-client", "namespace": namespace},
                "data": {"certificate": base64.b64encode(certs.client_cert.read_bytes()).decode(),
                         "privateKey": base64.b64encode(key).decode()},
            })
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
        if isinstance(server, Open62541Server):
            await server.close()
