"""The ascend handler's cost and speed on an emulated 16-chip node.

The discovery pass and the CPU of one health poll on a
16-chip node, how long a faulted chip takes to show Unhealthy (target: within the poll
interval + 0.2 s), and how long a DCMI call that never returns takes to show its
card's chips Unhealthy (target: within the poll and the DCMI timeout) and what ``prepare``
costs meanwhile. Timings are never pass/fail, so they are measured here. The node is
tests/harness/ascend_node.py's (the DCMI stand-in compiled and loaded through ctypes, and the
fake ``npu-smi``); part 3 runs the whole path to the node: a real control plane, the agent in
this process (it loads the DCMI stand-in) and the node emulator as the kubelet, and times a
fault until the kubelet holds the chip Unhealthy (ListAndWatch) and until the Node's
allocatable drops. ``--no-node`` skips part 3. A pure-Python loop timed in the same run shows
the machine's speed beside the figures.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.sources import scan
from tests.bench.stats import machine_speed_line, summary
from tests.harness.ascend_node import AscendNode, build_dcmi_library, chips_910b
from tests.harness.controlplane import ControlPlane

CHIPS = 16
PER_CARD = 2
PASSES = 50
FAULT_RUNS = 10
HANG_RUNS = 8
DCMI_TIMEOUT_S = 1.0  # dcmiTimeoutSeconds for the hang runs (default 3 s)
POLL_S = 1.0  # the fastest poll details allow; Huawei's default is 5 s
FAULT_DEADLINE_S = 10.0
NODE_POLLS = ((1.0, 10), (5.0, 5))  # (healthPollSeconds, runs): the fastest and Huawei's default
RESOURCE = "huawei.com/Ascend910"
LOOK_S = 0.01  # how often the node part looks at the kubelet and the API


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_passes(details: AscendDetails, label: str) -> None:
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(PASSES):
        cpu, wall = _cpu(), time.perf_counter()
        result = scan(details)
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
        assert len(result.devices) == CHIPS, result.status
    print("  " + summary(f"{label}: pass wall time", walls))
    print("  " + summary(f"{label}: CPU per pass (= per health poll)", cpus))


async def bench_fault(node: AscendNode, details: AscendDetails) -> list[float]:
    """Fault → the handler yields the chip Unhealthy, FAULT_RUNS times."""
    def cause(run: int) -> list[int]:
        node.fault(run % CHIPS)
        return [run % CHIPS]

    def undo(run: int) -> None:
        node.clear(run % CHIPS)

    samples, _ = await _time_unhealthy(details, FAULT_RUNS, cause, undo)
    return samples


async def bench_hang(node: AscendNode, details: AscendDetails
                     ) -> tuple[list[float], list[float]]:
    """A DCMI call that never returns (dcmi_get_device_health, for one card) → the handler
    yields that card's chips Unhealthy, HANG_RUNS times; and how long ``prepare`` (the
    kubelet's PreStartContainer) takes for a chip of another card while the call hangs."""
    cards = CHIPS // PER_CARD

    def cause(run: int) -> list[int]:
        card = run % cards
        node.hang("dcmi_get_device_health", card)
        return [card * PER_CARD + i for i in range(PER_CARD)]

    def undo(run: int) -> None:
        node.unhang()

    return await _time_unhealthy(details, HANG_RUNS, cause, undo,
                                 prepare_phy=lambda run: ((run % cards + 1) % cards) * PER_CARD)


async def _time_unhealthy(
    details: AscendDetails, runs: int, cause: Any, undo: Any, prepare_phy: Any = None,
) -> tuple[list[float], list[float]]:
    """``cause(run)`` → the chips it names are yielded Unhealthy, ``runs`` times (a different
    point of the poll cycle each run, as real faults come). The stream is drained by its own
    task, as the agent does, so the poll timer runs while the bench waits. With
    ``prepare_phy``, ``prepare`` of that chip is timed while the cause holds."""
    lists: asyncio.Queue[tuple[float, dict[str, bool], list[Any]]] = asyncio.Queue()

    async def drain() -> None:
        async for devices in handler.discover(details):
            lists.put_nowait((time.perf_counter(), {d.id: d.health.healthy for d in devices},
                              list(devices)))

    async def until(phys: list[int], healthy: bool) -> tuple[float, list[Any]]:
        while True:
            at, health, devices = await asyncio.wait_for(lists.get(), FAULT_DEADLINE_S)
            if all(health[f"davinci{phy}"] is healthy for phy in phys):
                return at, devices

    samples: list[float] = []
    prepares: list[float] = []
    consumer = asyncio.create_task(drain())
    try:
        await asyncio.wait_for(lists.get(), FAULT_DEADLINE_S)
        for run in range(runs):
            await asyncio.sleep(POLL_S * ((run * 0.37) % 1.0))
            started = time.perf_counter()
            phys = cause(run)
            at, devices = await until(phys, False)
            samples.append(at - started)
            if prepare_phy is not None:
                chip = next(d for d in devices if d.id == f"davinci{prepare_phy(run)}")
                asked = time.perf_counter()
                await asyncio.wait_for(handler.prepare(details, [chip]), FAULT_DEADLINE_S)
                prepares.append(time.perf_counter() - asked)
            undo(run)
            await until(phys, True)
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    return samples, prepares


