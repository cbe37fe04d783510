"""What a user of Ascend nodes sees on the API when health is unknown or a chip's link is down.

Against the real control plane (kube-apiserver and etcd), with the agent's discovery side
in-process on an emulated Ascend node (tests/harness/ascend_node.py: the DCMI stand-in built
from C, ``npu-smi``, the device nodes):

- no DCMI and no usable ``npu-smi``: chips are listed from ``/dev/davinci*`` with their health
  unknown, and the Configuration's ``DiscoveryHealthy.<node>`` condition says so (False, naming
  the node and the cause) until ``npu-smi`` answers again or the node stops running the
  Configuration, when it is withdrawn;
- a 910 chip whose RoCE link check fails (``dcmi_get_device_network_health``): its Instance's
  ``ASCEND_NETWORK_HEALTH`` property says Unhealthy with DCMI's result and a Warning Event says
  why, but the chip stays allocatable (no ``status.unhealthy`` entry, advertised Healthy), as
  with Huawei's plugin; when the link is back the property says Healthy.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.discovery.device_health import REASON_WARNING
from agent.discovery.events import health_condition_type
from crds.naming import instance_name
from discovery_handlers.ascend.devices import PROP_NETWORK
from discovery_handlers.ascend.handler import NO_DRIVER_WARNING
from tests.harness import agent_process as harness
from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library
from tests.harness.controlplane import ControlPlane

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
NAME = "npus"
LINK_DOWN = 3  # DCMI_RDFX_DETECT_UNREACH
LINK_UP = 0  # DCMI_RDFX_DETECT_OK


def configuration(details: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": NAME},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": details},
                 "capacity": 1},
    }


def conditions(cp: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    """The Configuration's conditions by type, as ``kubectl get configuration`` shows them."""
    found = json.loads(cp.kubectl("get", "configurations.edgeplug.io", NAME, "-n", namespace,
                                  "-o", "json").stdout)
    return {c["type"]: c for c in (found.get("status") or {}).get("conditions") or []}


def emulated(tmp_path: Path, library: Path | None, monkeypatch: pytest.MonkeyPatch,
             *, network: int | None) -> AscendNode:
    chips = [replace(c, network=network) for c in chips_910b(2)]
    host = AscendNode(tmp_path / "host", chips, library=library)
    for name, value in host.env.items():
        monkeypatch.setenv(name, value)
    return host


async def test_health_unknown_is_a_condition_on_the_configuration_until_npu_smi_answers(
    control_plane: ControlPlane, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = emulated(tmp_path, None, monkeypatch, network=None)
    host.npu_smi_override = "dcmi module initialize failed. ret is -8005\n"
    host.write()
    node = harness.new_node(control_plane)
    kind = health_condition_type(node)
    async with harness.agent_in_process(control_plane, node_name=node, namespace=namespace):
        harness.apply(control_plane, namespace, configuration(host.details()))

        async def unknown() -> dict[str, Any] | None:
            return conditions(control_plane, namespace).get(kind)

        condition = await harness.eventually(unknown, what=f"{kind} False")
        assert (condition["status"], condition["reason"]) == ("False", "DiscoveryWarning")
        assert condition["message"] == f"node {node}: {NO_DRIVER_WARNING}"
        assert "no DCMI or npu-smi: health unknown" in condition["message"]

        host.npu_smi_override = None  # npu-smi answers: health is known again
        host.write()

        async def withdrawn() -> bool:
            return kind not in conditions(control_plane, namespace)

        await harness.eventually(withdrawn, what=f"{kind} withdrawn")
        assert conditions(control_plane, namespace)["DiscoveryDetailsValid"]["status"] == "True"

        host.npu_smi_override = "garbage\n"  # degraded again, then the node is deselected:
        host.write()  # its warnings are over with its run
        await harness.eventually(unknown, what=f"{kind} False again")
        deselected = configuration(host.details())
        deselected["spec"]["nodeSelector"] = {"matchLabels": {"npu": "none"}}
        harness.apply(control_plane, namespace, deselected)
        await harness.eventually(withdrawn, what=f"{kind} withdrawn with the run")


async def test_a_chip_whose_roce_link_is_down_says_so_and_stays_allocatable(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, dcmi_library: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = emulated(tmp_path, dcmi_library, monkeypatch, network=LINK_UP)
    node = harness.new_node(control_plane)
    names = [instance_name(NAME, f"davinci{i}", shared=False, node=node) for i in range(2)]
    async with harness.agent_in_process(control_plane, node_name=node,
                                        namespace=namespace) as agent:
        harness.apply(control_plane, namespace, configuration(host.details()))

        def network(found: dict[str, dict[str, Any]], name: str) -> str | None:
            value = (found.get(name) or {}).get("spec", {}).get("brokerProperties", {}).get(
                PROP_NETWORK)
            return None if value is None else str(value)

        async def both(value: str) -> dict[str, dict[str, Any]] | None:
            found = await harness.instances(agent.client, namespace)
            return found if [network(found, n) for n in names] == [value, value] else None

        async def healthy() -> dict[str, dict[str, Any]] | None:
            return await both("Healthy")

        await harness.eventually(healthy, what="both chips' network Healthy")

        host.link(1, LINK_DOWN)

        async def one_down() -> dict[str, dict[str, Any]] | None:
            found = await harness.instances(agent.client, namespace)
            return found if network(found, names[1]) != "Healthy" else None

        found = await harness.eventually(one_down, what="chip 1's network Unhealthy")
        assert network(found, names[1]) == "Unhealthy (DCMI_RDFX_DETECT_UNREACH)"
        assert network(found, names[0]) == "Healthy"
        # Still allocatable: no unhealthy entry on the Instance, advertised Healthy.
        assert not (found[names[1]].get("status") or {}).get("unhealthy")
        served = agent.devices.snapshot()[(namespace, names[1])]
        assert served.device.health.healthy

        def events() -> list[dict[str, Any]]:
            listed = json.loads(control_plane.kubectl(
                "get", "events", "-n", namespace, "-o", "json",
                "--field-selector", f"involvedObject.name={names[1]},reason={REASON_WARNING}",
            ).stdout)
            return list(listed["items"])

        async def warned() -> list[dict[str, Any]] | None:
            return events() or None  # an empty list would end the wait before the Event

        [event] = await harness.eventually(warned, what="a DeviceWarning Event")
        assert event["message"].startswith(
            f"node {node}: RoCE network unhealthy: dcmi_get_device_network_health gave 3 "
            "(DCMI_RDFX_DETECT_UNREACH)"), event["message"]

        host.link(1, LINK_UP)
        await harness.eventually(healthy, what="chip 1's network Healthy again")
        assert len(events()) == 1
