"""A discovery server that stops answering is a Warning Event and a condition on the
Configuration, not silence.

Against the real control plane (kube-apiserver and etcd), with the agent's discovery side
in-process and a real asyncua discovery server and server on loopback: the Event names the
discovery URL and why, is posted once however many intervals the silence lasts; the
Configuration's ``DiscoveryHealthy.<node>`` condition is False, naming the node and the cause,
while the silence lasts (``kubectl get configuration -o yaml``), and is gone, with the agent
logging the end, when the discovery server answers again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from agent.discovery.events import REASON_DISCOVERY_WARNING, health_condition_type
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane
from tests.harness.opcua_servers import TestServer, description, register

NAME = "presses"


def configuration(lds_url: str) -> dict[str, Any]:
    details = (f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{lds_url}]\n"
               "discoveryIntervalSeconds: 0.3\ntimeoutSeconds: 2\n")
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": NAME},
        "spec": {"discoveryHandler": {"name": "opcua", "discoveryDetails": details},
                 "capacity": 1, "offlineGracePeriodSeconds": 300},
    }


def conditions(cp: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    """The Configuration's conditions by type, as ``kubectl get configuration`` shows them."""
    found = json.loads(cp.kubectl("get", "configurations.edgeplug.io", NAME, "-n", namespace,
                                  "-o", "json").stdout)
    return {c["type"]: c for c in (found.get("status") or {}).get("conditions") or []}


def warning_events(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    found = json.loads(cp.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.name={NAME},involvedObject.kind=Configuration",
    ).stdout)
    return [e for e in found["items"] if e["reason"] == REASON_DISCOVERY_WARNING]


async def test_silent_discovery_server_is_a_warning_event_on_the_configuration(
    control_plane: ControlPlane, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.discovery.runs")
    lds = await TestServer("lds", discovery=True).start()
    alpha = await TestServer("alpha", register_to=lds.url).start()
    node = harness.new_node(control_plane)
    instance = instance_name(NAME, alpha.url, shared=True, node=node)
    try:
        async with harness.agent_in_process(control_plane, node_name=node,
                                            namespace=namespace) as agent:
            harness.apply(control_plane, namespace, configuration(lds.url))

            async def alpha_published() -> bool:
                return instance in await harness.instances(agent.client, namespace)

            await harness.eventually(alpha_published, what=f"Instance {instance}")
            assert warning_events(control_plane, namespace) == []

            await lds.stop()

            async def warned() -> list[dict[str, Any]] | None:
                return warning_events(control_plane, namespace) or None

            [event] = await harness.eventually(warned, what="a DiscoveryWarning Event")
            assert event["type"] == "Warning"
            assert event["involvedObject"]["kind"] == "Configuration"
            assert event["message"].startswith(f"discovery URL {lds.url}: FindServers failed ("), \
                event["message"]
            assert event["source"]["host"] == node

            async def unhealthy() -> dict[str, Any] | None:
                return conditions(control_plane, namespace).get(health_condition_type(node))

            condition = await harness.eventually(unhealthy, what="DiscoveryHealthy.<node> False")
            assert (condition["status"], condition["reason"]) == ("False", "DiscoveryWarning")
            assert condition["message"] == f"node {node}: {event['message']}"

            await lds.start()  # a restarted asyncua discovery server forgot alpha: register
            again = description(0, url=alpha.url, name="alpha")
            again.ServerUri = alpha.application_uri
            await register(lds.url, [again])

            async def ended() -> bool:
                return any("discovery warning ended" in r.getMessage() and lds.url in
                           r.getMessage() for r in caplog.records)

            await harness.eventually(ended, what="the warning logged as ended")

            async def healthy() -> bool:
                return health_condition_type(node) not in conditions(control_plane, namespace)

            await harness.eventually(healthy, what="DiscoveryHealthy.<node> withdrawn")
            # Withdrawn by its own field manager: this node's other conditions stay.
            assert conditions(control_plane, namespace)["DiscoveryDetailsValid"]["status"] == \
                "True"
            assert len(warning_events(control_plane, namespace)) == 1, \
                "one Event for the whole silence, not one per interval"
    finally:
        await alpha.stop()
        await lds.stop()
