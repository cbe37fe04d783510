"""Kubelets for the controller's scale benchmark: emulated nodes on which brokers really run.

A real cluster's brokers are scheduled, admitted and Running, and its nodes heart-beat; a
benchmark whose brokers all stay unschedulable (no node offers their devices) measures a cluster
nobody runs. This module, run as its own process (``python -m tests.bench.controller_cluster``),
keeps N emulated Nodes alive through the test harness's ``NodeReporter`` (Node status and Lease
heartbeats, as a kubelet does), each advertising one ``edgeplug.io/<instance>`` device per
Instance the benchmark will place on it, so the real scheduler binds each broker to its node;
and it stands in for those kubelets' pod admission by reporting every bound broker Running and
Ready (as a kubelet does once its containers started). No device plugin is called: the
controller never sees Allocate, only the pods' statuses.

It runs apart from the benchmark so its API writes do not delay the benchmark's own watch
timestamps; it prints ``ready`` once every Node is up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from controller import naming
from crds.naming import instance_resource_name
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.kubelet_node import NodeReporter

#: Pod status writes in flight at once (a kubelet per node writes its own; 100 nodes' worth).
STATUS_WRITES: Final = 16
#: Wait between attempts after a failed watch.
WATCH_RETRY_S: Final = 0.5
FIELD_MANAGER: Final = "edgeplug-bench-kubelet"
KUBELETS_READY_TIMEOUT_S: Final = 120.0


def node_names(nodes: int) -> list[str]:
    return [f"scale-node-{i:03d}" for i in range(nodes)]


def placement(cfg: str, nodes: int, instances: int) -> list[tuple[str, str]]:
    """(Instance, node) for each Instance of the scale run: one node each, spread evenly."""
    names = node_names(nodes)
    return [(f"{cfg}-{i:06x}", names[i % nodes]) for i in range(instances)]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_status(pod: Pod) -> dict[str, Any]:
    """What a kubelet reports once every container of ``pod`` started."""
    now = _now()
    assert pod.spec is not None
    containers = [
        {"name": c.name, "image": c.image or "", "imageID": "", "ready": True,
         "restartCount": 0, "started": True, "state": {"running": {"startedAt": now}}}
        for c in pod.spec.containers
    ]
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                     "PodScheduled")
    ]
    return {"status": {"phase": "Running", "conditions": conditions, "startTime": now,
                       "containerStatuses": containers, "hostIP": "127.0.0.1",
                       "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}


class PodRunner:
    """Reports every broker pod bound to an emulated node Running, once."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.done: set[str] = set()
        self.limit = asyncio.Semaphore(STATUS_WRITES)
        self.tasks: set[asyncio.Task[None]] = set()

    async def _start(self, pod: Pod) -> None:
        assert pod.metadata is not None
        async with self.limit:
            with contextlib.suppress(ApiError):
                await self.client.patch(
                    Pod.Status, str(pod.metadata.name), running_status(pod),
                    namespace=self.namespace, patch_type=PatchType.STRATEGIC,
                    field_manager=FIELD_MANAGER,
                )

    def _seen(self, pod: Pod) -> None:
        meta, spec, status = pod.metadata, pod.spec, pod.status
        if meta is None or spec is None or not spec.nodeName or meta.deletionTimestamp:
            return
        if (status is not None and status.phase != "Pending") or meta.uid in self.done:
            return
        self.done.add(str(meta.uid))
        task = asyncio.create_task(self._start(pod))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        labels: dict[str, Any] = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
        while True:
            try:
                async for pod in self.client.list(Pod, namespace=self.namespace, labels=labels):
                    self._seen(pod)
                async for op, pod in self.client.watch(Pod, namespace=self.namespace,
                                                       labels=labels):
                    if op != "DELETED":
                        self._seen(pod)
            except Exception as error:  # a benchmark helper: keep going, say why
                print(f"pod runner: {error!r}; retrying", file=sys.stderr, flush=True)
                await asyncio.sleep(WATCH_RETRY_S)


async def serve(kubeconfig: Path, namespace: str, cfg: str, nodes: int, instances: int) -> None:
    client = AsyncClient(KubeConfig.from_file(str(kubeconfig)))
    devices: dict[str, dict[str, int]] = {name: {} for name in node_names(nodes)}
    for instance, node in placement(cfg, nodes, instances):
        devices[node][instance_resource_name(instance)] = 1

    def counts(node: str) -> Mapping[str, int]:
        return devices[node]

    reporters = [
        NodeReporter(client=client, node_name=node, labels={},
                     device_counts=lambda node=node: counts(node))  # type: ignore[misc]
        for node in devices
    ]
    await asyncio.gather(*(reporter.start() for reporter in reporters))
    print("ready", flush=True)
    try:
        await PodRunner(client, namespace).run()
    finally:
        await asyncio.gather(*(r.stop(delete_node=False) for r in reporters),
                             return_exceptions=True)
        await client.close()


def start_kubelets(plane: ControlPlane, namespace: str, cfg: str, nodes: int,
                   instances: int) -> subprocess.Popen[str]:
    """The emulated nodes (their own process); returns once every Node is up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.controller_cluster", "--kubeconfig",
         str(plane.kubeconfig), "--namespace", namespace, "--configuration", cfg,
         "--nodes", str(nodes), "--instances", str(instances)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + KUBELETS_READY_TIMEOUT_S
    while proc.stdout.readline().strip() != "ready":
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the emulated nodes did not start")
    return proc


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="controller_cluster")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--configuration", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--instances", type=int, required=True)
    args: Any = parser.parse_args(list(argv))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.kubeconfig, args.namespace, args.configuration, args.nodes,
                          args.instances))


if __name__ == "__main__":
    main(sys.argv[1:])
