"""A discovery run stopped while its Instance is being written still withdraws that Instance.

Found by CI: a Node relabelled right after a device's Instance appeared stopped the run while the
agent's apply after the create was still in flight; the Instance was not yet recorded as this
node's, so the withdrawal skipped it and it stayed for good (the Configuration no longer selected
the node). Here the real API server creates the Instance and the agent's next write to it is held
(its ``patch`` awaits an event that never comes, standing in for a slow reply), then the run is
cancelled and withdrawn, as ``ConfigurationWatch`` does on a relabel.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.node_devices import NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.kube.client import ConfigurationResource, as_dict
from agent.metrics import AgentMetrics
from crds.configuration import Configuration
from crds.naming import instance_name
from discovery_handlers.contract import Device
from discovery_handlers.registry import load_handler
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
async def test_a_run_stopped_mid_write_withdraws_the_instance_it_created(
    control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "midwrite", descriptions=["m0"], shared=shared))
    client, observer = harness.api_client(control_plane), harness.api_client(control_plane)
    try:
        cfg = Configuration.from_object(as_dict(
            await client.get(ConfigurationResource, "midwrite", namespace=namespace)))
        publisher = InstancePublisher(
            client=client, node_name=node, configuration=cfg, devices=NodeDeviceTable(),
            labels=NodeLabels(client=client, node_name=node), metrics=AgentMetrics(),
        )
        held = asyncio.Event()

        async def held_patch(*_args: Any, **_kwargs: Any) -> Any:
            held.set()
            await asyncio.Event().wait()  # the reply that never comes

        monkeypatch.setattr(client, "patch", held_patch)
        device = Device(id="m0", properties={"DEBUG_ECHO_DESCRIPTION": "m0"})
        run = asyncio.create_task(publisher.publish(
            load_handler("debugEcho"), None, [device], shared=shared))
        await asyncio.wait_for(held.wait(), harness.DEFAULT_DEADLINE)
        name = instance_name("midwrite", "m0", shared=shared, node=node)
        assert name in await harness.instances(observer, namespace), "the create went through"

        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        monkeypatch.undo()  # the API server answers again
        await publisher.withdraw()

        async def gone() -> bool:
            return name not in await harness.instances(observer, namespace)

        await harness.eventually(gone, what=f"{name} withdrawn after the run stopped mid-write")
    finally:
        await client.close()
        await observer.close()
