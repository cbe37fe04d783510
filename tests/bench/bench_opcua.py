"""The opcua handler's speed and memory: 500 servers behind one discovery server, and the time
from a server starting to its Instance on a real API server.

The OPC UA handler's targets, met here, never in pass/fail tests:

1. 500 servers registered to one discovery server: time from the start of discovery to the
   complete device list (every server asked for, and checked: connect, session, read
   ``ServerStatus.State``) and the handler process's memory (target ≤ 5 s; Akri polls every
   10 s with a 3 s TCP pre-check per URL, one after another);
2. the same with one hung server among them (accepts, never answers): it must add no more than
   its timeout (``timeoutSeconds``, 2 s here);
3. a server started → its Instance exists on the API server, through the real agent (and the
   node emulator): median and p95 (target ≤ one interval + 0.5 s = 2.5 s with the default 2 s).

The servers live in another process (tests.harness.opcua_farm): a real discovery server, three
real servers and 497 lightweight registrations whose URLs are further paths on those three, so
every check is the full path against a real server. Each run of 1 and 2 is a fresh handler
process (asyncua imported before the clock starts; its import cost is printed apart). Figures
print beside the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name
from tests.bench.instance_times import InstanceTimes, apply_configuration
from tests.bench.stats import floor_ratio_line, machine_speed_line, summary
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator

SERVERS = 500
REAL_SERVERS = 3
RUNS = 5
STEADY_S = 10.0  # how long the steady-state CPU is measured
SAMPLES = 10
TIMEOUT_S = 2.0
INTERVAL_S = 2.0
DEADLINE_S = 120.0


def _last_json_line(*command: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True,
                         check=True, timeout=DEADLINE_S)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _run_handler(url: str, timeout_s: float, steady_s: float = 0.0) -> dict[str, Any]:
    return _last_json_line("tests.harness.opcua_runner", url, str(timeout_s), str(INTERVAL_S),
                           str(steady_s))


def _run_floor(url: str) -> dict[str, Any]:
    """A bare asyncua client's FindServers, then GetEndpoints on every server named
    (``tests.harness.opcua_floor``): the farm's own answer time."""
    floor = _last_json_line("tests.harness.opcua_floor", url)
    if floor["answered"] != floor["servers"]:
        raise AssertionError(f"floor: {floor['answered']} of {floor['servers']} answered")
    return floor


