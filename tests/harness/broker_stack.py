"""The set-up every end-to-end broker test shares: one emulated node, the controller as a process,
the agent (in this process or as its own), and the wait for a broker pod to be Running.

The e2e broker tests (debugEcho, ONVIF, OPC UA, udev, Akri handlers) each
started and stopped the same three parts in the same order, and each polled for its broker the
same way; a change to that set-up (a flag, a teardown step, what is printed on failure) is made
here once.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.main import run_agent
from agent.settings import AgentSettings
from tests.harness import hermetic
from tests.harness.aio_process import task_running
from tests.harness.controller_process import ControllerProcess, broker_pods, install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.node_emulator import NodeEmulator


def new_node_name() -> str:
    """A node name of the test's own (nodes are cluster-wide, tests share the control plane)."""
    return f"node-{uuid.uuid4().hex[:8]}"


def running_pod(plane: ControlPlane, namespace: str, pod_name: str) -> dict[str, Any] | None:
    """The broker pod ``pod_name`` if it is Running now, else None."""
    for pod in broker_pods(plane, namespace):
        if pod["metadata"]["name"] == pod_name and pod.get("status", {}).get("phase") == "Running":
            return pod
    return None


@dataclass
class BrokerStack:
    """The parts a test looks at: the node's kubelet stand-in and the controller."""

    plane: ControlPlane
    namespace: str
    node: str
    emulator: NodeEmulator
    controller: ControllerProcess

    async def running_broker(self, pod_name: str, *, what: str = "") -> dict[str, Any]:
        """The broker pod ``pod_name`` once it is Running (fails naming it otherwise)."""
        return await until(lambda: running_pod(self.plane, self.namespace, pod_name),
                           what=what or f"broker {pod_name} Running")


@contextlib.asynccontextmanager
async def broker_stack(
    plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path, *, node: str,
    pod_resources_socket: Path | None = None, log_lines: int = 40,
) -> AsyncIterator[BrokerStack]:
    """An emulated node (kubelet stand-in) and the controller watching ``namespace``, stopped
    (the node deleted) afterwards; the controller's log tail is printed for a failing test."""
    install_peering_crds(plane)
    emulator = NodeEmulator(node_name=node, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
                            pod_resources_socket=pod_resources_socket)
    ctl = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    await emulator.start()
    try:
        ctl.start()
        try:
            yield BrokerStack(plane, namespace, node, emulator, ctl)
        finally:
            ctl.stop()
    finally:
        await emulator.stop(delete_node=True)
        print(f"--- controller log ---\n{ctl.log_tail(log_lines)}")


@contextlib.asynccontextmanager
async def agent_in_process(stack: BrokerStack, plugin_dir: Path) -> AsyncIterator[None]:
    """The agent (``run_agent``) as a task of this process on the stack's node, cancelled after."""
    settings = AgentSettings(node_name=stack.node, kubeconfig=stack.plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=stack.namespace)
    hermetic.refuse_host_paths(settings, what=f"the agent of {stack.node}")
    async with task_running(run_agent(settings), name=f"agent-{stack.node}"):
        yield
