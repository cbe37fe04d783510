"""A withdrawn Configuration's CDI spec is written once, not once per device.

Real parts: the API server (Configuration, Instances) and the agent's ``InstancePublisher``
with its CDI specs in a temporary directory. Before, every device leaving the node rewrote the
spec of the devices still left: a Configuration of 200 devices rendered 20,000 device entries
and wrote 200 files on its way out (2.3 s of the agent's CPU under py-spy in
``bench_agent_changes --mode dra``). The spec must still be gone, and the table empty, before
any Instance is left (the devices stop being served first).
"""

from __future__ import annotations

from pathlib import Path

from agent.discovery.cdi_specs import CdiSpecs, spec_path
from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.kube.client import ConfigurationResource, as_dict
from agent.metrics import AgentMetrics
from crds.configuration import Configuration
from discovery_handlers.contract import Device
from discovery_handlers.registry import load_handler
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane

DEVICES = 20


class CountingSpecs(CdiSpecs):
    """The agent's CDI specs, counting the writes that render a spec."""

    writes = 0

    def write(self, namespace: str, configuration: str, devices: list[NodeDevice]) -> bool:
        if devices:
            self.writes += 1
        return super().write(namespace, configuration, devices)


async def test_a_withdrawal_writes_the_cdi_spec_once(
    control_plane: ControlPlane, namespace: str, tmp_path: Path,
) -> None:
    node = harness.new_node(control_plane)
    names = [f"w{i}" for i in range(DEVICES)]
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "cdiwd", descriptions=names, shared=True))
    client = harness.api_client(control_plane)
    try:
        cfg = Configuration.from_object(as_dict(
            await client.get(ConfigurationResource, "cdiwd", namespace=namespace)))
        table = NodeDeviceTable()
        specs = CountingSpecs(tmp_path / "cdi")
        publisher = InstancePublisher(
            client=client, node_name=node, configuration=cfg, devices=table,
            labels=NodeLabels(client=client, node_name=node), metrics=AgentMetrics(), cdi=specs,
        )
        devices = [Device(id=n, properties={"DEBUG_ECHO_DESCRIPTION": n}) for n in names]
        await publisher.publish(load_handler("debugEcho"), None, devices, shared=True)
        assert len(table.snapshot()) == DEVICES
        path = spec_path(tmp_path / "cdi", namespace, "cdiwd")
        assert path.exists()

        specs.writes = 0
        await publisher.withdraw()
        assert specs.writes == 0, f"{specs.writes} spec writes rendering devices on the way out"
        assert not path.exists()
        assert table.snapshot() == {}
        assert await harness.instances(client, namespace) == {}
    finally:
        await client.close()
