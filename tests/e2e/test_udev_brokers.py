"""End to end with udev: an emulated USB serial radio is plugged → the agent (running under
umockdev's preload library, so the real libudev sees the test bed's sysfs, /dev and uevents)
publishes its Instance and serves it → the controller creates a broker pinned to the node → the
emulated kubelet's Allocate hands the broker ``/dev/ttyUSB0`` as a device node and
``UDEV_DEVNODE`` (and its CDI spec holds the node); the radio comes back as ``/dev/ttyUSB1`` →
the Instance and the CDI spec follow; it is unplugged → Instance and broker are gone.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from crds.naming import instance_name
from tests.harness.agent_process import AgentSubprocess
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    broker_pods,
    install_peering_crds,
    items,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.node_emulator import NodeEmulator
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
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {
                "name": "udev",
                "discoveryDetails": yaml.safe_dump(
                    {"usb": {"vendor": "0403", "product": "6001"}, "permissions": "rw"}),
            },
            "capacity": 1,
            "brokerSpec": {"brokerPodSpec": broker_pod_spec()},
        },
    }


async def test_radio_plugged_gets_a_broker_with_its_device_node(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    install_peering_crds(control_plane)
    node = f"node-{uuid.uuid4().hex[:8]}"
    inst = instance_name("radio", PORT_ID, shared=False, node=node)
    pod_name = f"{inst}-{node}-pod"
    instances_path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    pod_resources = plugin_dir / "pr.sock"  # the agent frees the slot of a replaced broker
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir, pod_resources_socket=pod_resources)
    ctl = ControllerProcess(control_plane, namespaces=[namespace],
                            log_path=tmp_path / "ctl.log")
    with UmockdevBed() as bed:
        cdi_dir = tmp_path / "cdi"
        cdi_dir.mkdir()
        spec_file = cdi_dir / f"edgeplug.io-{namespace}_radio.json"
        agent = AgentSubprocess(control_plane, node_name=node, namespace=namespace,
                                serve_device_plugins=True, plugin_dir=plugin_dir,
                                log_path=tmp_path / "agent.log",
                                extra_env={**bed.env(), "CDI_SPEC_DIR": str(cdi_dir),
                                           "POD_RESOURCES_SOCKET": str(pod_resources)})
        await emulator.start()
        agent.start()
        ctl.start()
        try:
            apply(control_plane, radio_configuration("radio", namespace))
            bed.plug("1-1", "ttyUSB0", "A50285BI")

            def running() -> dict[str, Any] | None:
                for pod in broker_pods(control_plane, namespace):
                    if (pod["metadata"]["name"] == pod_name
                            and pod.get("status", {}).get("phase") == "Running"):
                        return pod
                return None

            def allocatable() -> str | None:
                obj: dict[str, Any] = dict(control_plane.get_json(f"/api/v1/nodes/{node}") or {})
                value = obj.get("status", {}).get("allocatable", {}).get(f"edgeplug.io/{inst}")
                return str(value) if value is not None else None

            await until(lambda: allocatable() == "1",
                        what=f"edgeplug.io/{inst}: 1 allocatable on the Node")
            pod = await until(running, what=f"broker {pod_name} Running")
            assert pod["spec"]["nodeName"] == node
            [allocation] = emulator.allocations(namespace, pod_name)
            assert allocation.resource_name == f"edgeplug.io/{inst}"
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
            await until(lambda: spec_nodes(spec_file) == [("/dev/ttyUSB1", "/dev/ttyUSB1", "rw")],
                        what="the CDI spec following to /dev/ttyUSB1")
            assert [i["metadata"]["name"] for i in items(control_plane, instances_path)] == [inst]

            # The running broker still has the old node in its container: the controller
            # replaces it, and the new broker's Allocate carries the new node.
            def replaced() -> bool:
                allocations = emulator.allocations(namespace, pod_name)
                return bool(running()) and bool(allocations) and (
                    "/dev/ttyUSB1", "/dev/ttyUSB1", "rw") in allocations[0].devices

            await until(replaced, what="a new broker whose Allocate carried /dev/ttyUSB1")
            [allocation] = emulator.allocations(namespace, pod_name)
            assert allocation.envs["UDEV_DEVNODE"] == "/dev/ttyUSB1"

            bed.unplug("1-1")
            await until(lambda: not items(control_plane, instances_path),
                        what="the Instance deleted by the agent")
            await until(lambda: not broker_pods(control_plane, namespace),
                        what="the broker gone")
        finally:
            ctl.stop()
            agent.stop()
            await emulator.stop(delete_node=True)
            print(f"--- agent log ---\n{(tmp_path / 'agent.log').read_text()[-3000:]}")
            print(f"--- controller log ---\n{ctl.log_tail(20)}")
