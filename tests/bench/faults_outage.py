"""An API server outage of N seconds, devices coming and going in it: time to converge after.

How long after the API server returns from an outage the cluster
matches the devices again, from the agent's side (target: 5 s). Everything is real and its own
process: a control plane of our own, two nodes each run by the kubelet's device manager
(``tests/harness/devicenode.py``) with the agent beside it (``python -m agent.main``, discovery
and device plugins), and the controller (``python -m controller.main``, default settings, peering
on). A shared debugEcho Configuration with brokers lists four devices; an availability file says
which are unplugged. Each run stops kube-apiserver, and a third of the way into the outage
unplugs one device and plugs in another (the grace period, 2 s, ends inside the outage). From
the moment the API server answers ``/readyz`` again, two times are taken by polling: until the
Instances and their ``nodes`` match the devices, and until, in addition, exactly one Running
broker pod serves each (Instance, node) and no other broker lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.kube.client import InstanceResource, as_dict
from controller.naming import COMPONENT_BROKER, LABEL_COMPONENT, LABEL_INSTANCE
from crds.naming import LABEL_TARGET_NODE, instance_name, target_node_label
from tests.bench.faults_handoff import SPEED_CONCURRENCY, create_rate
from tests.bench.stats import summary
from tests.harness.agent_process import AgentSubprocess, debug_echo_configuration
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    install_peering_crds,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode

CONFIGURATION: Final = "outage"
DEVICES: Final = ("cam0", "cam1", "cam2", "cam3")
#: What is plugged in before even and odd runs' outages, and after (each run swaps them).
PLUGGED: Final = (("cam0", "cam1", "cam2"), ("cam1", "cam2", "cam3"))
NODES: Final = 2
#: Slots per device: one broker per node holds one.
CAPACITY: Final = 2
#: The Configuration's offlineGracePeriodSeconds: short, so the device is gone within the outage.
GRACE_S: Final = 2
#: When in the outage the devices change, as a fraction of it.
CHANGE_AT: Final = 1 / 3
#: A run that has not converged this long after the server returned is a failure.
CONVERGE_DEADLINE_S: Final = 180.0
POLL_S: Final = 0.05
ENDED_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass
class OutageResult:
    """Seconds from the API server's return until converged, per run."""

    outage_s: float
    instances: list[float] = field(default_factory=list)  # Instances and their nodes
    brokers: list[float] = field(default_factory=list)  # and the broker pods (one each)
    running: list[float] = field(default_factory=list)  # and every broker Running


@dataclass
class _Cluster:
    plane: ControlPlane
    namespace: str
    workdir: Path
    availability: Path
    nodes: list[DeviceNode] = field(default_factory=list)
    agents: list[AgentSubprocess] = field(default_factory=list)
    controller: ControllerProcess | None = None

    def plug(self, devices: Sequence[str]) -> None:
        """Exactly ``devices`` plugged in: the file lists the others, offline."""
        tmp = self.availability.with_suffix(".new")
        tmp.write_text("".join(f"{d}\n" for d in DEVICES if d not in devices))
        tmp.replace(self.availability)

    def expected(self, devices: Sequence[str]) -> dict[str, set[str]]:
        names = {n.node_name for n in self.nodes}
        return {instance_name(CONFIGURATION, d, shared=True, node=""): names for d in devices}

    def check_alive(self) -> None:
        for agent in self.agents:
            if agent.process is not None and agent.process.poll() is not None:
                raise RuntimeError(f"an agent exited ({agent.process.returncode}); logs in "
                                   f"{self.workdir}")
        ctl = self.controller
        if ctl is not None and ctl.popen is not None and ctl.popen.poll() is not None:
            raise RuntimeError(f"the controller exited:\n{ctl.log_tail()}")


def _agent_env(workdir: Path, retry_max_s: float | None) -> dict[str, str]:
    """The agents' extra environment: with ``retry_max_s``, an experiment: the agent's retry
    backoff capped there instead of ``settings.api.watch_retry_max_s`` (a ``sitecustomize`` puts it
    in the tree the agent reads as the interpreter starts), to show what that cap costs after an
    outage."""
    if retry_max_s is None:
        return {}
    patch = workdir / "retry-patch"
    patch.mkdir(exist_ok=True)
    (patch / "sitecustomize.py").write_text(
        "import dataclasses\n"
        "import agent.settings as s\n"
        "_read = s.AgentSettings.from_env.__func__\n"
        "def _capped(cls, env=None):\n"
        "    read = _read(cls, env)\n"
        "    return dataclasses.replace(read, api=dataclasses.replace(\n"
        f"        read.api, watch_retry_max_s={float(retry_max_s)!r}))\n"
        "s.AgentSettings.from_env = classmethod(_capped)\n")
    return {"PYTHONPATH": str(patch)}


