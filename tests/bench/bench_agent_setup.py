"""What the agent benchmarks share: a control plane, an emulated node, the agent as a process,
and watches that timestamp API events as they arrive.

``bench_agent`` (latencies) and ``bench_agent_memory`` (resident memory) both need the real API
server, the node emulator as the kubelet and ``python -m agent.main`` running beside them; and
latency figures must not be quantised by a poll interval, so state changes are timed on receipt
of watch events, with waiters checked inside the event handler itself. Its ``main`` only points
at ``bench_agent``, which runs every agent benchmark (so a full ``python -m tests.bench`` does
not run them twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Namespace, Node

from agent.kube.client import InstanceResource, as_dict
from tests.harness.agent_process import AgentSubprocess, api_client
from tests.harness.aio_process import cancel_and_wait
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator

log = logging.getLogger(__name__)

#: How long any one awaited condition may take before the benchmark fails, naming it.
CONDITION_DEADLINE_S = 60.0
#: Where the traced agent writes its tracemalloc top list on SIGUSR1.
TRACE_OUT_ENV = "EDGEPLUG_BENCH_TRACE_OUT"
#: Pause before re-opening a watch the API server closed.
WATCH_REOPEN_S = 0.2

_Predicate = Callable[[], bool]


@dataclass
class WatchedState:
    """The latest Instances (by name) and Node allocatable, updated from watch events.

    ``until`` returns the ``time.monotonic()`` at which the event that made a predicate true was
    received; predicates are evaluated in the watch task, right after each event is applied."""

    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=dict)
    _waiters: list[tuple[_Predicate, asyncio.Future[float]]] = field(default_factory=list)

    def _applied(self) -> None:
        now = time.monotonic()
        for pred, future in list(self._waiters):
            if not future.done() and pred():
                future.set_result(now)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    async def until(self, pred: _Predicate, *, what: str,
                    deadline: float = CONDITION_DEADLINE_S) -> float:
        if pred():
            return time.monotonic()
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((pred, future))
        try:
            async with asyncio.timeout(deadline):
                return await future
        except TimeoutError:
            raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}") from None
        finally:
            future.cancel()

    async def follow_instances(self, client: AsyncClient, namespace: str) -> None:
        while True:
            try:
                async for kind, obj in client.watch(InstanceResource, namespace=namespace):
                    data = as_dict(obj)
                    name = data["metadata"]["name"]
                    if kind == "DELETED":
                        self.instances.pop(name, None)
                    else:
                        self.instances[name] = data
                    self._applied()
            except Exception as error:  # e.g. 429 while the server warms up
                log.debug("Instance watch failed, reopening: %s", error)
            await asyncio.sleep(WATCH_REOPEN_S)

    async def follow_node(self, client: AsyncClient, node: str) -> None:
        while True:
            try:
                async for _kind, obj in client.watch(Node, fields={"metadata.name": node}):
                    status = obj.status
                    self.allocatable = dict((status.allocatable if status else None) or {})
                    self._applied()
            except Exception as error:  # e.g. 429 while the server warms up
                log.debug("Node watch failed, reopening: %s", error)
            await asyncio.sleep(WATCH_REOPEN_S)


@dataclass
class BenchNode:
    """One emulated node with the agent (a subprocess) serving its device plugins."""

    plane: ControlPlane
    name: str
    namespace: str
    plugin_dir: Path
    emulator: NodeEmulator
    agent: AgentSubprocess
    client: AsyncClient
    state: WatchedState

    @property
    def pid(self) -> int:
        assert self.agent.process is not None
        return self.agent.process.pid

    def resources(self) -> set[str]:
        """Every resource name ever registered with the emulated kubelet."""
        return {r.resource_name for r in self.emulator.registrations}


#: ``python -c`` program of the traced agent: tracemalloc starts before anything is imported,
#: so imports are counted too; SIGUSR1 writes the biggest allocation sites to $TRACE_OUT_ENV.
TRACED_AGENT = """
import os, signal, tracemalloc
tracemalloc.start(1)
def dump(signum, frame):
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)])
    total = sum(s.size for s in snap.statistics("filename"))
    lines = [f"traced Python heap {total / 2**20:.1f} MiB (C allocations are not seen)"]
    for group in ("filename", "lineno"):
        lines.append(f"top by {group}:")
        lines += [f"  {s.size / 2**20:6.2f} MiB {s.count:7d} blocks  {s.traceback[0]}"
                  for s in snap.statistics(group)[:TOP]]
    out = os.environ[ENV]
    with open(out + ".partial", "w") as f:
        f.write("\\n".join(lines) + "\\n")
    os.rename(out + ".partial", out)  # appears whole