async def bench_node(plane: ControlPlane, node: AscendNode, poll: float, runs: int
                     ) -> tuple[list[float], list[float]]:
    """Fault → the emulated kubelet holds the chip Unhealthy; → the Node's allocatable drops."""
    import shutil
    import uuid

    from agent.main import run_agent
    from agent.settings import AgentSettings
    from tests.harness.agent_process import api_client
    from tests.harness.controller_process import apply
    from tests.harness.kube_waits import allocatable
    from tests.harness.node_emulator import NodeEmulator

    name = f"npu-{uuid.uuid4().hex[:8]}"
    namespace = f"bench-{name}"
    plane.kubectl("create", "namespace", namespace)
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
    emulator = NodeEmulator(node_name=name, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir)
    kube = api_client(plane)
    await emulator.start()
    agent = asyncio.create_task(run_agent(AgentSettings(
        node_name=name, kubeconfig=plane.kubeconfig, plugin_dir=plugin_dir,
        pod_resources_socket=None, namespace=namespace)))

    async def until(predicate: Any, what: str) -> float:
        deadline = time.perf_counter() + FAULT_DEADLINE_S + poll
        while not await predicate():
            if time.perf_counter() > deadline:
                raise TimeoutError(what)
            await asyncio.sleep(LOOK_S)
        return time.perf_counter()

    async def kubelet_sees(count: int) -> bool:
        return len(emulator.healthy_device_ids(RESOURCE)) == count

    async def node_shows(count: int) -> bool:
        return await allocatable(kube, name, RESOURCE) == str(count)

    to_kubelet: list[float] = []
    to_node: list[float] = []
    try:
        apply(plane, {
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
            "metadata": {"name": "npu", "namespace": namespace},
            "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails":
                                          node.details(healthPollSeconds=poll)},
                     "capacity": 1, "resourceName": RESOURCE}})
        await until(lambda: node_shows(CHIPS), f"{CHIPS} chips allocatable")
        for run in range(runs):
            phy = run % CHIPS
            await asyncio.sleep(poll * ((run * 0.37) % 1.0))  # a fault comes at any moment
            started = time.perf_counter()
            node.fault(phy)
            to_kubelet.append(await until(lambda: kubelet_sees(CHIPS - 1), "kubelet") - started)
            to_node.append(await until(lambda: node_shows(CHIPS - 1), "node") - started)
            node.clear(phy)
            await until(lambda: node_shows(CHIPS), "chip back")
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        await emulator.stop(delete_node=True)
        await kube.close()
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        shutil.rmtree(plugin_dir, ignore_errors=True)
    return to_kubelet, to_node


def main(argv: Sequence[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tests.harness").setLevel(logging.ERROR)
    logging.getLogger("discovery_handlers.ascend").setLevel(logging.ERROR)
    logging.getLogger("agent").setLevel(logging.ERROR)  # one warning per fault otherwise
    print(machine_speed_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-ascend-") as tmp:
        library = build_dcmi_library(Path(tmp) / "lib")
        node = AscendNode(Path(tmp) / "host", chips_910b(CHIPS, per_card=PER_CARD),
                          library=library)
        os.environ.update(node.env)
        dcmi = handler.parse_details(node.details(healthPollSeconds=POLL_S), {})
        smi = handler.parse_details(node.details(sources=["npu-smi"]), {})
        print(f"1. one discovery pass over {CHIPS} chips (n={PASSES})", flush=True)
        bench_passes(dcmi, "DCMI (ctypes)")
        bench_passes(smi, "npu-smi info (subprocess + parse)")
        print(f"2. fault → Unhealthy from the handler, poll {POLL_S:g} s (n={FAULT_RUNS}; "
              f"target ≤ poll + 0.2 s)", flush=True)
        print("  " + summary("fault → Unhealthy", asyncio.run(bench_fault(node, dcmi))))
        hung = handler.parse_details(node.details(healthPollSeconds=POLL_S,
                                                  dcmiTimeoutSeconds=DCMI_TIMEOUT_S), {})
        print(f"2b. a hung DCMI call (one card) → its chips Unhealthy, poll {POLL_S:g} s, "
              f"timeout {DCMI_TIMEOUT_S:g} s (n={HANG_RUNS}; target ≤ poll + timeout)",
              flush=True)
        to_unhealthy, prepares = asyncio.run(bench_hang(node, hung))
        print("  " + summary("hung call → Unhealthy", to_unhealthy))
        print("  " + summary("prepare of another card's chip while it hangs", prepares))
        if "--no-node" in argv:
            return
        with ControlPlane() as plane:
            plane.apply_crds()
            for poll, runs in NODE_POLLS:
                print(f"3. fault → Unhealthy on the emulated node, poll {poll:g} s (n={runs}; "
                      f"target ≤ {poll + 0.2:g} s)", flush=True)
                kubelet, api = asyncio.run(bench_node(plane, node, poll, runs))
                print("  " + summary("fault → kubelet holds it Unhealthy", kubelet))
                print("  " + summary("fault → Node allocatable drops", api))
