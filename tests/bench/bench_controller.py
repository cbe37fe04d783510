"""The controller's speed: Instance → broker pod latency, and a parameterised scale run.

Why this exists: issue 4's targets (Instance created → broker pod created, median ≤ 0.5 s;
Instance deleted → broker deleted, median ≤ 1 s; N nodes x M Instances converge ≤ 120 s in
≤ 300 MiB, no writes in steady state) are met in benchmarks, never in pass/fail tests. It runs the
real controller (``python -m controller.main``, its own process) against a real control plane,
times API watch events seen by this process, and prints medians; nothing here asserts a timing.

``python -m tests.bench.bench_controller --runs 20 --nodes 100 --instances 10000`` runs the full
scale; the defaults (run by ``make bench``) are a smaller, cheap scale run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod

from controller import naming
from controller.kube import InstanceResource
from tests.bench.stats import summary
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    configuration,
    ensure_nodes,
    install_peering_crds,
    instance,
)
from tests.harness.controlplane import ControlPlane

DEFAULT_RUNS = 20
DEFAULT_NODES = 10
DEFAULT_INSTANCES = 500
#: Instances created concurrently during the scale run.
CREATE_CONCURRENCY = 32
#: How long the steady state is watched for writes (covers several resync intervals).
STEADY_WATCH_S = 25.0
RESYNC_S = "30"
PENDING_GRACE_S = "3600"
#: The controller counts as settled after this long without a write.
QUIET_S = 3.0
EVENT_TIMEOUT_S = 30.0
CONVERGE_TIMEOUT_S = 900.0
POLL_S = 0.05
_WRITE = re.compile(r"HTTP Request: (POST|PATCH|PUT|DELETE) ")
_REQUEST = re.compile(r"HTTP Request: ")


class PodWatch:
    """Records when each broker pod was first seen and when it was seen deleted."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        selector: dict[str, Any] = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
        async for kind, pod in self.client.watch(
            Pod, namespace=self.namespace, labels=selector
        ):
            assert pod.metadata is not None
            name = str(pod.metadata.name)
            now = time.monotonic()
            if kind == "DELETED":
                self.deleted.setdefault(name, now)
            else:
                self.added.setdefault(name, now)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def wait(self, table: dict[str, float], name: str) -> float:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while name not in table:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no watch event for pod {name}")
            await asyncio.sleep(POLL_S / 10)
        return table[name]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def count(pattern: re.Pattern[str], text: str) -> int:
    return len(pattern.findall(text))


async def latency(client: AsyncClient, namespace: str, cfg: str, runs: int) -> None:
    watch = PodWatch(client, namespace)
    watch.start()
    created: list[float] = []
    deleted: list[float] = []
    try:
        await asyncio.sleep(1.0)  # let the watch open (not a synchronisation for a result)
        for run in range(runs):
            name = f"{cfg}-{run:06x}"
            pod = naming.broker_pod_name(name, "n-1")
            obj = instance(namespace, name, configuration_name=cfg, nodes=["n-1"])
            start = time.monotonic()
            await client.create(from_dict(obj))
            created.append(await watch.wait(watch.added, pod) - start)
            start = time.monotonic()
            await client.delete(InstanceResource, name, namespace=namespace)
            deleted.append(await watch.wait(watch.deleted, pod) - start)
    finally:
        await watch.stop()
    print(summary("Instance created → broker pod created", created), flush=True)
    print(summary("Instance deleted → broker pod deleted", deleted), flush=True)


