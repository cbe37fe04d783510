"""End to end with an Akri handler: the Go handler written to Akri's protocol registers with the
agent (``python -m agent.main``, its environment as a DaemonSet gives it) → the agent publishes
its device's Instance and serves it → the controller creates a broker pinned to the node → the
kubelet's device manager hands the broker the device's env, device node and mount; the handler
is killed → after the offline grace the Instance and its broker are gone; it comes back → the
same Instance and a broker again.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from crds.naming import instance_name
from tests.harness.agent_process import AgentSubprocess
from tests.harness.akri_go_handler import GoHandler
from tests.harness.broker_stack import broker_stack, new_node_name
from tests.harness.controller_process import (
    apply,
    broker_pod_spec,
    broker_pods,
    configuration,
    items,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until

GRACE_S = 3  # offlineGracePeriodSeconds: short, the test waits it out


async def test_akri_handler_device_gets_a_broker_and_goes_with_the_handler(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    node = new_node_name()
    inst = instance_name("cams", "cam0", shared=True, node=node)
    pod_name = f"{inst}-{node}-pod"
    instances_path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    handlers_dir = Path(tempfile.mkdtemp(prefix="akri-", dir="/tmp"))
    agent = AgentSubprocess(control_plane, node_name=node, namespace=namespace,
                            serve_device_plugins=True, plugin_dir=plugin_dir,
                            log_path=tmp_path / "agent.log",
                            extra_env={"DISCOVERY_HANDLERS_DIRECTORY": str(handlers_dir)})
    handler = GoHandler(handlers_dir, name="akriCams", log_path=tmp_path / "handler.log")
    async with broker_stack(control_plane, namespace, plugin_dir, tmp_path, node=node,
                            log_lines=20) as stack:
        agent.start()
        try:
            apply(control_plane, _configuration(namespace))
            handler.start()

            pod = await stack.running_broker(pod_name)
            assert pod["spec"]["nodeName"] == node
            [allocation] = stack.emulator.allocations(namespace, pod_name)
            assert allocation.envs["DEBUG_ECHO_DESCRIPTION"] == "cam0"
            assert allocation.envs["PROPERTY_NAMES"] == "site"
            assert ("/dev/akri/cam0", "/dev/null", "rw") in allocation.devices
            assert ("/etc/akri/cam0", "/etc/hostname", True) in allocation.mounts
            [instance] = items(control_plane, instances_path)
            uid = instance["metadata"]["uid"]
            assert instance["metadata"]["name"] == inst

            handler.kill()
            await until(lambda: not items(control_plane, instances_path),
                        what="the Instance gone after the offline grace")
            await until(lambda: not broker_pods(control_plane, namespace), what="the broker gone")

            handler.start()
            pod = await stack.running_broker(pod_name, what=f"broker {pod_name} Running again")
            [instance] = items(control_plane, instances_path)
            assert instance["metadata"]["name"] == inst  # the same id, so the same Instance name
            assert instance["metadata"]["uid"] != uid
        finally:
            handler.stop()
            agent.stop()
            shutil.rmtree(handlers_dir, ignore_errors=True)
            print(f"--- agent log ---\n{(tmp_path / 'agent.log').read_text()[-3000:]}")
            print(f"--- handler log ---\n{handler.log_tail()}")


def _configuration(namespace: str) -> dict[str, Any]:
    return configuration(
        namespace, "cams", handler="akriCams", pod_spec=broker_pod_spec(), grace=GRACE_S,
        details=yaml.safe_dump({"descriptions": ["cam0"], "deviceNodes": True}),
        properties=[{"name": "site", "value": "lab"}])
