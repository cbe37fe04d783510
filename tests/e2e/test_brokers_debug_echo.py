"""End to end: a debugEcho device appears → the agent publishes its Instance and serves it → the
controller creates a broker pinned to the node → the real scheduler binds it → the emulated
kubelet calls the agent's Allocate and runs it with the device's env; the device goes offline →
Instance, broker and service are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name
from tests.harness.agent_process import debug_echo_configuration
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


async def test_broker_runs_with_device_env_and_goes_with_the_device(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    install_peering_crds(control_plane)
    node = f"node-{uuid.uuid4().hex[:8]}"
    offline = tmp_path / "offline"  # debugEcho: the file lists the devices that are offline
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir)
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=namespace)
    ctl = ControllerProcess(control_plane, namespaces=[namespace],
                            log_path=tmp_path / "ctl.log")
    inst = instance_name("echo", "foo0", shared=False, node=node)
    await emulator.start()
    agent = asyncio.create_task(run_agent(settings))
    ctl.start()
    try:
        cfg = debug_echo_configuration("echo", descriptions=["foo0"], shared=False,
                                       availability_file=offline)
        cfg["metadata"]["namespace"] = namespace
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_pod_spec()}
        cfg["spec"]["instanceServiceSpec"] = {"ports": [{"port": 80, "targetPort": 8083}]}
        apply(control_plane, cfg)

        pod_name = f"{inst}-{node}-pod"

        def running() -> dict[str, Any] | None:
            for pod in broker_pods(control_plane, namespace):
                if (pod["metadata"]["name"] == pod_name
                        and pod.get("status", {}).get("phase") == "Running"):
                    return pod
            return None

        pod = await until(running, what=f"broker {pod_name} Running")
        assert pod["spec"]["nodeName"] == node, "scheduled onto the node that sees the device"
        [allocation] = emulator.allocations(namespace, pod_name)
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
    finally:
        ctl.stop()
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        await emulator.stop(delete_node=True)
        print(f"--- controller log ---\n{ctl.log_tail(40)}")
