"""A small cluster for the fault suite: real nodes, real agents, real controllers, one namespace.

Every fault scenario needs the same cast, each part a real process that the
test can kill: the kubelet's own device manager per node (``DeviceNode``, restartable), the
agent as ``python -m agent.main`` beside it (discovery and device plugins, SIGKILLable), the
controller as one or two peering replicas, and debugEcho Configurations whose devices come and
go through an availability file. ``FaultCluster`` starts them, hands the invariant recorder its
view of the kubelets, polls the final state against what the test expects (``converged``), and
stops everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.kube.client import InstanceResource, as_dict
from crds.naming import instance_name
from tests.faults.invariants import (
    InvariantRecorder,
    KubeletView,
    is_live,
    live_brokers,
    recorded_slots,
    slot_holders,
)
from tests.harness.agent_process import AgentSubprocess, debug_echo_configuration
from tests.harness.controller_process import (
    FAST_ARGS,
    ControllerProcess,
    apply,
    broker_pod_spec,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import POLL_S

#: The bound on convergence once a fault ends: the final state must hold within this (on a
#: loaded 2-core machine; the agent frees a vanished pod's slot within seconds, the controller
#: replaces a broker at once).
CONVERGED_WITHIN_S = 20.0
#: Lines of each process's log shown when a scenario fails.
LOG_LINES = 25


@dataclass
class FaultNode:
    """One node: the kubelet's device manager and the agent beside it."""

    kubelet: DeviceNode
    agent: AgentSubprocess
    agent_log: Path
    view: KubeletView

    @property
    def name(self) -> str:
        return self.kubelet.node_name

    def restart_agent(self) -> None:
        """SIGKILL the agent and start it again (a crash and the DaemonSet's restart)."""
        self.agent.kill()
        self.agent.start()


