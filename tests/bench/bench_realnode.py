"""What a real node costs beside ``devicenode``: start, kubelet restart, a pod to Running.

The broker tests run on a real node (the kubelet itself, containerd 2,
runc, CNI: tests/harness/realnode.py), and ``devicenode`` stays for scale; this says what each
costs, measured the same way in one run (bench_devicenode's three figures): a node's start
(real node: until the Node is Ready, images imported), a kubelet restart until a test plugin's
devices are allocatable again, and a pod bound to the node from creation to Running (real node:
a sandbox and a busybox container really started). Nothing is asserted.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from functools import partial
from typing import cast

import grpc
import grpc.aio
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from tests.bench.bench_devicenode import (
    HEALTHY,
    POD_RUNS,
    bench_namespace,
    measure,
    plugin_figures,
    print_figures,
    timed,
)
from tests.bench.stats import machine_speed_line
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.realnode import RealNode
from tests.harness.realnode_images import BUSYBOX_IMAGE
from tests.harness.testplugin import TestPlugin

START_RUNS = 4
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


class EnvPlugin(TestPlugin):
    """The test plugin answering env only: its mounts' host paths (/srv/test/...) do not exist
    here, and a real runtime, unlike devicenode, would fail the container on them."""

    __test__ = False

    async def Allocate(
        self, request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        del context
        return pb.AllocateResponse(container_responses=[
            pb.ContainerAllocateResponse(envs={"TEST_DEVICES": ",".join(c.devices_ids)})
            for c in request.container_requests])


def _pod(name: str, namespace: str, node: str, resource: str) -> Pod:
    return cast(Pod, Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sleep", "3600"], "resources": {"limits": {resource: "1"}}}]}}))


async def measure_real(plane: ControlPlane, kube: AsyncClient,
                       namespace: str) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"start": [], "restart": [], "pod": []}
    for _ in range(START_RUNS):
        fresh = RealNode(plane, node_name=f"br-{uuid.uuid4().hex[:8]}")
        figures["start"].append(await timed(partial(asyncio.to_thread, fresh.start)))
        fresh.cleanup()
    node = RealNode(plane, node_name=f"br-{uuid.uuid4().hex[:8]}")
    node.start()
    plugin = EnvPlugin(plugin_dir=node.host_path(PLUGIN_DIR),
                        resource_name=f"bench.edgeplug.io/d-{node.node_name}",
                        devices={f"d{i}": HEALTHY for i in range(POD_RUNS)})
    try:
        await plugin_figures(
            kube, namespace, node.node_name, plugin, partial(asyncio.to_thread,
                                                             node.restart_kubelet),
            lambda name: _pod(name, namespace, node.node_name, plugin.resource_name), figures)
    finally:
        await plugin.stop()
        node.cleanup()
    return figures


async def measure_both(plane: ControlPlane) -> None:
    async with bench_namespace(plane) as (kube, namespace):
        for label, figures in (("devicenode", await measure(DeviceNode, plane, kube, namespace)),
                               ("real node", await measure_real(plane, kube, namespace))):
            print_figures(label, figures, start="node start")


def main(argv: list[str]) -> None:
    del argv
    logging.basicConfig(level=logging.WARNING)
    print(machine_speed_line())
    with ControlPlane() as plane:
        asyncio.run(measure_both(plane))