class Farm:
    """The server farm subprocess (tests.harness.opcua_farm)."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.urls: dict[str, Any] = {}

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.harness.opcua_farm", "--servers", str(SERVERS),
            "--real", str(REAL_SERVERS), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        self.urls = await self._line()

    async def command(self, line: str) -> dict[str, Any]:
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())
        await self.process.stdin.drain()
        return await self._line()

    async def _line(self) -> dict[str, Any]:
        assert self.process is not None
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), DEADLINE_S)
        if not raw:
            raise RuntimeError("the server farm ended")
        answer: dict[str, Any] = json.loads(raw)
        return answer

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def _report_lists(label: str, runs: list[dict[str, Any]]) -> None:
    print(summary(label, [r["seconds"] for r in runs], unit="s", scale=1.0))
    print(f"   devices {sorted({r['devices'] for r in runs})}, handler CPU median "
          f"{statistics.median(r['cpu_ms'] for r in runs):.0f} ms, VmRSS median "
          f"{statistics.median(r['rss_kib'] for r in runs) / 1024:.1f} MiB (VmHWM "
          f"{statistics.median(r['hwm_kib'] for r in runs) / 1024:.1f} MiB; after importing "
          f"asyncua, before discovery: {statistics.median(r['base_kib'] for r in runs) / 1024:.1f}"
          f" MiB)", flush=True)


async def _bench_lists(farm: Farm, runs: int) -> None:
    clean, floors = [], []
    for _ in range(runs):  # alternating, so both see the same load
        clean.append(await asyncio.to_thread(_run_handler, farm.urls["lds"], TIMEOUT_S))
        floors.append(await asyncio.to_thread(_run_floor, farm.urls["lds"]))
    imports = [r["import_s"] for r in clean]
    print(f"importing asyncua in the handler process: {statistics.median(imports):.2f} s, "
          f"{statistics.median(r['import_kib'] for r in clean) / 1024:.1f} MiB (once per "
          "process, not in the figures below)")
    _report_lists(f"1. {SERVERS} servers via one discovery server → complete list "
                  "(target ≤ 5 s; Akri: 10 s poll + 3 s pre-check per URL)", clean)
    print(floor_ratio_line(f"a bare asyncua client: FindServers, then GetEndpoints on each of "
                           f"{floors[0]['servers']} servers; the handler also opens a session "
                           "and reads the state", [r["seconds"] for r in clean],
                           [f["seconds"] for f in floors]), flush=True)
    hung = [await asyncio.to_thread(_run_handler, farm.urls["hung_lds"], TIMEOUT_S)
            for _ in range(runs)]
    _report_lists(f"2. the same plus one hung server (timeoutSeconds {TIMEOUT_S:g}; target: "
                  "adds ≤ the timeout)", hung)
    added = statistics.median(r["seconds"] for r in hung) - statistics.median(
        r["seconds"] for r in clean)
    print(f"   the hung server added {added:.2f} s (median to median)", flush=True)
    steady = await asyncio.to_thread(_run_handler, farm.urls["lds"], TIMEOUT_S, STEADY_S)
    print(f"   steady state, {SERVERS} servers each checked every {INTERVAL_S:g} s: handler CPU "
          f"{steady['steady_cpu_per_s'] * 100:.0f}% of one core (over {STEADY_S:g} s)",
          flush=True)


async def _bench_instances(farm: Farm, plane: ControlPlane) -> list[float]:
    """Server started → Instance on the API server, through the real agent."""
    namespace = f"opcua-bench-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    node = "opcua-bench-node"
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
    emulator = NodeEmulator(node_name=node, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir)
    settings = AgentSettings(node_name=node, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
                             pod_resources_socket=None, namespace=namespace)
    apply_configuration(
        plane, namespace, "plcs", "opcua",
        f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{farm.urls['small_lds']}]\n"
        f"discoveryIntervalSeconds: {INTERVAL_S}\ntimeoutSeconds: {TIMEOUT_S}\n",
        offlineGracePeriodSeconds=0)
    name = instance_name("plcs", farm.urls["mover"], shared=True, node=node)
    samples: list[float] = []
    async with InstanceTimes(plane.kubeconfig, namespace) as times:
        await emulator.start()
        agent = asyncio.create_task(run_agent(settings))
        try:
            for _ in range(SAMPLES):
                started = await farm.command("start")
                samples.append(await times.appeared(name) - started["at"])
                await farm.command("stop")
                await times.gone(name)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
            await emulator.stop(delete_node=True)
            shutil.rmtree(plugin_dir, ignore_errors=True)
    return samples


async def _bench(plane: ControlPlane | None, runs: int) -> None:
    farm = Farm()
    try:
        await farm.start()
        await _bench_lists(farm, runs)
        if plane is None:
            return
        instances = await _bench_instances(farm, plane)
        print(summary(f"3. server started → Instance exists on the API server, real agent "
                      f"(target ≤ {INTERVAL_S + 0.5:g} s: one interval + 0.5 s)", instances,
                      unit="s", scale=1.0), flush=True)
    finally:
        await farm.stop()


def main(argv: list[str]) -> None:
    """``--runs N``: runs of parts 1 and 2 (default 5); ``--lists-only``: parts 1 and 2 alone
    (no control plane)."""
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else RUNS
    print(machine_speed_line(), flush=True)
    if "--lists-only" in argv:
        asyncio.run(_bench(None, runs))
        return
    with ControlPlane() as plane:
        plane.apply_crds()
        asyncio.run(_bench(plane, runs))


if __name__ == "__main__":
    main(sys.argv[1:])
