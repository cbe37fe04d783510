"""What the kubelet's own device manager costs the harness: start, kubelet restart, admission.

What running the tests against ``DeviceNode`` (the kubelet's device manager in the
``devicenode`` command) rather than the Python node emulator costs: the harness's
start (control plane plus one node), a kubelet restart until a plugin's devices are allocatable
again, and one pod from creation to Running. Both stand-ins are measured in the same run, with
a fixed pure-Python loop as the machine's speed beside the figures. Nothing is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from tests.bench.stats import machine_speed_line, summary
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import in_phase, wait_allocatable, wait_pod, wait_service_account
from tests.harness.node_emulator import PythonNodeEmulator
from tests.harness.testplugin import TestPlugin

PLANE_RUNS = 3
NODE_RUNS = 8
RESTART_RUNS = 5
POD_RUNS = 8
HEALTHY = "Healthy"

Kind = Callable[..., PythonNodeEmulator | DeviceNode]
KINDS: dict[str, Kind] = {"python emulator": PythonNodeEmulator, "devicenode": DeviceNode}


async def timed(action: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


def plane_starts() -> list[float]:
    samples = []
    for _ in range(PLANE_RUNS):
        started = time.perf_counter()
        with ControlPlane():
            samples.append(time.perf_counter() - started)
    return samples


async def measure(kind: Kind, plane: ControlPlane, kube: AsyncClient,
                  namespace: str) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"start": [], "restart": [], "pod": []}
    for _ in range(NODE_RUNS):
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-bn-", dir="/tmp"))
        node = kind(node_name=f"bn-{uuid.uuid4().hex[:8]}", kubeconfig=plane.kubeconfig,
                    plugin_dir=plugin_dir)
        figures["start"].append(await timed(node.start))
        await node.stop(delete_node=True)
        shutil.rmtree(plugin_dir, ignore_errors=True)

    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-bn-", dir="/tmp"))
    node = kind(node_name=f"bn-{uuid.uuid4().hex[:8]}", kubeconfig=plane.kubeconfig,
                plugin_dir=plugin_dir)
    await node.start()
    plugin = TestPlugin(plugin_dir=plugin_dir,
                        resource_name=f"bench.edgeplug.io/d-{node.node_name}",
                        devices={f"d{i}": HEALTHY for i in range(POD_RUNS)})

    def pod_for(name: str) -> Pod:
        return cast(Pod, Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node.node_name, "containers": [{
                "name": "main", "image": "registry.invalid/pause:1",
                "resources": {"limits": {plugin.resource_name: "1"}}}]}}))

    try:
        await plugin_figures(kube, namespace, node.node_name, plugin, node.restart_kubelet,
                             pod_for, figures)
    finally:
        await plugin.stop()
        await node.stop(delete_node=True)
        shutil.rmtree(plugin_dir, ignore_errors=True)
    return figures


async def plugin_figures(
    kube: AsyncClient, namespace: str, node_name: str, plugin: TestPlugin,
    restart_kubelet: Callable[[], Awaitable[Any]], pod_for: Callable[[str], Pod],
    figures: dict[str, list[float]],
) -> None:
    """The "restart" and "pod" figures on a started node (any kind) with ``plugin``: the
    kubelet restarted until the plugin's devices are allocatable again, and ``pod_for(name)``
    created until Running, each ``RESTART_RUNS`` / ``POD_RUNS`` times."""
    await plugin.start()
    await wait_allocatable(kube, node_name, plugin.resource_name, str(POD_RUNS))
    for _ in range(RESTART_RUNS):
        async def restart() -> None:
            await restart_kubelet()
            await plugin.stop()
            await plugin.start()
            await wait_allocatable(kube, node_name, plugin.resource_name, str(POD_RUNS))
        figures["restart"].append(await timed(restart))
    for index in range(POD_RUNS):
        name = f"p{index}-{node_name}"

        async def run_pod(name: str = name) -> None:
            await kube.create(pod_for(name))
            await wait_pod(kube, namespace, name, lambda p: in_phase(p, "Running"), "Running")
        figures["pod"].append(await timed(run_pod))


@contextlib.asynccontextmanager
async def bench_namespace(plane: ControlPlane) -> AsyncIterator[tuple[AsyncClient, str]]:
    """A client and a namespace of its own (with its ServiceAccount), deleted after."""
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    plane.kubectl("create", "namespace", namespace)
    try:
        await wait_service_account(kube, namespace)
        yield kube, namespace
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        await kube.close()


def print_figures(label: str, figures: dict[str, list[float]], *, start: str) -> None:
    print(summary(f"{label}: {start}", figures["start"]), flush=True)
    print(summary(f"{label}: kubelet restart until a plugin's devices are allocatable",
                  figures["restart"]), flush=True)
    print(summary(f"{label}: pod bound to the node, created to Running", figures["pod"]),
          flush=True)


async def measure_all(plane: ControlPlane) -> None:
    async with bench_namespace(plane) as (kube, namespace):
        for label, kind in KINDS.items():
            print_figures(label, await measure(kind, plane, kube, namespace),
                          start="node start (Node posted, kubelet.sock served)")


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    print(machine_speed_line())
    planes = plane_starts()
    print(summary("control plane start (etcd, API server, scheduler, controller-manager)",
                  planes), flush=True)
    with ControlPlane() as plane:
        asyncio.run(measure_all(plane))
    print(f"harness start, control plane + one node: median control plane "
          f"{statistics.median(planes):.2f} s plus the node start above")
