"""debugEcho devices become Instances with the right names, properties, nodes, slots and labels.

Against the real control plane; the agent's discovery side runs in-process on an emulated node
name (a Node object the test creates).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from agent.discovery.node_labels import OWNED_ANNOTATION
from agent.settings import current, in_use
from crds.naming import cdi_name, instance_digest, instance_name, slot_id
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane

SHORT_GRACE = 3  # seconds: offlineGracePeriodSeconds for the grace tests


async def test_shared_and_local_devices_become_instances(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = harness.new_node(control_plane)
    shared_cfg = harness.debug_echo_configuration(
        "echo-shared", descriptions=["foo0", "foo1"], capacity=2,
        broker_properties={"COLOUR": "blue"},
    )
    local_cfg = harness.debug_echo_configuration("echo-local", descriptions=["usb0"], shared=False)
    client = harness.api_client(control_plane)
    async with harness.agent_in_process(
        control_plane, node_name=node, namespace=namespace
    ) as agent:
        harness.apply(control_plane, namespace, shared_cfg, local_cfg)
        expected = {
            instance_name("echo-shared", "foo0", shared=True, node=node),
            instance_name("echo-shared", "foo1", shared=True, node=node),
            instance_name("echo-local", "usb0", shared=False, node=node),
        }

        async def all_there() -> dict[str, dict[str, Any]] | None:
            # Published: created, and this node's apply has named it in spec.nodes (an Instance
            # is created first and applied right after, so a read may fall in between).
            found = await harness.instances(client, namespace)
            named = set(found) == expected and all("nodes" in f["spec"] for f in found.values())
            return found if named else None

        found = await harness.eventually(all_there, what=f"Instances {sorted(expected)}")
        foo0 = found[instance_name("echo-shared", "foo0", shared=True, node=node)]
        spec = foo0["spec"]
        assert spec["configurationName"] == "echo-shared"
        assert spec["nodes"] == [node]
        assert spec["shared"] is True
        assert spec["capacity"] == 2
        assert spec["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": "foo0", "COLOUR": "blue"}
        assert spec["cdiName"] == cdi_name("echo-shared", instance_digest("foo0", shared=True,
                                                                           node=node))
        name = foo0["metadata"]["name"]
        assert spec["deviceUsage"] == {slot_id(name, 0): "", slot_id(name, 1): ""}
        owners = foo0["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("Configuration", "echo-shared")]

        local = found[instance_name("echo-local", "usb0", shared=False, node=node)]
        assert local["spec"]["shared"] is False
        assert local["spec"]["nodes"] == [node]
        assert local["metadata"]["name"] != instance_name("echo-local", "usb0", shared=True,
                                                          node=node)

        # The node device table has what the device plugins serve.
        async def served() -> bool:
            return {name for _, name in agent.devices.snapshot()} == expected

        await harness.eventually(served, what=f"node device table holding {sorted(expected)}")
        table = agent.devices.snapshot()
        assert table[(namespace, name)].properties["DEBUG_ECHO_DESCRIPTION"] == "foo0"

        # The instances gauge counts them per Configuration. The publisher sets it after the
        # table and the devices' health reports (API writes), so it is awaited, not read at once.
        async def counted() -> float | None:
            gauge = agent.metrics.registry.get_sample_value(
                "edgeplug_instances", {"namespace": namespace, "configuration": "echo-shared"}
            )
            return gauge if gauge == 2 else None

        await harness.eventually(counted, what="edgeplug_instances of echo-shared at 2")

        # The node is labelled with both Configurations.
        async def labelled() -> dict[str, str] | None:
            got = await client.get(Node, node)
            labels = dict((got.metadata.labels if got.metadata else None) or {})
            wanted = {"edgeplug.io/echo-shared": "true", "edgeplug.io/echo-local": "true"}
            return labels if wanted.items() <= labels.items() else None

        await harness.eventually(labelled, what=f"labels edgeplug.io/echo-* on Node {node}")
        # The same patch recorded them as the agent's, per Configuration.
        assert await _record(client, node) == {
            f"{namespace}/echo-local": ["edgeplug.io/echo-local"],
            f"{namespace}/echo-shared": ["edgeplug.io/echo-shared"],
        }

        # Deleting a Configuration removes the node's Instances of it and its label.
        control_plane.kubectl("delete", "configuration", "echo-local", "-n", namespace)

        async def local_gone() -> bool:
            found = await harness.instances(client, namespace)
            got = await client.get(Node, node)
            labels = (got.metadata.labels if got.metadata else None) or {}
            return (
                not any(n.startswith("echo-local-") for n in found)
                and "edgeplug.io/echo-local" not in labels
            )

        await harness.eventually(local_gone, what="echo-local's Instance and node label gone")
        assert await _record(client, node) == {
            f"{namespace}/echo-shared": ["edgeplug.io/echo-shared"]}
    await client.close()


async def _labels_once_ghost_pruned(
    control_plane: ControlPlane, client: AsyncClient, namespace: str, node: str
) -> dict[str, str]:
    """Start an agent on ``node``; the node's labels once ``edgeplug.io/ghost`` is gone."""
    async with harness.agent_in_process(control_plane, node_name=node, namespace=namespace):

        async def pruned() -> dict[str, str] | None:
            got = await client.get(Node, node)
            labels = dict((got.metadata.labels if got.metadata else None) or {})
            return labels if "edgeplug.io/ghost" not in labels else None

        found: dict[str, str] = await harness.eventually(
            pruned, what=f"stale label edgeplug.io/ghost gone from {node}")
        return found