async def _start(plane: ControlPlane, workdir: Path, retry_max_s: float | None) -> _Cluster:
    namespace = f"bench-outage-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(install_peering_crds, plane)
    await asyncio.to_thread(plane.kubectl, "create", "namespace", namespace)
    cluster = _Cluster(plane, namespace, workdir, workdir / "offline")
    cluster.plug(PLUGGED[0])
    for _ in range(NODES):
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-bo-", dir="/tmp"))  # short socket paths
        pod_resources = plugin_dir / "pr.sock"
        node = DeviceNode(node_name=f"outage-{uuid.uuid4().hex[:6]}",
                          kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
                          pod_resources_socket=pod_resources)
        await node.start()
        cluster.nodes.append(node)
        agent = AgentSubprocess(plane, node_name=node.node_name, namespace=namespace,
                                serve_device_plugins=True, plugin_dir=plugin_dir,
                                log_path=workdir / f"agent-{node.node_name}.log",
                                extra_env={"POD_RESOURCES_SOCKET": str(pod_resources),
                                           **_agent_env(workdir, retry_max_s)})
        agent.start()
        cluster.agents.append(agent)
    cluster.controller = ControllerProcess(plane, namespaces=[namespace], extra_args=(),
                                           log_path=workdir / "controller.log").start()
    config = debug_echo_configuration(CONFIGURATION, descriptions=list(DEVICES), shared=True,
                                      availability_file=cluster.availability,
                                      capacity=CAPACITY, grace=GRACE_S)
    config["metadata"]["namespace"] = namespace
    config["spec"]["brokerSpec"] = {"brokerPodSpec": broker_pod_spec()}
    await asyncio.to_thread(apply, plane, config)
    return cluster


async def _stop(cluster: _Cluster) -> None:
    if cluster.controller is not None:
        cluster.controller.stop()
    for agent in cluster.agents:
        agent.stop()
    for node in cluster.nodes:
        with contextlib.suppress(Exception):
            await node.stop(delete_node=True)
        shutil.rmtree(node.plugin_dir, ignore_errors=True)


def _waiting_on(pod: dict[str, Any]) -> str:
    """Why a pod is not Running yet, in a few words (the scheduler's or the kubelet's)."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"unscheduled: {str(condition.get('message'))[:60]}"
    bound = "bound" if (pod.get("spec") or {}).get("nodeName") else "not yet tried"
    return f"{status.get('phase')}, {bound}"


async def _differences(client: AsyncClient, cluster: _Cluster,
                       expected: dict[str, set[str]]) -> tuple[list[str], list[str], list[str]]:
    """What still differs: Instances and nodes; which brokers exist; brokers not Running."""
    try:
        found = {o["metadata"]["name"]: o for o in [
            as_dict(i) async for i in client.list(InstanceResource, namespace=cluster.namespace)]}
        pods = [as_dict(p) async for p in client.list(Pod, namespace=cluster.namespace)]
    except (ApiError, OSError) as error:
        return [f"API: {error!r}"], [], []
    instances = []
    if set(found) != set(expected):
        instances.append(f"Instances {sorted(found)}, expected {sorted(expected)}")
    for name, nodes in expected.items():
        have = set((found.get(name, {}).get("spec") or {}).get("nodes") or [])
        if name in found and have != nodes:
            instances.append(f"{name} on {sorted(have)}, expected {sorted(nodes)}")
    labels = {target_node_label(n): n for nodes in expected.values() for n in nodes}
    brokers: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        pod_labels = meta.get("labels") or {}
        if pod_labels.get(LABEL_COMPONENT) != COMPONENT_BROKER or meta.get("deletionTimestamp") \
                or status.get("phase") in ENDED_PHASES:
            continue
        key = (pod_labels.get(LABEL_INSTANCE, "?"),
               labels.get(pod_labels.get(LABEL_TARGET_NODE, "?"), "?"))
        brokers.setdefault(key, []).append(pod)
    want = {(i, n) for i, nodes in expected.items() for n in nodes}
    exist = [f"brokers for {sorted(brokers)}, expected {sorted(want)}"] \
        if set(brokers) != want else []
    exist += [f"{len(found)} brokers for {key}" for key, found in brokers.items() if len(found) > 1]
    run = [f"broker {key}: {_waiting_on(pod)}" for key, found in sorted(brokers.items())
           for pod in found if (pod.get("status") or {}).get("phase") != "Running"]
    return instances, exist, run


@dataclass
class _Converged:
    """Seconds after the server's return until each level matched."""

    instances: float
    brokers: float
    running: float


