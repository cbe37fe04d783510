"""``make demo``: edgeplug end to end on one laptop, in well under a minute.

Why this exists: it shows a user what edgeplug does without a cluster or hardware. It starts a
real control plane (etcd, kube-apiserver, scheduler, controller-manager), an emulated node (a
kubelet stand-in speaking the real device-plugin API), and the edgeplug agent in-process; applies
``crds/examples/debug-echo.yaml``; waits for its Instances and the node's allocatable device
resources; prints ``kubectl get instances -o wide`` and the allocatable; then shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node

from agent.main import configure_logging, run_agent
from agent.settings import AgentSettings
from tests.harness.agent_process import eventually, instances
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator

NODE_NAME = "demo-node"
NAMESPACE = "default"
EXAMPLE = Path(__file__).resolve().parents[2] / "crds" / "examples" / "debug-echo.yaml"
EXPECTED_INSTANCES = 2  # the example lists foo0 and foo1
READY_DEADLINE = 30.0  # seconds for Instances and allocatable to appear


async def _demo(plane: ControlPlane, plugin_dir: Path) -> None:
    emulator = NodeEmulator(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                            plugin_dir=plugin_dir)
    client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    settings = AgentSettings(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None)
    await emulator.start()
    agent = asyncio.create_task(run_agent(settings))
    try:
        print(f"$ kubectl apply -f {EXAMPLE.relative_to(EXAMPLE.parents[2])}")
        print(plane.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE)).stdout, end="")

        async def published() -> bool:
            return len(await instances(client, NAMESPACE)) >= EXPECTED_INSTANCES

        await eventually(published, what="the debugEcho Instances", deadline=READY_DEADLINE)

        async def allocatable() -> dict[str, str] | None:
            node = await client.get(Node, NODE_NAME)
            alloc = (node.status.allocatable if node.status else None) or {}
            devices = {k: v for k, v in alloc.items() if k.startswith("edgeplug.io/")}
            ready = len(devices) > EXPECTED_INSTANCES and all(v != "0" for v in devices.values())
            return devices if ready else None

        devices = await eventually(allocatable, what="edgeplug resources allocatable",
                                   deadline=READY_DEADLINE)
        print("\n$ kubectl get instances -o wide")
        print(plane.kubectl("get", "instances", "-n", NAMESPACE, "-o", "wide").stdout, end="")
        print(f"\nallocatable device resources on node {NODE_NAME}:")
        for resource, count in sorted(devices.items()):
            print(f"  {resource}: {count}")
    finally:
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        await emulator.stop(delete_node=True)
        await client.close()


def main() -> int:
    configure_logging(logging.WARNING)
    # The emulated kubelet warns when plugins go away, which they do at the end of the demo.
    logging.getLogger("tests.harness").setLevel(logging.ERROR)
    started = time.monotonic()
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-demo-", dir="/tmp"))
    try:
        print("starting a control plane (etcd, kube-apiserver, scheduler, controller-manager)")
        with ControlPlane() as plane:
            plane.apply_crds()
            asyncio.run(_demo(plane, plugin_dir))
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)
    print(f"\ndemo done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