@dataclass
class FaultCluster:
    """Nodes, agents and controllers on one control plane, serving one namespace."""

    plane: ControlPlane
    namespace: str
    workdir: Path
    nodes: list[FaultNode] = field(default_factory=list)
    controllers: list[ControllerProcess] = field(default_factory=list)
    _dirs: list[Path] = field(default_factory=list)

    async def add_node(self) -> FaultNode:
        """A node with its agent running (it serves the namespace's Configurations)."""
        # Short socket paths; pod-resources apart, as the kubelet's is (a starting device
        # manager deletes every other socket in its plugin directory).
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-fd-", dir="/tmp"))
        pod_resources_dir = Path(tempfile.mkdtemp(prefix="ep-fr-", dir="/tmp"))
        self._dirs += [plugin_dir, pod_resources_dir]
        pod_resources = pod_resources_dir / "kubelet.sock"
        name = f"fault-{uuid.uuid4().hex[:6]}"
        kubelet = DeviceNode(node_name=name, kubeconfig=self.plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=pod_resources)
        await kubelet.start()
        log = self.workdir / f"agent-{name}.log"
        agent = AgentSubprocess(self.plane, node_name=name, namespace=self.namespace,
                                serve_device_plugins=True, plugin_dir=plugin_dir, log_path=log,
                                extra_env={"POD_RESOURCES_SOCKET": str(pod_resources)})
        agent.start()
        node = FaultNode(kubelet, agent, log, KubeletView(name, kubelet.records_path))
        self.nodes.append(node)
        return node

    def start_controller(self, *, priority: int | None = None,
                         args: Sequence[str] = FAST_ARGS) -> ControllerProcess:
        ctl = ControllerProcess(
            self.plane, namespaces=[self.namespace], priority=priority, extra_args=args,
            log_path=self.workdir / f"ctl-{len(self.controllers)}.log").start()
        self.controllers.append(ctl)
        return ctl

    def views(self) -> list[KubeletView]:
        return [node.view for node in self.nodes]

    def recorder(self) -> InvariantRecorder:
        return InvariantRecorder(kubeconfig=self.plane.kubeconfig, namespace=self.namespace,
                                 kubelets=self.views)

    def client(self) -> AsyncClient:
        return AsyncClient(KubeConfig.from_file(str(self.plane.kubeconfig)))

    def logs(self) -> str:
        parts = [f"--- {n.name} agent ---\n{_tail(n.agent_log)}\n--- {n.name} kubelet ---\n"
                 f"{n.kubelet.log_tail(LOG_LINES)}" for n in self.nodes]
        parts += [f"--- controller {i} ---\n{c.log_tail(LOG_LINES)}"
                  for i, c in enumerate(self.controllers)]
        return "\n".join(parts)

    async def close(self) -> None:
        for ctl in self.controllers:
            ctl.stop()
        for node in self.nodes:
            node.agent.stop()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                await node.kubelet.stop(delete_node=True)
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)

    # -- objects -----------------------------------------------------------------------------

    def configure(self, name: str, *, descriptions: Sequence[str], availability: Path,
                  capacity: int, grace: int, brokers: bool, shared: bool = True) -> None:
        """A debugEcho Configuration; ``brokers``: one broker pod per (Instance, node)."""
        config = debug_echo_configuration(name, descriptions=list(descriptions), shared=shared,
                                          availability_file=availability, capacity=capacity,
                                          grace=grace)
        if brokers:
            config["spec"]["brokerSpec"] = {"brokerPodSpec": broker_pod_spec()}
        config["metadata"]["namespace"] = self.namespace
        apply(self.plane, config)

    def expected(self, configuration: str, descriptions: Sequence[str], *,
                 shared: bool = True) -> dict[str, set[str]]:
        """Instance → nodes, for these devices visible on every node."""
        names = {n.name for n in self.nodes}
        if shared:
            return {instance_name(configuration, d, shared=True, node=""): names
                    for d in descriptions}
        return {instance_name(configuration, d, shared=False, node=n): {n}
                for d in descriptions for n in names}

    async def one_shared_device(
        self, client: AsyncClient, configuration: str, *, capacity: int, brokers: bool
    ) -> dict[str, set[str]]:
        """A Configuration with one shared debugEcho device (``cam0``, seen by every node,
        offline while ``workdir/offline`` exists), converged; its expected Instance → nodes."""
        self.configure(configuration, descriptions=["cam0"], availability=self.workdir / "offline",
                       capacity=capacity, grace=5, brokers=brokers)
        expected = self.expected(configuration, ["cam0"])
        await self.converged(client, expected, brokers=brokers)
        return expected

    async def converged(self, client: AsyncClient, expected: Mapping[str, set[str]], *,
                        brokers: bool,
                        running_within: float | None = CONVERGED_WITHIN_S) -> None:
        """Poll until the final state holds (``problems``); fail listing what still differs.

        edgeplug's part (Instances, broker pods, ``deviceUsage``) must hold within
        ``CONVERGED_WITHIN_S``; every pod Running, which takes Kubernetes' own scheduler and
        kubelet too, within ``running_within`` (None: not awaited)."""
        await self._poll(client, expected, brokers=brokers, running=False,
                         within=CONVERGED_WITHIN_S)
        if running_within is not None:
            await self._poll(client, expected, brokers=brokers, running=True,
                             within=running_within)

    async def _poll(self, client: AsyncClient, expected: Mapping[str, set[str]], *,
                    brokers: bool, running: bool, within: float) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        last: list[str] = []
        while found := await self.problems(client, expected, brokers=brokers, running=running):
            if found != last:
                print(f"[{loop.time() - began:5.1f}s] not converged: {found}")
                last = found
            if loop.time() > began + within:
                raise AssertionError(
                    f"not converged {within:.0f}s after the fault:\n" + "\n".join(found)
                    + "\n" + self.logs())
            await asyncio.sleep(POLL_S)
        print(f"[{loop.time() - began:5.1f}s] converged{' (pods running)' if running else ''}")

    async def problems(self, client: AsyncClient, expected: Mapping[str, set[str]], *,
                       brokers: bool, running: bool = True) -> list[str]:
        """How the state differs from converged: the expected Instances on the expected nodes;
        one live broker per (Instance, node) and no other (``brokers``); every live pod Running
        (``running``); ``deviceUsage`` giving exactly the slots live pods hold, to their
        nodes."""
        try:
            instances = {o["metadata"]["name"]: o for o in
                         [as_dict(i) async for i in client.list(InstanceResource,
                                                                namespace=self.namespace)]}
            pods = [as_dict(p) async for p in client.list(Pod, namespace=self.namespace)]
        except Exception as error:  # refused, timed out, 5xx: the server is not back yet
            return [f"API: {error!r}"]
        out = []
        if set(instances) != set(expected):
            out.append(f"Instances {sorted(instances)}, expected {sorted(expected)}")
        for name, nodes in expected.items():
            have = set((instances.get(name, {}).get("spec") or {}).get("nodes") or [])
            if name in instances and have != nodes:
                out.append(f"Instance {name} on {sorted(have)}, expected {sorted(nodes)}")
        if brokers:
            have_brokers = live_brokers(pods)
            want = {(i, n) for i, nodes in expected.items() for n in nodes}
            if set(have_brokers) != want:
                out.append(f"brokers for {sorted(have_brokers)}, expected {sorted(want)}")
        if running:
            out += [self._describe(p) for p in pods
                    if is_live(p) and (p.get("status") or {}).get("phase") != "Running"]
        holders, unmapped = slot_holders(self.views(), instances)
        out += [f"unrecorded configuration slot: {u}" for u in unmapped]
        recorded = recorded_slots(instances)
        for slot in sorted(recorded.keys() | holders.keys()):
            if not any(slot.startswith(f"{i}-") for i in instances):
                continue  # a slot of an Instance gone with its device
            nodes_holding = {h.node for h in holders.get(slot, set())}
            if nodes_holding != ({recorded[slot]} if slot in recorded else set()):
                out.append(f"slot {slot}: deviceUsage {recorded.get(slot)!r}, held on "
                           f"{sorted(nodes_holding)}")
        return out


    def _describe(self, pod: Mapping[str, Any]) -> str:
        """A pod not running: its phase, where it is bound, what its kubelet recorded."""
        name, node = pod["metadata"]["name"], (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        where = f"bound to {node}" if node else "not bound: " + "; ".join(
            f"{c.get('reason')} {c.get('message')}" for c in status.get("conditions") or [])
        records = [r for n in self.nodes if n.name == node for r in n.view.pods()
                   if r.get("uid") == pod["metadata"].get("uid")]
        kubelet = (f"kubelet: {records[-1].get('phase')} {records[-1].get('reason')}"
                   if records else "kubelet: no record")
        return f"pod {name} is {status.get('phase')}, {where}, {kubelet}"


def write_offline(path: Path, devices: set[str]) -> None:
    """Set debugEcho's availability file to ``devices`` (one per line) in one step: written
    beside it and renamed over it. A write in place is seen empty for a moment (the truncate is
    a change of its own), so every device would be online for a discovery pass: an unplugged
    device's Instance re-created, and deleted again after its grace, which the recorder flags."""
    staged = path.with_name(path.name + ".new")
    staged.write_text("".join(f"{d}\n" for d in sorted(devices)))
    staged.replace(path)


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_LINES:])
    return ""


async def delete_pod(client: AsyncClient, namespace: str, name: str) -> None:
    with contextlib.suppress(ApiError):
        await client.delete(Pod, name, namespace=namespace, grace_period=0)