async def _wait_converged(client: AsyncClient, cluster: _Cluster, expected: dict[str, set[str]],
                          since: float, trace: Callable[[str], Any] | None = None
                          ) -> _Converged:
    """Seconds from ``since`` until the Instances, then the brokers, then their Running state
    match; ``trace`` gets every change of what still differs, with its time."""
    at: list[float | None] = [None, None, None]
    last: list[str] | None = None
    deadline = since + CONVERGE_DEADLINE_S
    while True:
        cluster.check_alive()
        levels = await _differences(client, cluster, expected)
        now = time.monotonic()
        problems = [p for level in levels for p in level]
        if trace is not None and problems != last:
            last = problems
            trace(f"  +{now - since:6.2f} s: {'; '.join(problems) or 'converged'}")
        for i in range(3):
            if at[i] is None and not any(levels[: i + 1]):
                at[i] = now - since
        if at[2] is not None:
            return _Converged(*(t or 0.0 for t in at))
        if now > deadline:
            raise TimeoutError(f"not converged {CONVERGE_DEADLINE_S:.0f}s after the API server "
                               f"returned: {problems}; logs in {cluster.workdir}")
        await asyncio.sleep(POLL_S)


async def _outages(plane: ControlPlane, workdir: Path, plan: Sequence[tuple[float, int]],
                   trace: Callable[[str], Any] | None, retry_max_s: float | None
                   ) -> tuple[list[OutageResult], float]:
    cluster = await _start(plane, workdir, retry_max_s)
    client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    results = []
    try:
        await _wait_converged(client, cluster, cluster.expected(PLUGGED[0]), time.monotonic())
        rate = await create_rate(client, cluster.namespace)
        run = 0
        for outage_s, runs in plan:
            result = OutageResult(outage_s)
            for _ in range(runs):
                after = PLUGGED[(run + 1) % 2]
                args = await asyncio.to_thread(plane.stop_server, "kube-apiserver")
                started = time.monotonic()
                await asyncio.sleep(outage_s * CHANGE_AT)
                cluster.plug(after)
                while time.monotonic() - started < outage_s:
                    cluster.check_alive()  # agents and controller must ride it out
                    await asyncio.sleep(POLL_S * 10)
                await asyncio.to_thread(plane.start_server, "kube-apiserver", args)
                returned = time.monotonic()  # /readyz answered
                if trace is not None:
                    trace(f"outage {outage_s:.0f} s, run {run}: the server is back")
                converged = await _wait_converged(
                    client, cluster, cluster.expected(after), returned, trace)
                result.instances.append(converged.instances)
                result.brokers.append(converged.brokers)
                result.running.append(converged.running)
                run += 1
            results.append(result)
        return results, rate
    finally:
        await client.close()
        await _stop(cluster)


def measure(plan: Sequence[tuple[float, int]], *, trace: Callable[[str], Any] | None = None,
            keep: Path | None = None, agent_retry_max_s: float | None = None
            ) -> tuple[list[OutageResult], float]:
    """``plan``: (outage seconds, runs) in order, all on one cluster; ``trace``: each run's
    convergence step by step; ``keep``: a directory for the processes' logs (else removed).
    ``agent_retry_max_s``: the experiment of ``_agent_env``. Also returns the API server's
    create rate, measured once the cluster has settled."""
    with tempfile.TemporaryDirectory(prefix="ep-bo-") as tmp, \
            ControlPlane(workdir=keep / "control-plane" if keep else None) as plane:
        return asyncio.run(_outages(plane, keep or Path(tmp), plan, trace, agent_retry_max_s))


def report(results: Sequence[OutageResult], rate: float,
           out: Callable[[str], Any] = print) -> None:
    out(f"API server speed in this run: {rate:.0f} ConfigMap creates/s "
        f"({SPEED_CONCURRENCY} concurrent)")
    for r in results:
        out(summary(f"API server down {r.outage_s:.0f} s, devices changed in it → Instances and "
                    "nodes match, from the server's return", r.instances, unit="s", scale=1.0))
        out(summary(f"API server down {r.outage_s:.0f} s, devices changed in it → ... and one "
                    "broker pod per (Instance, node), none else", r.brokers, unit="s", scale=1.0))
        out(summary(f"API server down {r.outage_s:.0f} s, devices changed in it → ... and "
                    "every broker Running", r.running, unit="s", scale=1.0))