async def _record(client: AsyncClient, node: str) -> Any:
    """The agent's record of its labels on ``node`` (None without one)."""
    got = await client.get(Node, node)
    text = ((got.metadata.annotations if got.metadata else None) or {}).get(OWNED_ANNOTATION)
    return None if text is None else json.loads(text)


async def test_two_nodes_share_one_instance(control_plane: ControlPlane, namespace: str) -> None:
    node_a, node_b = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    cfg = harness.debug_echo_configuration("cam", descriptions=["camera-1"])
    client = harness.api_client(control_plane)
    name = instance_name("cam", "camera-1", shared=True, node=node_a)
    harness.apply(control_plane, namespace, cfg)
    async with (
        harness.agent_in_process(control_plane, node_name=node_a, namespace=namespace),
        harness.agent_in_process(control_plane, node_name=node_b, namespace=namespace) as agent_b,
    ):
        async def both() -> bool:
            found = await harness.instances(client, namespace)
            return name in found and sorted(found[name]["spec"]["nodes"]) == [node_a, node_b]

        await harness.eventually(both, what=f"Instance {name} listing {node_a} and {node_b}")
        uid = (await harness.instances(client, namespace))[name]["metadata"]["uid"]

        # One agent's Configuration stops selecting its node: it leaves, the other stays.
        await agent_b.watch.runs[(namespace, "cam")].stop(withdraw=True)

        async def only_a() -> bool:
            found = await harness.instances(client, namespace)
            nodes: list[str] = found[name]["spec"]["nodes"]
            return nodes == [node_a]

        await harness.eventually(only_a, what=f"Instance {name} listing only {node_a}")
        assert (await harness.instances(client, namespace))[name]["metadata"]["uid"] == uid

        # The Configuration goes: the Instance goes and no agent brings it back.
        control_plane.kubectl("delete", "configuration", "cam", "-n", namespace)

        async def gone() -> bool:
            return name not in await harness.instances(client, namespace)

        await harness.eventually(gone, what=f"Instance {name} deleted with its Configuration")
    await client.close()


