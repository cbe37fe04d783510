"""How long a separated Ascend chip takes to move its pod: fault → the workload's new pod Running.

Chip fault → pod moved, measured. A real control plane (its
scheduler and controller-manager: the Deployment and Job controllers), the kubelet's own device
manager and pod-resources (``DeviceNode``) and the agent in this process with the DCMI stand-in
(Huawei's C ABI) for four chips, ``healthPollSeconds: 1``. Each run: the workload's one pod
runs on a chip; the chip gets a ``SeparateNPU`` code at a different point of the poll cycle;
the time until a new pod of the workload is Running (on another chip) is taken; the chip is
cleared. The floor, measured in the same run: the same workload's pod evicted by the bench
itself (no fault), until its replacement is Running: what Kubernetes alone takes to replace
an evicted pod. A Deployment and a Job (whose controller backs off before replacing a failed
pod) are measured apart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from agent.main import run_agent
from agent.settings import AgentSettings
from tests.bench.stats import floor_ratio_line, machine_speed_line, summary
from tests.harness.agent_process import api_client
from tests.harness.ascend_node import LEVEL_CODES, AscendNode, build_dcmi_library, chips_910b
from tests.harness.controller_process import apply
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import allocatable, wait_service_account

CHIPS = 4
RUNS = 5
POLL_S = 1.0
RESOURCE = "huawei.com/Ascend910"
LOOK_S = 0.05
DEADLINE_S = 90.0
LABEL = "bench-workload"


def _workload(kind: str, name: str, namespace: str) -> dict[str, Any]:
    container = {"name": "train", "image": "ascendhub.huawei.com/train:1",
                 "resources": {"limits": {RESOURCE: "1"}}}
    spec: dict[str, Any] = {"containers": [container]}
    template = {"metadata": {"labels": {LABEL: name}}, "spec": spec}
    meta = {"name": name, "namespace": namespace}
    if kind == "Job":
        spec["restartPolicy"] = "Never"
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                "spec": {"backoffLimit": 6, "template": template}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "selector": {"matchLabels": {LABEL: name}},
                     "template": template}}


async def _running(kube: AsyncClient, namespace: str, workload: str, other_than: str = ""
                   ) -> str:
    """The name of the workload's Running pod (not ``other_than``), once there is one."""
    deadline = time.perf_counter() + DEADLINE_S
    while True:
        async for pod in kube.list(Pod, namespace=namespace, labels={LABEL: workload}):
            meta, status = pod.metadata, pod.status
            if (meta and meta.name and meta.name != other_than and not meta.deletionTimestamp
                    and status and status.phase == "Running"):
                return meta.name
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no Running pod of {workload}")
        await asyncio.sleep(LOOK_S)


async def _chips_back(kube: AsyncClient, node: str) -> None:
    """Every chip healthy again (the Node's allocatable counts them, used or not)."""
    deadline = time.perf_counter() + DEADLINE_S
    while await allocatable(kube, node, RESOURCE) != str(CHIPS):
        if time.perf_counter() > deadline:
            raise TimeoutError("the chip never came back")
        await asyncio.sleep(LOOK_S)


async def bench(plane: ControlPlane, host: AscendNode, kind: str) -> tuple[list[float],
                                                                           list[float]]:
    name = f"npu-{uuid.uuid4().hex[:6]}"
    namespace = f"bench-{name}"
    plane.kubectl("create", "namespace", namespace)
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-mv-", dir="/tmp"))
    sockets = Path(tempfile.mkdtemp(prefix="ep-mv-pr-", dir="/tmp"))
    emulator = DeviceNode(node_name=name, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
                          pod_resources_socket=sockets / "kubelet.sock")
    kube = api_client(plane)
    await emulator.start()
    agent = asyncio.create_task(run_agent(AgentSettings(
        node_name=name, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
        pod_resources_socket=sockets / "kubelet.sock", namespace=namespace)))
    moved: list[float] = []
    floor: list[float] = []
    try:
        await wait_service_account(kube, namespace)
        apply(plane, {
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
            "metadata": {"name": "npu", "namespace": namespace},
            "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails":
                                          host.details(healthPollSeconds=POLL_S)},
                     "capacity": 1, "resourceName": RESOURCE}})
        await _chips_back(kube, name)
        for run in range(RUNS):
            # A Job backs off longer after each failed pod: one Job per measurement.
            workload = "train" if kind == "Deployment" else f"train-{run}"
            apply(plane, _workload(kind, workload, namespace))
            pod = await _running(kube, namespace, workload)
            [allocation] = emulator.allocations(namespace, pod)
            chip = int(allocation.envs["ASCEND_VISIBLE_DEVICES"])
            await asyncio.sleep(POLL_S * ((run * 0.37) % 1.0))  # any point of the poll
            started = time.perf_counter()
            host.fault(chip, errors=(LEVEL_CODES["SeparateNPU"],))
            pod = await _running(kube, namespace, workload, other_than=pod)
            moved.append(time.perf_counter() - started)
            host.clear(chip)
            await _chips_back(kube, name)
            if kind == "Job":
                workload = f"floor-{run}"
                apply(plane, _workload(kind, workload, namespace))
                pod = await _running(kube, namespace, workload)
            started = time.perf_counter()
            await kube.create(Pod.Eviction(metadata=ObjectMeta(name=pod, namespace=namespace)),
                              pod, namespace=namespace)
            await _running(kube, namespace, workload, other_than=pod)
            floor.append(time.perf_counter() - started)
            if kind == "Job":
                for job in (f"train-{run}", f"floor-{run}"):
                    plane.kubectl("delete", "job", job, "-n", namespace,
                                  "--cascade=foreground", "--wait=true")
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        await emulator.stop(delete_node=True)
        await kube.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)
    return moved, floor


def main(argv: Sequence[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    for name in ("tests.harness", "discovery_handlers.ascend", "agent"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(machine_speed_line(), f"load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-moves-") as tmp:
        library = build_dcmi_library(Path(tmp) / "lib")
        host = AscendNode(Path(tmp) / "host", chips_910b(CHIPS, per_card=2), library=library)
        os.environ.update(host.env)
        with ControlPlane() as plane:
            plane.apply_crds()
            for kind in ("Deployment", "Job"):
                print(f"{kind}: SeparateNPU → the new pod Running, poll {POLL_S:g} s "
                      f"(n={RUNS})", flush=True)
                moved, floor = asyncio.run(bench(plane, host, kind))
                print("  " + summary("chip separated → new pod Running", moved, "s", 1.0))
                print(floor_ratio_line("pod evicted by hand → new pod Running", moved, floor))
    print(f"load {os.getloadavg()[0]:.1f}", flush=True)
