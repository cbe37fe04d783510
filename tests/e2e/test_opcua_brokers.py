"""End to end: OPC-UA servers registered to a discovery server → Instances → a broker pod whose
Allocate carries ``OPCUA_DISCOVERY_URL`` → a test broker reads a value with it; a server set to a
state other than Running → its slot Unhealthy on the node, the reason on the Instance; a server
stopped → Instance and broker gone after the grace; restarted → back under the same name.

The servers and discovery server are real, on loopback, of two implementations: asyncua (in this
process) and open62541 (the ``o6`` build, each its own process, stopped by SIGKILL; its
``ServerStatus.State`` cannot be set, so the Unhealthy step is asyncua's only). The agent and
controller are the product; the kubelet is the node emulator, which runs no containers: the
"broker" is tests/harness/opcua_broker.py run as a process with the environment the emulator
recorded from the agent's Allocate (what a container would get), reading
``ns=<index>;s=Thermometer_Temperature`` the way Akri's OPC-UA monitoring broker does.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua

from crds.naming import instance_name
from tests.harness.broker_stack import agent_in_process, broker_stack, new_node_name
from tests.harness.controller_process import (
    apply,
    broker_pod_spec,
    broker_pods,
    items,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.node_emulator import NodeEmulator
from tests.harness.opcua_open62541 import VALUE_NAMESPACE, Open62541Server
from tests.harness.opcua_servers import VALUE, VALUE_IDENTIFIER, TestServer

POLL_S = 0.1
BROKER_DEADLINE_S = 30.0




#: Where each implementation's test server keeps the value the broker reads.
NAMESPACE_INDEX = {TestServer: 2, Open62541Server: VALUE_NAMESPACE}


def opcua_configuration(namespace: str, lds_url: str, *, index: int = 2) -> dict[str, Any]:
    details = (f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{lds_url}]\n"
               "applicationNames:\n  action: Include\n  items: [line-1]\n"
               "discoveryIntervalSeconds: 0.5\ntimeoutSeconds: 2\n")
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": "plcs", "namespace": namespace},
        "spec": {
            "discoveryHandler": {"name": "opcua", "discoveryDetails": details},
            "capacity": 1,
            "offlineGracePeriodSeconds": 2,
            "brokerProperties": {"IDENTIFIER": VALUE_IDENTIFIER, "NAMESPACE_INDEX": str(index)},
            "brokerSpec": {"brokerPodSpec": broker_pod_spec()},
        },
    }


async def run_broker(envs: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.harness.opcua_broker",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **envs})
    out, err = await asyncio.wait_for(process.communicate(), BROKER_DEADLINE_S)
    assert process.returncode == 0, err.decode()
    return out.decode().strip()


async def health_follows_state(control_plane: ControlPlane, instances: str, line1: TestServer,
                               node: str, emulator: NodeEmulator, resource: str) -> None:
    await line1.set_state(ua.ServerState.Suspended)

    def unhealthy_reason() -> str | None:
        found = items(control_plane, instances)
        status = (found[0].get("status") or {}) if found else {}
        reason: str | None = (status.get("unhealthy") or {}).get(node)
        return reason if reason and not emulator.healthy_device_ids(resource) else None

    assert await until(unhealthy_reason, what="the slot Unhealthy") == "server state is Suspended"
    await line1.set_state(ua.ServerState.Running)
    await until(lambda: emulator.healthy_device_ids(resource), what="the slot healthy again")


@pytest.mark.slow  # ~30 s: a grace period, a server restart, a broker process
@pytest.mark.parametrize("implementation", [TestServer, Open62541Server],
                         ids=["asyncua", "open62541"])
async def test_broker_reads_the_server_health_follows_state_and_presence(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    implementation: type[TestServer | Open62541Server],
) -> None:
    node = new_node_name()
    lds = await implementation("lds", discovery=True).start()
    line1 = await implementation("line-1", register_to=lds.url).start()
    line2 = await implementation("line-2", register_to=lds.url).start()  # filtered out by name
    inst = instance_name("plcs", line1.url, shared=True, node=node)
    instances = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    resource = f"edgeplug.io/{inst}"
    try:
        async with (
            broker_stack(control_plane, namespace, plugin_dir, tmp_path, node=node) as stack,
            agent_in_process(stack, plugin_dir),
        ):
            apply(control_plane, opcua_configuration(namespace, lds.url,
                                                     index=NAMESPACE_INDEX[implementation]))
            pod_name = f"{inst}-{node}-pod"
            await stack.running_broker(pod_name)
            assert [i["metadata"]["name"] for i in items(control_plane, instances)] == [inst]
            [allocation] = stack.emulator.allocations(namespace, pod_name)
            assert allocation.envs["OPCUA_DISCOVERY_URL"] == line1.url
            assert allocation.envs["OPCUA_APPLICATION_NAME"] == "line-1"
            assert await run_broker(dict(allocation.envs)) == str(VALUE)

            # present but not Running: the Instance stays, its slot is Unhealthy, users see why
            # (asyncua's state can be set; open62541 computes its own)
            if isinstance(line1, TestServer):
                await health_follows_state(control_plane, instances, line1, node, stack.emulator,
                                           resource)

            await line1.stop()
            await until(lambda: not items(control_plane, instances), what="the Instance gone")
            await until(lambda: not broker_pods(control_plane, namespace), what="the broker gone")
            await line1.start()
            [back] = await until(lambda: items(control_plane, instances), what="the Instance back")
            assert back["metadata"]["name"] == inst
    finally:
        for server in (line1, line2, lds):
            await server.stop()
            if isinstance(server, Open62541Server):
                await server.close()