async def test_offline_devices_local_at_once_shared_after_grace(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    node = harness.new_node(control_plane)
    availability = tmp_path / "offline"
    shared_cfg = harness.debug_echo_configuration(
        "net", descriptions=["cam0", "cam1"], availability_file=availability, grace=SHORT_GRACE
    )
    local_cfg = harness.debug_echo_configuration(
        "usb", descriptions=["port0"], shared=False, availability_file=availability
    )
    cam0 = instance_name("net", "cam0", shared=True, node=node)
    cam1 = instance_name("net", "cam1", shared=True, node=node)
    port0 = instance_name("usb", "port0", shared=False, node=node)
    client = harness.api_client(control_plane)
    async with harness.agent_in_process(
        control_plane, node_name=node, namespace=namespace
    ) as agent:
        harness.apply(control_plane, namespace, shared_cfg, local_cfg)

        async def all_three() -> dict[str, dict[str, Any]] | None:
            found = await harness.instances(client, namespace)
            return found if {cam0, cam1, port0} <= set(found) else None

        before = await harness.eventually(all_three, what="three Instances")

        # port0 and cam0 go offline: port0's Instance goes at once, cam0's stays for the grace
        # (unhealthy in the node's table) and goes once it has passed.
        availability.write_text("port0\ncam0\n")

        async def port0_gone() -> dict[str, dict[str, Any]] | None:
            found = await harness.instances(client, namespace)
            return found if port0 not in found else None

        await harness.eventually(port0_gone, what=f"local Instance {port0} deleted")

        async def cam0_in_grace() -> bool:
            device = agent.devices.get(namespace, cam0)
            return device is not None and not device.healthy

        await harness.eventually(cam0_in_grace, what=f"{cam0} unhealthy in the node's table")
        assert cam0 in await harness.instances(client, namespace), (
            "a shared Instance must outlive its device by the grace period"
        )

        async def cam0_gone() -> bool:
            return cam0 not in await harness.instances(client, namespace)

        await harness.eventually(cam0_gone, what=f"shared Instance {cam0} deleted after the grace",
                         deadline=SHORT_GRACE + 15)

        # cam1 goes offline and comes back within the grace: nothing changes.
        availability.write_text("cam1\n")

        async def cam1_unhealthy() -> bool:
            device = agent.devices.get(namespace, cam1)
            return device is not None and not device.healthy

        await harness.eventually(cam1_unhealthy, what=f"{cam1} marked unhealthy")
        availability.write_text("")

        async def cam1_healthy() -> bool:
            device = agent.devices.get(namespace, cam1)
            return device is not None and device.healthy

        await harness.eventually(cam1_healthy, what=f"{cam1} healthy again")
        found = await harness.instances(client, namespace)
        assert found[cam1]["metadata"]["uid"] == before[cam1]["metadata"]["uid"]
        assert found[cam1]["spec"]["nodes"] == [node]
        assert agent.watch.runs[(namespace, "net")].publisher.owned.get(cam1) is True
    await client.close()


async def test_stale_configuration_labels_pruned_at_start(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A Configuration deleted while the agent was down leaves no label behind."""
    node = harness.new_node(
        control_plane,
        labels={"edgeplug.io/ghost": "true", "edgeplug.io/team": "cameras", "zone": "a"},
    )
    client = harness.api_client(control_plane)
    labels = await _labels_once_ghost_pruned(control_plane, client, namespace, node)
    # Labels that are not ours to manage stay.
    assert labels["edgeplug.io/team"] == "cameras"
    assert labels["zone"] == "a"
    await client.close()


async def test_stale_labels_pruned_at_start_are_only_those_recorded_as_the_agents(
    control_plane: ControlPlane, namespace: str
) -> None:
    """With the agent's record on the Node: a deleted Configuration's labels go, handler labels
    included, and an edgeplug.io/ label the agent never set stays, whatever its value."""
    node = harness.new_node(control_plane, labels={
        "edgeplug.io/ghost": "true", "edgeplug.io/npu.chip.name": "910B",
        "edgeplug.io/mine": "true", "zone": "a"})
    record = {f"{namespace}/ghost": ["edgeplug.io/ghost", "edgeplug.io/npu.chip.name"]}
    control_plane.kubectl("annotate", "node", node, f"{OWNED_ANNOTATION}={json.dumps(record)}")
    client = harness.api_client(control_plane)
    labels = await _labels_once_ghost_pruned(control_plane, client, namespace, node)
    assert "edgeplug.io/npu.chip.name" not in labels
    assert labels["edgeplug.io/mine"] == "true"
    assert labels["zone"] == "a"
    assert await _record(client, node) is None
    await client.close()


async def test_slots_are_added_once_device_plugins_take_a_configuration_over(
    control_plane: ControlPlane, namespace: str
) -> None:
    """An Instance made while the scheduler allocated its Configuration has no slot map; the
    controller's choice turning to device plugins adds every slot, free, without a resync."""
    node = harness.new_node(control_plane)
    cfg = harness.debug_echo_configuration("echo-switch", descriptions=["cam"], capacity=2)
    harness.apply(control_plane, namespace, cfg)

    def choose(allocator: str) -> None:
        control_plane.kubectl("patch", "configurations.edgeplug.io", "echo-switch", "-n",
                              namespace, "--subresource=status", "--type=merge", "-p",
                              json.dumps({"status": {"allocator": allocator}}))

    choose("dra")
    client = harness.api_client(control_plane)
    name = instance_name("echo-switch", "cam", shared=True, node=node)

    async def spec() -> dict[str, Any] | None:
        found = (await harness.instances(client, namespace)).get(name)
        return found["spec"] if found and node in found["spec"].get("nodes", []) else None

    tree = current()
    try:
        with in_use(replace(tree, serve_dra=True)):
            async with harness.agent_in_process(control_plane, node_name=node,
                                                namespace=namespace, resync_interval=3600):
                listed = await harness.eventually(spec, what=f"Instance {name} listing {node}")
                assert "deviceUsage" not in listed, "no slot map where the scheduler allocates"
                choose("devicePlugin")

                async def slots() -> dict[str, str] | None:
                    return ((await spec()) or {}).get("deviceUsage") or None

                assert await harness.eventually(slots, what="its slots") == {
                    slot_id(name, 0): "", slot_id(name, 1): ""}
    finally:
        await client.close()
