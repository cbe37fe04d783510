"""End to end: a debugEcho device appears → the agent publishes its Instance and serves it → the
controller creates a broker pinned to the node → the real scheduler binds it → the emulated
kubelet calls the agent's Allocate and runs it with the device's env; the device goes offline →
Instance, broker and service are gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crds.naming import instance_name
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.broker_stack import agent_in_process, broker_stack, new_node_name
from tests.harness.controller_process import apply, broker_pod_spec, broker_pods, items
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until


async def test_broker_runs_with_device_env_and_goes_with_the_device(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    node = new_node_name()
    offline = tmp_path / "offline"  # debugEcho: the file lists the devices that are offline
    inst = instance_name("echo", "foo0", shared=False, node=node)
    async with (broker_stack(control_plane, namespace, plugin_dir, tmp_path, node=node) as stack,
                agent_in_process(stack, plugin_dir)):
        cfg = debug_echo_configuration("echo", descriptions=["foo0"], shared=False,
                                       availability_file=offline)
        cfg["metadata"]["namespace"] = namespace
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_pod_spec()}
        cfg["spec"]["instanceServiceSpec"] = {"ports": [{"port": 80, "targetPort": 8083}]}
        apply(control_plane, cfg)

        pod_name = f"{inst}-{node}-pod"
        pod = await stack.running_broker(pod_name)
        assert pod["spec"]["nodeName"] == node, "scheduled onto the node that sees the device"
        [allocation] = stack.emulator.allocations(namespace, pod_name)
        assert allocation.resource_name == f"edgeplug.io/{inst}"
        assert allocation.envs["DEBUG_ECHO_DESCRIPTION"] == "foo0"
        cfg_path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/configurations/echo"

        def ready_status() -> dict[str, Any] | None:
            obj: dict[str, Any] = dict(control_plane.get_json(cfg_path) or {})
            status: dict[str, Any] = obj.get("status") or {}
            return status if status.get("brokers") == {"desired": 1, "ready": 1} else None

        status = await until(ready_status, what="Configuration status: 1/1 brokers ready")
        conditions = {c["type"]: c for c in status["conditions"]}
        assert conditions["BrokersReady"]["status"] == "True"
        assert status["instanceCount"] == 1
        svc_path = f"/api/v1/namespaces/{namespace}/services"
        [svc] = await until(lambda: items(control_plane, svc_path), what="the instance service")
        assert svc["spec"]["selector"]["edgeplug.io/instance"] == inst

        offline.write_text("foo0\n")  # the device goes offline
        await until(lambda: not items(
            control_plane, f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"),
            what="the Instance deleted by the agent")
        await until(lambda: not broker_pods(control_plane, namespace), what="the broker gone")
        await until(lambda: not items(control_plane, svc_path), what="the service gone")
