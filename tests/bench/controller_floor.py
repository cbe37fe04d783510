"""The floor of the controller's scale run: the same pinned pods, created by a bare client.

"last broker N s after the last Instance" on a shared 2-core machine is mostly the API server's,
the scheduler's and the emulated kubelets' work. This run gives that work alone: the same
control plane, the same emulated nodes (``controller_cluster``: heart-beats, one device per pod
advertised, every bound pod reported Running) and the same broker pods, rendered by the
controller's own ``render_broker_pod`` for the same Configuration, Instance names and nodes,
created by this process (as many at once as the scale run creates Instances) with no controller
and no agent. Its figure, "last pod Running after the last create", is the floor of the scale
run's "last broker after the last Instance" (created, and Running).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.codecs import from_dict

from controller.brokers.render import render_broker_pod
from crds.configuration import Configuration
from crds.instance import Instance
from tests.bench.controller_cluster import placement, start_kubelets
from tests.bench.controller_measure import PodWatch
from tests.harness.controller_process import broker_pod_spec, configuration, instance
from tests.harness.controlplane import ControlPlane


def bare_pods(namespace: str, cfg: str, nodes: int, instances: int) -> list[dict[str, Any]]:
    """The broker pods the controller would create for the scale run's Instances, without the
    owner reference (no Instance exists to own them)."""
    config = Configuration.from_object(
        {**configuration(namespace, cfg, pod_spec=broker_pod_spec()),
         "metadata": {"name": cfg, "namespace": namespace, "generation": 1}})
    pods = []
    for name, node in placement(cfg, nodes, instances):
        obj = instance(namespace, name, configuration_name=cfg, nodes=[node], shared=False)
        obj["metadata"]["uid"] = f"floor-{name}"
        pod = render_broker_pod(configuration=config, instance=Instance.from_object(obj),
                                node=node)
        del pod["metadata"]["ownerReferences"]
        pods.append(pod)
    return pods


async def floor_run(nodes: int, instances: int, *, concurrency: int,
                    timeout_s: float) -> dict[str, float]:
    """One floor run on a fresh control plane: ``created_s`` (the creates), ``running_lag_s``
    (last pod Running after the last create), ``all_running_s`` (first create → last pod
    Running) and ``create_rate``."""
    namespace, cfg = "bench-scale", "scale"
    pods = bare_pods(namespace, cfg, nodes, instances)
    with ControlPlane() as plane:
        plane.kubectl("create", "namespace", namespace)
        kubelets = start_kubelets(plane, namespace, cfg, nodes, instances)
        client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
        watch = PodWatch(client, namespace)
        limit = asyncio.Semaphore(concurrency)

        async def create(pod: dict[str, Any]) -> None:
            async with limit:
                await client.create(from_dict(pod))

        try:
            await watch.start()
            start = time.monotonic()
            await asyncio.gather(*(create(pod) for pod in pods))
            created_at = time.monotonic()
            last_running = await watch.last_of(watch.running, instances, what="Running",
                                               timeout_s=timeout_s)
        finally:
            await watch.stop()
            await client.close()
            kubelets.terminate()
            kubelets.wait()
    return {"created_s": created_at - start, "create_rate": instances / (created_at - start),
            "running_lag_s": max(0.0, last_running - created_at),
            "all_running_s": last_running - start}