async def quiesce(ctl: ControllerProcess) -> float:
    """Seconds until the controller has written nothing for ``QUIET_S`` (status catching up,
    late watch events answered with 409s)."""
    start = last_change = time.monotonic()
    writes = count(_WRITE, ctl.log_path.read_text(errors="replace"))
    while time.monotonic() - last_change < QUIET_S:
        await asyncio.sleep(POLL_S * 10)
        now = count(_WRITE, ctl.log_path.read_text(errors="replace"))
        if now != writes:
            writes, last_change = now, time.monotonic()
        if time.monotonic() - start > CONVERGE_TIMEOUT_S:
            break
    return last_change - start


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scale(
    client: AsyncClient, ctl: ControllerProcess, namespace: str, cfg: str, nodes: int,
    instances: int,
) -> None:
    node_names = [f"scale-node-{i:03d}" for i in range(nodes)]
    ensure_nodes(ctl.plane, node_names)
    log_before = ctl.log_path.read_text(errors="replace")
    requests_before = count(_REQUEST, log_before)
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    # Brokers are counted from a watch: listing 10,000 pods every second would load the API
    # server (and this process) more than the controller under test.
    watch = PodWatch(client, namespace)
    watch.start()
    # Each Instance is seen by one node (local devices), spread evenly over the nodes.

    async def create(i: int) -> None:
        obj = instance(namespace, f"{cfg}-{i:06x}", configuration_name=cfg,
                       nodes=[node_names[i % nodes]], shared=False)
        async with limit:
            await client.create(from_dict(obj))

    cpu_before = cpu_s(ctl.pid)
    start = time.monotonic()
    await asyncio.gather(*(create(i) for i in range(instances)))
    created_at = time.monotonic()
    created_s = created_at - start
    peak = 0.0
    deadline = start + CONVERGE_TIMEOUT_S
    while len(watch.added) < instances:
        peak = max(peak, rss_mib(ctl.pid))
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(watch.added)}/{instances} brokers after {CONVERGE_TIMEOUT_S}s"
            )
        await asyncio.sleep(POLL_S)
    last_broker = max(watch.added.values())
    converge_s = last_broker - start
    cpu_converge = cpu_s(ctl.pid) - cpu_before
    await watch.stop()
    log_after = ctl.log_path.read_text(errors="replace")
    requests = count(_REQUEST, log_after) - requests_before
    settle_s = await quiesce(ctl)
    steady_from = len(ctl.log_path.read_text(errors="replace"))
    steady_cpu = cpu_s(ctl.pid)
    # Steady state: nothing should be written any more, over several resync intervals.
    await asyncio.sleep(STEADY_WATCH_S)
    steady = ctl.log_path.read_text(errors="replace")[steady_from:]
    steady_cpu = cpu_s(ctl.pid) - steady_cpu
    print(f"scale {nodes} nodes x {instances} Instances: created in {created_s:.1f} s, "
          f"every broker in {converge_s:.1f} s (last broker "
          f"{max(0.0, last_broker - created_at):.1f} s after the last Instance); controller CPU "
          f"{cpu_converge:.1f} s until then; controller RSS {rss_mib(ctl.pid):.0f} MiB "
          f"(peak sampled {peak:.0f} MiB); {requests / instances:.2f} controller API "
          f"requests per Instance (until every broker exists; Events, posted by kopf, not "
          f"counted); settled {settle_s:.1f} s later; writes in the {STEADY_WATCH_S:.0f} s "
          f"after: {count(_WRITE, steady)} (controller CPU {steady_cpu:.1f} s)", flush=True)


async def bench(runs: int, nodes: int, instances: int) -> None:
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        install_peering_crds(plane)
        namespace, scale_ns = "bench-latency", "bench-scale"
        for ns in (namespace, scale_ns):
            plane.kubectl("create", "namespace", ns)
        ctl = ControllerProcess(
            plane, namespaces=[namespace, scale_ns], log_path=Path(tmp) / "ctl.log",
            # The scale run's brokers stay Pending (no kubelet serves their devices); they must
            # not be recreated for being Pending while the steady state is measured.
            extra_args=("--resync-interval", RESYNC_S, "--standalone",
                        "--pending-grace", PENDING_GRACE_S),
        ).start()
        client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
        try:
            apply(plane, configuration(namespace, "lat", pod_spec=broker_pod_spec()))
            apply(plane, configuration(scale_ns, "scale", pod_spec=broker_pod_spec()))
            await latency(client, namespace, "lat", runs)
            if instances > 0:
                await scale(client, ctl, scale_ns, "scale", nodes, instances)
        finally:
            await client.close()
            ctl.stop()


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_controller")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    parser.add_argument("--instances", type=int, default=DEFAULT_INSTANCES)
    args: Any = parser.parse_args(list(argv))
    asyncio.run(bench(args.runs, args.nodes, args.instances))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
