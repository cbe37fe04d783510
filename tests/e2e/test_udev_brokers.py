"""End to end with udev: an emulated USB serial radio is plugged → the agent (running under
umockdev's preload library, so the real libudev sees the test bed's sysfs, /dev and uevents)
publishes its Instance and serves it → the controller creates a broker pinned to the node → the
emulated kubelet's Allocate hands the broker ``/dev/ttyUSB0`` as a device node and
``UDEV_DEVNODE`` (and its CDI spec holds the node); the radio comes back as ``/dev/ttyUSB1`` →
the Instance and the CDI spec follow; it is unplugged → Instance and broker are gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from crds.naming import instance_name
from tests.harness.agent_process import AgentSubprocess
from tests.harness.broker_stack import broker_stack, new_node_name, running_pod
from tests.harness.controller_process import (
    apply,
    broker_pod_spec,
    broker_pods,
    configuration,
    items,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.udev_testbed import UmockdevBed

PORT_ID = "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0"



def spec_nodes(path: Path) -> list[tuple[str, str, str]]:
    """The device nodes in the agent's CDI spec file for the Configuration (none: no file)."""
    try:
        spec = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return []
    return [(n["path"], n["hostPath"], n["permissions"])
            for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def radio_configuration(name: str, namespace: str) -> dict[str, Any]:
    """crds/examples/udev-serial-radio.yaml's shape, with the test's broker."""
    return configuration(
        namespace, name, handler="udev", pod_spec=broker_pod_spec(),
        details=yaml.safe_dump({"usb": {"vendor": "0403", "product": "6001"},
                                "permissions": "rw"}))


async def test_radio_plugged_gets_a_broker_with_its_device_node(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    node = new_node_name()
    inst = instance_name("radio", PORT_ID, shared=False, node=node)
    pod_name = f"{inst}-{node}-pod"
    resource = f"edgeplug.io/{inst}"
    instances_path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    pod_resources = plugin_dir / "pr.sock"  # the agent frees the slot of a replaced broker
    with UmockdevBed() as bed:
        cdi_dir = tmp_path / "cdi"
        cdi_dir.mkdir()
        spec_file = cdi_dir / f"edgeplug.io-{namespace}_radio.json"
        agent = AgentSubprocess(control_plane, node_name=node, namespace=namespace,
                                serve_device_plugins=True, plugin_dir=plugin_dir,
                                log_path=tmp_path / "agent.log",
                                extra_env={**bed.env(), "CDI_SPEC_DIR": str(cdi_dir),
                                           "POD_RESOURCES_SOCKET": str(pod_resources)})
        async with broker_stack(control_plane, namespace, plugin_dir, tmp_path, node=node,
                                pod_resources_socket=pod_resources, log_lines=20) as stack:
            agent.start()
            try:
                apply(control_plane, radio_configuration("radio", namespace))
                bed.plug("1-1", "ttyUSB0", "A50285BI")

                def allocatable() -> str | None:
                    node_path = f"/api/v1/nodes/{node}"
                    obj: dict[str, Any] = dict(control_plane.get_json(node_path) or {})
                    value = obj.get("status", {}).get("allocatable", {}).get(resource)
                    return str(value) if value is not None else None

                await until(lambda: allocatable() == "1",
                            what=f"{resource}: 1 allocatable on the Node")
                pod = await stack.running_broker(pod_name)
                assert pod["spec"]["nodeName"] == node
                [allocation] = stack.emulator.allocations(namespace, pod_name)
                assert allocation.resource_name == resource
                assert ("/dev/ttyUSB0", "/dev/ttyUSB0", "rw") in allocation.devices
                assert allocation.envs["UDEV_DEVNODE"] == "/dev/ttyUSB0"
                assert allocation.envs["UDEV_DEVPATH"] == PORT_ID
                assert allocation.envs["UDEV_SERIAL"] == "A50285BI"
                cdi_name = f"edgeplug.io/radio={inst.rsplit('-', 1)[1]}"
                assert cdi_name in allocation.cdi_devices
                assert spec_nodes(spec_file) == [("/dev/ttyUSB0", "/dev/ttyUSB0", "rw")]
                [instance] = items(control_plane, instances_path)
                assert instance["metadata"]["name"] == inst
                assert instance["spec"]["nodes"] == [node]

                bed.renumber("1-1", "ttyUSB1")  # akri#734: the same port, a new node name

                def follows() -> bool:
                    [obj] = items(control_plane, instances_path) or [{}]
                    props = obj.get("spec", {}).get("brokerProperties", {})
                    return bool(props.get("UDEV_DEVNODE") == "/dev/ttyUSB1")

                await until(follows, what="the Instance's UDEV_DEVNODE following to /dev/ttyUSB1")
                moved = [("/dev/ttyUSB1", "/dev/ttyUSB1", "rw")]
                await until(lambda: spec_nodes(spec_file) == moved,
                            what="the CDI spec following to /dev/ttyUSB1")
                names = [i["metadata"]["name"] for i in items(control_plane, instances_path)]
                assert names == [inst]

                # The running broker still has the old node in its container: the controller
                # replaces it, and the new broker's Allocate carries the new node.
                def replaced() -> bool:
                    allocations = stack.emulator.allocations(namespace, pod_name)
                    if running_pod(control_plane, namespace, pod_name) is None or not allocations:
                        return False
                    return moved[0] in allocations[0].devices

                await until(replaced, what="a new broker whose Allocate carried /dev/ttyUSB1")
                [allocation] = stack.emulator.allocations(namespace, pod_name)
                assert allocation.envs["UDEV_DEVNODE"] == "/dev/ttyUSB1"

                bed.unplug("1-1")
                await until(lambda: not items(control_plane, instances_path),
                            what="the Instance deleted by the agent")
                await until(lambda: not broker_pods(control_plane, namespace),
                            what="the broker gone")
            finally:
                agent.stop()
                print(f"--- agent log ---\n{(tmp_path / 'agent.log').read_text()[-3000:]}")
