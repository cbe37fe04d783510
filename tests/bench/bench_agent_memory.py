"""The agent's resident memory with 200 Instances and their plugins, and what dominates it.

The agent runs on every node, small gateways included; its target is 64 MiB, below Akri's
own limit (79 MiB). ``run`` starts ``python -m agent.main``
against the real API server and the node emulator, grows a debugEcho Configuration from 1 to
200 devices (capacity 1), waits until 200 Instances exist and 200 Instance plugins plus the
configuration-level one are registered, then reads VmRSS/VmHWM from ``/proc/<pid>/status``; it
also measures what importing each big dependency costs in a fresh interpreter. ``bench_agent``
calls ``run``; ``main`` runs only this part.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.bench_agent_setup import (
    DAEMONSET_SETTINGS,
    BenchNode,
    bench_node,
    daemonset_env,
    quiet_logs,
)
from tests.harness.agent_process import apply, debug_echo_configuration
from tests.harness.controlplane import ControlPlane

INSTANCES = 200
#: Reads of /proc/<pid>/status per figure, and the pause between them (sampling, not a wait).
MEMORY_READS = 5
MEMORY_READ_INTERVAL_S = 1.0
READY_DEADLINE_S = 180.0
#: The targets: with one Configuration (one device), with 200 devices (Akri's limit is
#: 79 MiB), and per Instance with its plugin.
TARGET_ONE_MIB = 45
TARGET_MIB = 64
TARGET_PER_INSTANCE_KIB = 85
#: Modules whose import cost is measured, each in a fresh interpreter; the last rows are
#: cumulative (everything the agent process imports to serve debugEcho devices).
IMPORTS: tuple[tuple[str, str], ...] = (
    ("yaml", "import yaml"),
    ("prometheus_client", "import prometheus_client"),
    ("protobuf + kubelet API messages", "from agent.kubeletapi import deviceplugin_v1beta1_pb2"),
    ("grpc + grpc.aio", "import grpc, grpc.aio"),
    ("kubelet API stubs (grpc + protobuf)",
     "import grpc.aio; from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc"),
    ("lightkube", "import lightkube; from lightkube.resources import core_v1"),
    ("lightkube + prometheus_client + yaml",
     "import lightkube, prometheus_client, yaml; from lightkube.resources import core_v1"),
    ("agent discovery side (agent.main)", "import agent.main"),
    ("agent with device plugins + debugEcho",
     "import agent.main, agent.deviceplugins.slots.service, discovery_handlers.debug_echo"),
)
_RSS_PROBE = """
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
before = rss()
{statement}
print(before, rss())
"""


def _status_kib(pid: int) -> dict[str, int]:
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                values[key] = int(rest.split()[0])
    return values


async def _read_memory(pid: int, label: str, *, target: int) -> float:
    """Print the median of several reads; return the median VmRSS in KiB."""
    reads = []
    for _ in range(MEMORY_READS):
        reads.append(_status_kib(pid))
        await asyncio.sleep(MEMORY_READ_INTERVAL_S)

    def median_mib(key: str) -> float:
        return statistics.median(r[key] for r in reads) / 1024

    print(f"  {label}: VmRSS median {median_mib('VmRSS'):.1f} MiB "
          f"(min {min(r['VmRSS'] for r in reads) / 1024:.1f}, "
          f"max {max(r['VmRSS'] for r in reads) / 1024:.1f}), "
          f"VmHWM {median_mib('VmHWM'):.1f} MiB, RssAnon {median_mib('RssAnon'):.1f}, "
          f"RssFile {median_mib('RssFile'):.1f}, threads {reads[-1]['Threads']} "
          f"(n={len(reads)} reads) [target ≤ {target} MiB]", flush=True)
    return float(statistics.median(r["VmRSS"] for r in reads))


async def _ready(node: BenchNode, count: int) -> float:
    started = time.monotonic()
    state = node.state
    await state.until(lambda: len(state.instances) >= count,
                      what=f"{count} Instances", deadline=READY_DEADLINE_S)
    await node.emulator.wait_for(lambda: len(node.resources()) >= count + 1,
                                 timeout=READY_DEADLINE_S,
                                 what=f"{count} Instance plugins + 1 configuration plugin")
    return time.monotonic() - started


async def _traced(plane: ControlPlane, out: Path) -> None:
    async with bench_node(plane, label="trc", trace_out=out) as node:
        names = [f"m{i:03d}" for i in range(INSTANCES)]
        apply(plane, node.namespace, debug_echo_configuration("mem", descriptions=names))
        await _ready(node, INSTANCES)
        os.kill(node.pid, signal.SIGUSR1)
        await node.emulator.wait_for(out.exists, timeout=READY_DEADLINE_S,
                                     what="the traced agent's allocation list")


async def _agent_memory(plane: ControlPlane) -> None:
    async with bench_node(plane, label="mem", pod_resources=True, env=daemonset_env()) as node:
        print(f"  the agent runs as the DaemonSet runs it: {DAEMONSET_SETTINGS}", flush=True)
        names = [f"m{i:03d}" for i in range(INSTANCES)]
        apply(plane, node.namespace, debug_echo_configuration("mem", descriptions=names[:1]))
        await _ready(node, 1)
        one = await _read_memory(node.pid, "1 Configuration, 1 Instance, 2 plugins",
                                 target=TARGET_ONE_MIB)
        apply(plane, node.namespace, debug_echo_configuration("mem", descriptions=names))
        took = await _ready(node, INSTANCES)
        print(f"  (200 Instances and {len(node.resources())} plugins ready {took:.1f} s "
              "after the Configuration grew)")
        many = await _read_memory(node.pid, f"{INSTANCES} Instances, "
                                  f"{len(node.resources())} plugins", target=TARGET_MIB)
        print(f"  per Instance with its plugin: {(many - one) / (INSTANCES - 1):.0f} KiB "
              f"[target < {TARGET_PER_INSTANCE_KIB} KiB]", flush=True)


def _import_costs() -> None:
    for label, statement in IMPORTS:
        out = subprocess.run([sys.executable, "-c", _RSS_PROBE.format(statement=statement)],
                             check=True, capture_output=True, text=True).stdout.split()
        before, after = int(out[0]), int(out[1])
        print(f"  import {label}: +{(after - before) / 1024:.1f} MiB "
              f"(interpreter {before / 1024:.1f} → {after / 1024:.1f} MiB)", flush=True)


def run(plane: ControlPlane, *, trace: bool = False) -> None:
    """Memory of a running agent (control plane already started, CRDs applied), then imports;
    with ``trace``, also a second agent under tracemalloc (slower, so not by default)."""
    print(f"4. agent resident memory, {INSTANCES} Instances (capacity 1)", flush=True)
    asyncio.run(_agent_memory(plane))
    print("   import cost in a fresh interpreter (VmRSS after - before)", flush=True)
    _import_costs()
    if trace:
        print(f"   tracemalloc in a second agent with {INSTANCES} Instances", flush=True)
        out = Path(f"/tmp/edgeplug-trace-{os.getpid()}.txt")
        try:
            asyncio.run(_traced(plane, out))
            print("\n".join("   " + line for line in out.read_text(encoding="utf-8").splitlines()))
        finally:
            out.unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """Part of ``bench_agent`` (which calls ``run``); a full ``python -m tests.bench`` runs it
    there, so this entry point only says so."""
    if "--run" in argv:
        quiet_logs()
        with ControlPlane() as plane:
            plane.apply_crds()
            run(plane, trace="--tracemalloc" in argv)
        return
    print("runs under bench_agent (alone: python -m tests.bench.bench_agent_memory --run "
          "[--tracemalloc])")


if __name__ == "__main__":
    main(sys.argv[1:])
