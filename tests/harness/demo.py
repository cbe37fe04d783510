"""``make demo``: edgeplug end to end on one machine, in well under a minute.

Why this exists: it shows a user what edgeplug does without a cluster or hardware. It starts a
real control plane (etcd, kube-apiserver, scheduler, controller-manager), an emulated node (a
kubelet stand-in speaking the real device-plugin API), the edgeplug agent in-process and the
edgeplug controller as its own process. It applies ``crds/examples/debug-echo.yaml`` (with an
availability file added to its details, so the demo can unplug a simulated device), then shows:
the Instances, the node's allocatable device resources, the broker pods the controller created
and the environment each got from the agent's ``Allocate``; then unplugs ``foo1`` and shows its
Instance and broker going away.
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
from typing import Any

import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from agent.main import configure_logging, run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name
from tests.harness import hermetic
from tests.harness.agent_process import eventually, instances
from tests.harness.controller_process import ControllerProcess, install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator

NODE_NAME = "demo-node"
NAMESPACE = "default"
EXAMPLE = Path(__file__).resolve().parents[2] / "crds" / "examples" / "debug-echo.yaml"
DEVICES = ("foo0", "foo1")  # the example's descriptions
UNPLUGGED = "foo1"
DEMO_GRACE_S = 2  # offlineGracePeriodSeconds for the demo, so unplugging shows at once
READY_DEADLINE = 45.0  # seconds for each stage to show


def _configuration(availability_file: Path) -> dict[str, Any]:
    """The example, with an availability file (to unplug devices) and a short grace."""
    cfg: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    details = yaml.safe_load(cfg["spec"]["discoveryHandler"]["discoveryDetails"])
    details["availabilityFile"] = str(availability_file)
    cfg["spec"]["discoveryHandler"]["discoveryDetails"] = yaml.safe_dump(details)
    cfg["spec"]["offlineGracePeriodSeconds"] = DEMO_GRACE_S
    return cfg


def _show(plane: ControlPlane, *args: str) -> None:
    print(f"\n$ kubectl {' '.join(args)}")
    print(plane.kubectl(*args).stdout, end="")


async def _running_brokers(client: AsyncClient) -> list[Pod]:
    pods = [p async for p in client.list(Pod, namespace=NAMESPACE)]
    return [p for p in pods if p.status is not None and p.status.phase == "Running"]


async def _demo(plane: ControlPlane, workdir: Path) -> None:
    plugin_dir = workdir / "device-plugins"
    plugin_dir.mkdir()
    availability = workdir / "offline-devices"
    availability.write_text("")
    emulator = NodeEmulator(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                            plugin_dir=plugin_dir)
    client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    settings = AgentSettings(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None)
    controller = ControllerProcess(plane, namespaces=[NAMESPACE],
                                   log_path=workdir / "controller.log").start()
    await emulator.start()
    hermetic.refuse_host_paths(settings, what="the demo's agent")
    agent = asyncio.create_task(run_agent(settings))
    try:
        print(f"$ kubectl apply -f {EXAMPLE.relative_to(EXAMPLE.parents[2])}"
              f"   # plus availabilityFile and offlineGracePeriodSeconds: {DEMO_GRACE_S}")
        print(plane.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                            stdin=yaml.safe_dump(_configuration(availability))).stdout, end="")

        async def allocatable() -> dict[str, str] | None:
            node = await client.get(Node, NODE_NAME)
            alloc = (node.status.allocatable if node.status else None) or {}
            devices = {k: v for k, v in alloc.items() if k.startswith("edgeplug.io/")}
            ready = len(devices) > len(DEVICES) and all(v != "0" for v in devices.values())
            return devices if ready else None

        devices = await eventually(allocatable, what="edgeplug resources allocatable",
                                   deadline=READY_DEADLINE)

        async def brokers_running() -> list[Pod] | None:
            running = await _running_brokers(client)
            return running if len(running) == len(DEVICES) else None

        brokers = await eventually(brokers_running, what="a Running broker pod per device",
                                   deadline=READY_DEADLINE)

        async def status_counts_them() -> bool:
            cfg = plane.get_json(f"/apis/edgeplug.io/v1alpha1/namespaces/{NAMESPACE}"
                                 "/configurations/debug-echo") or {}
            status: dict[str, Any] = cfg.get("status") or {}  # type: ignore[assignment]
            return (status.get("brokers") or {}).get("ready") == len(DEVICES)

        await eventually(status_counts_them, what="the Configuration's status to count them",
                         deadline=READY_DEADLINE)
        _show(plane, "get", "instances", "-n", NAMESPACE, "-o", "wide")
        print(f"\nallocatable device resources on node {NODE_NAME}:")
        for resource, count in sorted(devices.items()):
            print(f"  {resource}: {count}")
        _show(plane, "get", "pods", "-n", NAMESPACE, "-o", "wide")
        print("\nwhat each broker got from the agent's Allocate (DEBUG_ECHO_* variables):")
        for pod in brokers:
            name = pod.metadata.name if pod.metadata and pod.metadata.name else "?"
            for container in emulator.allocations(NAMESPACE, name):
                env = {k: v for k, v in container.envs.items() if k.startswith("DEBUG_ECHO")}
                print(f"  {name}: {env} cdi={list(container.cdi_devices)}")
        _show(plane, "get", "configurations", "-n", NAMESPACE)

        print(f"\n# unplugging {UNPLUGGED} (shared device: its Instance goes after the "
              f"{DEMO_GRACE_S} s grace, and the controller removes its broker)")
        availability.write_text(f"{UNPLUGGED}\n")
        gone = instance_name("debug-echo", UNPLUGGED, shared=True, node=NODE_NAME)

        async def unplugged() -> bool:
            if gone in await instances(client, NAMESPACE):
                return False
            return len(await _running_brokers(client)) == len(DEVICES) - 1

        await eventually(unplugged, what=f"{gone} and its broker gone",
                         deadline=READY_DEADLINE)
        _show(plane, "get", "instances", "-n", NAMESPACE)
        _show(plane, "get", "pods", "-n", NAMESPACE)
    finally:
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        controller.stop()
        await emulator.stop(delete_node=True)
        await client.close()


def main() -> int:
    configure_logging(logging.WARNING)
    # The emulated kubelet warns when plugins go away, which they do at the end of the demo.
    logging.getLogger("tests.harness").setLevel(logging.ERROR)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="ep-demo-", dir="/tmp"))
    try:
        print("starting a control plane (etcd, kube-apiserver, scheduler, controller-manager)")
        with ControlPlane() as plane:
            install_peering_crds(plane)
            asyncio.run(_demo(plane, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ndemo done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