signal.signal(signal.SIGUSR1, dump)
from agent.main import main
main()
"""
#: How many allocation sites the traced agent lists per grouping.
TRACE_TOP = 12


class TracedAgentSubprocess(AgentSubprocess):
    """The same ``agent.main`` under tracemalloc (``TRACED_AGENT``); SIGUSR1 makes it write
    its top allocations to ``trace_out``."""

    def __init__(self, *args: Any, trace_out: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace_out = trace_out

    def start(self) -> None:
        env = {**self._env, TRACE_OUT_ENV: str(self.trace_out)}
        out = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-c",
             TRACED_AGENT.replace("TOP", str(TRACE_TOP)).replace("ENV", repr(TRACE_OUT_ENV))],
            env=env, stdout=out, stderr=out, cwd=Path(__file__).resolve().parents[2],
        )


def agent_tree(value: str) -> Path:
    """The checkout named by a benchmark's ``--agent-tree`` (whose agent it runs, to compare
    another commit with this one), refused unless it holds an agent."""
    tree = Path(value).resolve()
    if not (tree / "agent" / "main.py").is_file():
        raise SystemExit(f"--agent-tree {tree}: no agent/main.py there")
    return tree


def daemonset_env() -> dict[str, str]:
    """The settings the DaemonSet gives the agent beyond the node's paths
    (``deploy/manifests/agent-daemonset.yaml``): its metrics endpoint, served here on loopback.
    The memory and idle benchmarks run the agent with these (and pod-resources) and nothing
    else: no allocator or gRPC tuning variables, which the DaemonSet does not set either."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {"METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"}


#: What ``daemonset_env`` sets, for the benchmarks' output.
DAEMONSET_SETTINGS = ("POD_RESOURCES_SOCKET (the emulator's), METRICS_PORT on 127.0.0.1; "
                      "no MALLOC_* or GRPC_* variables")


@contextlib.asynccontextmanager
async def bench_node(plane: ControlPlane, *, label: str, trace_out: Path | None = None,
                     pod_resources: bool = False,
                     env: Mapping[str, str] | None = None,
                     agent_source: Path | None = None) -> AsyncIterator[BenchNode]:
    """A fresh namespace, an emulated node, the agent as ``python -m agent.main`` (traced by
    tracemalloc when ``trace_out`` is given; sweeping the emulator's pod-resources socket when
    ``pod_resources``; with ``env`` added to its environment; from the checkout
    ``agent_source`` when given), and two watches."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"bench-{label}-{suffix}", f"bench-{label}-{suffix}"
    plane.kubectl("create", "namespace", namespace)
    # Unix socket paths are limited to 108 bytes: keep the directory short.
    plugin_dir = Path(tempfile.mkdtemp(prefix="epb-", dir="/tmp"))
    log_path = plugin_dir.parent / f"{plugin_dir.name}-agent.log"
    pod_resources_socket = plugin_dir.parent / f"{plugin_dir.name}-pr.sock"
    emulator = NodeEmulator(node_name=name, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
                            pod_resources_socket=pod_resources_socket if pod_resources else None)
    extra_env = {"POD_RESOURCES_SOCKET": str(pod_resources_socket)} if pod_resources else {}
    extra_env.update(env or {})
    agent = (
        AgentSubprocess(plane, node_name=name, namespace=namespace, serve_device_plugins=True,
                        plugin_dir=plugin_dir, log_path=log_path, extra_env=extra_env,
                        source=agent_source)
        if trace_out is None else
        TracedAgentSubprocess(plane, node_name=name, namespace=namespace,
                              serve_device_plugins=True, plugin_dir=plugin_dir,
                              log_path=log_path, trace_out=trace_out, extra_env=extra_env)
    )
    client = api_client(plane)
    state = WatchedState()
    await emulator.start()
    watches = [asyncio.create_task(state.follow_instances(client, namespace)),
               asyncio.create_task(state.follow_node(client, name))]
    agent.start()
    try:
        yield BenchNode(plane, name, namespace, plugin_dir, emulator, agent, client, state)
    except BaseException:
        print(f"(agent log kept at {log_path})")
        raise
    else:
        log_path.unlink(missing_ok=True)
    finally:
        agent.stop()
        await cancel_and_wait(*watches)
        await emulator.stop(delete_node=True)
        with contextlib.suppress(Exception):
            await client.delete(Namespace, namespace)
        await client.close()
        shutil.rmtree(plugin_dir, ignore_errors=True)
        pod_resources_socket.unlink(missing_ok=True)


def quiet_logs() -> None:
    """The emulated kubelet warns when plugins go away, which benchmarks make them do."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tests.harness").setLevel(logging.ERROR)


def main(argv: list[str]) -> None:
    """Shared setup only: ``python -m tests.bench bench_agent`` runs the agent benchmarks."""
    print("shared setup of the agent benchmarks: they run under bench_agent")
