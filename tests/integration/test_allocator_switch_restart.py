"""An agent restarted after its Configuration moved from ``devicePlugin`` to ``dra`` keeps the
slot a running pod holds through the Configuration's resource.

Real parts: the kubelet's own device manager, admission and pod-resources (``DeviceNode``), the
agent as its own process (``DRA=on``, its device plugins on), the real scheduler. The
Configuration pins its allocator (no controller). Once it says ``dra`` the restarted agent
serves no plugin for the device, so nothing it serves names the Configuration's resource; its
orphan freer must still read the pod's pod-resources entry of that resource as the slot's
holder (docs/slots.md, DRA mode, open item 1), through more sweeps than the orphan grace lasts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.settings import SlotSettings
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.agent_nodes import read_instance
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import wait_allocatable
from tests.harness.metrics_scrape import scrape
from tests.harness.stand_ins import node_dirs, running_node

pytestmark = [pytest.mark.timeout(180)]

RESOURCE = "edgeplug.io/sw"
LISTS = 'edgeplug_pod_resources_lists_total{outcome="ok"}'
#: The freer sweeps every second while it holds a slot: this many answered Lists outlast the
#: grace (the slot would be freed by then if the freer read it as nobody's).
SWEEPS = int(SlotSettings().orphan_grace_s) + 4
WITHIN_S = 60.0


async def _held(kube: AsyncClient, ns: str, name: str, node: str) -> dict[str, str] | None:
    usage = (await read_instance(kube, ns, name)).spec.device_usage
    held = {slot: value for slot, value in usage.items() if value.endswith(f":{node}")}
    return held or None


async def _running(kube: AsyncClient, ns: str, pod: str) -> bool:
    found = await kube.get(Pod, pod, namespace=ns)
    return found.status is not None and found.status.phase == "Running"


async def _lists(port: int) -> bool | None:
    try:
        return scrape(port).get(LISTS, 0) >= SWEEPS or None
    except OSError:  # the agent's metrics server not up yet
        return None


async def test_a_restarted_agent_keeps_a_virtual_id_slot_after_the_switch_to_dra(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    cp, ns = control_plane, pod_namespace
    with node_dirs() as dirs:
        async with running_node(DeviceNode, cp.kubeconfig, dirs) as node:
            cfg = harness.debug_echo_configuration("sw", descriptions=["sw0"], capacity=2)
            cfg["spec"]["sharedDeviceAllocation"] = "devicePlugin"
            harness.apply(cp, ns, cfg)
            name = instance_name("sw", "sw0", shared=True, node=node.node_name)
            port = free_port()

            def agent(run: str) -> harness.AgentSubprocess:
                return harness.AgentSubprocess(
                    cp, node_name=node.node_name, namespace=ns, serve_device_plugins=True,
                    plugin_dir=dirs.plugin_dir, log_path=tmp_path / f"agent-{run}.log",
                    extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",
                               "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket),
                               "METRICS_PORT": str(port)})

            first = agent("devicePlugin")
            first.start()
            try:
                await wait_allocatable(kube, node.node_name, RESOURCE, "2")
                h.apply(cp, ns, h.extended_resource_pod("holder", RESOURCE))
                await harness.eventually(lambda: _running(kube, ns, "holder"),
                                         what="holder Running", deadline=WITHIN_S)
                held = await harness.eventually(lambda: _held(kube, ns, name, node.node_name),
                                                what="holder's slot recorded")
            finally:
                first.stop()
            (usage,) = held.values()
            assert usage.startswith("C:sw-v"), held  # through the Configuration's resource

            cp.kubectl("patch", "configuration", "sw", "-n", ns, "--type=merge", "-p",
                       '{"spec": {"sharedDeviceAllocation": "dra"}}')
            second = agent("dra")
            second.start()
            try:
                async def swept_or_freed() -> bool | None:
                    if await _held(kube, ns, name, node.node_name) != held:
                        return True  # freed: the assertion below says so
                    return await _lists(port)

                await harness.eventually(swept_or_freed,
                                         what=f"{SWEEPS} pod-resources Lists answered",
                                         deadline=WITHIN_S)
                assert await _held(kube, ns, name, node.node_name) == held, "the slot was freed"
                assert node.pod_admitted(ns, "holder")
            finally:
                second.stop()
                print((tmp_path / "agent-dra.log").read_text()[-3000:])
