"""``python -m tests.bench shared_modes``: a shared device in each allocation mode on the real
node (kubelet, containerd, runc): the DRA default against the device-plugin compatibility mode.

What the one-allocator default costs beside the protocol it replaces, measured the same way in one
run. Per mode and run, a fresh namespace and a shared debugEcho device of capacity 2 with a broker:
Configuration applied → broker Running; a pod asking for ``edgeplug.io/<configuration>: 1`` →
Running (the second slot); a third pod waits; the second is deleted → the waiting pod Running (the
hand-off, on one node here: the cross-node figures are tests/faults'); the agent's own Allocate or
prepare time from its ``/metrics``; its RSS and idle CPU. The floor: a plain busybox pod (no device)
created → Running on the same node, in the same run. Medians over the runs; nothing is asserted.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from crds.naming import instance_name
from tests.bench.stats import machine_speed_line
from tests.harness.agent_process import debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess, install_peering_crds
from tests.harness.controlplane import ControlPlane, free_port, running
from tests.harness.kube_waits import wait_service_account
from tests.harness.metrics_scrape import scrape
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import Broker, broker_spec, running_container, start_agent
from tests.harness.realnode_images import BUSYBOX_IMAGE

RUNS = 3
CAPACITY = 2
IDLE_S = 20.0
MODES = ("dra", "devicePlugin")


def _pod(name: str, resource: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sleep", "3600"]}
    if resource:
        container["resources"] = {"limits": {resource: "1"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]}}


def _apply(plane: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    plane.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))


def _running(plane: ControlPlane, ns: str, pod: str) -> bool:
    out = plane.kubectl("get", "pod", pod, "-n", ns, "-o", "json", check=False).stdout
    if not out:
        return False
    statuses = (json.loads(out).get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


async def _until_running(plane: ControlPlane, ns: str, pod: str) -> float:
    started = time.monotonic()

    async def up() -> bool:
        return _running(plane, ns, pod)

    await eventually(up, what=f"pod {pod} Running", deadline=120)
    return time.monotonic() - started




def _mean_of(samples: dict[str, float], histogram: str) -> float | None:
    """Mean of a histogram's observations (sum over count, all label sets)."""
    total = sum(v for k, v in samples.items() if k.startswith(f"{histogram}_sum"))
    count = sum(v for k, v in samples.items() if k.startswith(f"{histogram}_count"))
    return total / count if count else None


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _one_run(plane: ControlPlane, node: RealNode, mode: str, tmp: Path
                   ) -> dict[str, float]:
    ns = f"bm-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    port = free_port()
    cam = instance_name("cams", "cam", shared=True, node=node.node_name)
    broker = Broker(ns, cam, f"{cam}-{node.node_name}-pod", f"agent-{ns}")
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp / f"ctl-{ns}.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    figures: dict[str, float] = {}
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, broker, extra_env={
            "DRA": "on", "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"})
        ctl.start()
        figures["floor"] = await _floor(plane, ns)
        cfg = debug_echo_configuration("cams", descriptions=["cam"], shared=True)
        cfg["spec"]["capacity"] = CAPACITY
        cfg["spec"]["sharedDeviceAllocation"] = mode
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
        started = time.monotonic()
        _apply(plane, ns, cfg)
        await running_container(plane, broker)
        figures["applied_to_broker"] = time.monotonic() - started
        _apply(plane, ns, _pod("second", "edgeplug.io/cams"))
        figures["pod_to_running"] = await _until_running(plane, ns, "second")
        _apply(plane, ns, _pod("third", "edgeplug.io/cams"))
        deleted = time.monotonic()
        plane.kubectl("delete", "pod", "second", "-n", ns, "--wait=false")
        await _until_running(plane, ns, "third")
        figures["handoff"] = time.monotonic() - deleted
        samples = scrape(port)
        for name, histogram in (("allocate", "edgeplug_allocate_duration_seconds"),
                                ("prepare", "edgeplug_dra_prepare_duration_seconds")):
            mean = _mean_of(samples, histogram)
            if mean is not None and mean > 0:
                figures[name] = mean
        pid = node.pid(broker.agent_log)
        before = thread_cpu_ns(pid)
        await asyncio.sleep(IDLE_S)  # measuring idle CPU: the wait is the measurement
        idle_cpu = cpu_seconds_between(before, thread_cpu_ns(pid))
        figures["idle_cpu_per_min"] = idle_cpu * 60.0 / IDLE_S
        figures["rss_mib"] = _rss_mib(pid)
    finally:
        ctl.stop()
        node.stop_process(broker.agent_log)
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await kube.close()
    return figures


async def _floor(plane: ControlPlane, ns: str) -> float:
    _apply(plane, ns, _pod("floor", None))
    took = await _until_running(plane, ns, "floor")
    plane.kubectl("delete", "pod", "floor", "-n", ns, "--wait=false")
    return took


async def _bench(tmp: Path) -> None:
    with running() as plane:
        install_peering_crds(plane)
        node = RealNode(plane, node_name=f"bench-{uuid.uuid4().hex[:6]}")
        node.start()
        try:
            results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            for _ in range(RUNS):
                for mode in MODES:  # interleaved: a slow spell of the machine hits both
                    results[mode].append(await _one_run(plane, node, mode, tmp))
            _report(results)
        finally:
            node.cleanup()


def _report(results: dict[str, list[dict[str, float]]]) -> None:
    rows = (("floor: plain pod created → Running", "floor", "s", 1.0),
            ("Configuration applied → broker Running", "applied_to_broker", "s", 1.0),
            ("pod asking edgeplug.io/<configuration> → Running", "pod_to_running", "s", 1.0),
            ("slot's pod deleted → waiting pod Running (one node)", "handoff", "s", 1.0),
            ("Allocate (device plugin), mean", "allocate", "ms", 1000.0),
            ("prepare (DRA claim), mean", "prepare", "ms", 1000.0),
            ("agent idle CPU", "idle_cpu_per_min", "s/min", 1.0),
            ("agent RSS", "rss_mib", "MiB", 1.0))
    print(f"  medians of {RUNS} runs per mode, real node, capacity {CAPACITY}")
    print(f"  {'figure':<52} {'dra (default)':>14} {'devicePlugin':>14}")
    for label, key, unit, scale in rows:
        cells = []
        for mode in MODES:
            values = [r[key] for r in results[mode] if key in r]
            cells.append(f"{statistics.median(values) * scale:.3f} {unit}" if values else "—")
        print(f"  {label:<52} {cells[0]:>14} {cells[1]:>14}")


def main(argv: list[str]) -> None:
    del argv
    print(machine_speed_line())
    with tempfile.TemporaryDirectory(prefix="bench-modes-") as tmp:
        asyncio.run(_bench(Path(tmp)))
