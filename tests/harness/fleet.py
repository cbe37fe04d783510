"""A large fleet written by a bare client, a churn of writes on it, and per-process readings.

An agent runs on every node of a cluster that may hold thousands of nodes, so
its cost must be measured in such a cluster: ``create_fleet`` writes Nodes, one
Configuration per group of nodes (selecting only nodes labelled ``FOREIGN_LABEL``, so no agent
under test runs their discovery) and local Instances on those nodes, as agents there would have
published them; ``Churn`` then merge-patches those Instances at a fixed rate (a slot taken or
freed in ``spec.deviceUsage``, as an Allocate does, alternating with ``status.used`` on the
status subresource); ``ProcessReading`` reads a process's CPU time (nanoseconds, thread by
thread: ``thread_cpu_ns``) and resident memory from ``/proc`` and the bytes it received from the
API server (``ss``); ``watch_events`` reads what the API server sent its Instance watchers, and
how many Instance watches it holds open.
"""

from __future__ import annotations

import asyncio
import random
import re
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.types import PatchType

from agent.kube.node_instances import LABEL_VALUE, serves_label
from crds.naming import cdi_name, instance_digest, instance_name_from_digest, slot_id
from crds.resources import ConfigurationResource, InstanceResource
from tests.harness.controlplane import ControlPlane
from tests.harness.proc_cpu import cpu_seconds_between, thread_cpu_ns

#: The label every fleet Node carries; the fleet's Configurations select it.
FOREIGN_LABEL: Final = "fleet.edgeplug.io/foreign"
#: Field manager of the bare client that writes the fleet.
FIELD_MANAGER: Final = "edgeplug-bench-fleet"
#: Writes in flight at once while the fleet is created (the API server's own default limits
#: are far above this; two cores are the bound).
CREATE_CONCURRENCY: Final = 24
#: Each fleet Instance's capacity (slots in spec.deviceUsage).
CAPACITY: Final = 2
_PID: Final = re.compile(r"pid=(\d+),")
_RECEIVED: Final = re.compile(r"bytes_received:(\d+)")


@dataclass(frozen=True)
class FleetSize:
    nodes: int
    instances: int
    configurations: int


@dataclass(frozen=True)
class FleetInstance:
    name: str
    node: str


@dataclass(frozen=True)
class Fleet:
    namespace: str
    instances: list[FleetInstance]
    nodes_s: float
    instances_s: float


def node_names(nodes: int) -> list[str]:
    return [f"fleet-node-{i:05d}" for i in range(nodes)]


async def _bounded(jobs: Sequence[Any], limit: int) -> None:
    """Await every coroutine in ``jobs``, at most ``limit`` at once."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Any) -> None:
        async with gate:
            await job

    await asyncio.gather(*(one(job) for job in jobs))


def _configuration(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "discoveryHandler": {"name": "debugEcho",
                                 "discoveryDetails": "descriptions: [unused]\nshared: false\n"},
            "capacity": CAPACITY,
            "nodeSelector": {"matchLabels": {FOREIGN_LABEL: "true"}},
        },
    }


def _instance(namespace: str, configuration: Any, device: str, node: str) -> dict[str, Any]:
    """A local Instance as the publisher writes it (its node's label, owner, CDI name,
    properties, slots)."""
    meta = configuration.metadata
    digest = instance_digest(device, shared=False, node=node)
    name = instance_name_from_digest(meta.name, digest)
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {serves_label(node): LABEL_VALUE}, "ownerReferences": [{
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "name": meta.name,
            "uid": meta.uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": {
            "configurationName": meta.name, "cdiName": cdi_name(meta.name, digest),
            "capacity": CAPACITY, "shared": False, "nodes": [node],
            "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": device},
            "deviceUsage": {slot_id(name, i): "" for i in range(CAPACITY)},
        },
    }


async def create_fleet(client: AsyncClient, size: FleetSize, *, namespace: str) -> Fleet:
    """Nodes, Configurations and Instances (spread evenly over the nodes and Configurations);
    returns what was made and how long the Nodes and the Instances each took to write."""
    await client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    names = node_names(size.nodes)
    started = time.monotonic()
    await _bounded([client.create(Node.from_dict({"metadata": {
        "name": name, "labels": {FOREIGN_LABEL: "true"}}}), field_manager=FIELD_MANAGER)
        for name in names], CREATE_CONCURRENCY)
    nodes_s = time.monotonic() - started
    configurations = [
        await client.create(ConfigurationResource.from_dict(
            _configuration(namespace, f"fleet-c{i:03d}")), field_manager=FIELD_MANAGER)
        for i in range(size.configurations)
    ]
    bodies = [
        _instance(namespace, configurations[i % size.configurations], f"dev-{i:06d}",
                  names[i % size.nodes])
        for i in range(size.instances)
    ]
    started = time.monotonic()
    await _bounded([client.create(InstanceResource.from_dict(body),
                                  field_manager=FIELD_MANAGER) for body in bodies],
                   CREATE_CONCURRENCY)
    instances_s = time.monotonic() - started
    made = [FleetInstance(b["metadata"]["name"], b["spec"]["nodes"][0]) for b in bodies]
    return Fleet(namespace, made, nodes_s, instances_s)


class Churn:
    """Merge patches to fleet Instances at a fixed rate, alternating a slot taken or freed in
    ``spec.deviceUsage`` (as an Allocate writes it) and ``status.used``."""

    def __init__(self, client: AsyncClient, fleet: Fleet, *, rate: float, seed: int = 34) -> None:
        self.client = client
        self.fleet = fleet
        self.rate = rate
        self.writes = 0
        self.failures = 0
        self._random = random.Random(seed)
        self._used: dict[str, bool] = {}
        self._inflight: set[asyncio.Task[None]] = set()

    async def _write(self, index: int) -> None:
        target = self._random.choice(self.fleet.instances)
        taken = not self._used.get(target.name, False)
        self._used[target.name] = taken
        resource: Any
        if index % 2 == 0:
            resource = InstanceResource
            body: dict[str, Any] = {"spec": {"deviceUsage": {
                slot_id(target.name, 0): target.node if taken else ""}}}
        else:
            resource = InstanceResource.Status
            body = {"status": {"used": 1 if taken else 0}}
        try:
            await self.client.patch(resource, target.name, body, namespace=self.fleet.namespace,
                                    patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER)
            self.writes += 1
        except Exception:  # a benchmark's load: counted, not retried
            self.failures += 1

    async def run(self, seconds: float) -> None:
        """Issue ``rate`` writes a second for ``seconds`` (on a fixed schedule: a slow answer
        does not delay the next write), then wait for the last ones."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        count = int(seconds * self.rate)
        for index in range(count):
            delay = started + index / self.rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the churn's schedule, not a wait for a state
            task = asyncio.create_task(self._write(index))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        await asyncio.gather(*self._inflight)


@dataclass(frozen=True)
class ProcessReading:
    """One reading of a process: each thread's nanoseconds on a CPU (``thread_cpu_ns``), VmRSS
    KiB, and the bytes it has received from the API server over its open TCP connections
    (``ss``'s bytes_received: the watch streams are long-lived, so a window's difference is
    what the process was sent).

    The CPU of a window is taken thread by thread (``cpu_since``), not as the difference of
    two sums: a thread that ended between the readings would otherwise take its whole
    lifetime's CPU out of the window, and the sum could fall. Such a thread's CPU from the
    earlier reading to its end is not counted (the kernel keeps it only in the clock-tick
    totals of ``/proc/<pid>/stat``), so a window with ended threads (``ended_since``) reads
    low by at most what they spent in it; a thread that started within the window counts
    whole."""

    at: float
    threads: Mapping[int, int]
    rss_kib: int
    received: int

    @classmethod
    def of(cls, pid: int, received: Mapping[int, int]) -> ProcessReading:
        threads = thread_cpu_ns(pid)
        rss = 0
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return cls(time.monotonic(), threads, rss, received.get(pid, 0))

    def cpu_since(self, earlier: ProcessReading) -> float:
        """CPU seconds of the threads alive now since ``earlier`` (a thread id not in it, or
        one whose count went down, a reused id, is a new thread: counted whole)."""
        return cpu_seconds_between(earlier.threads, self.threads)

    def ended_since(self, earlier: ProcessReading) -> int:
        """Threads of ``earlier`` gone now (their last CPU is not in ``cpu_since``)."""
        return len(earlier.threads.keys() - self.threads.keys())

    def cpu_per_minute(self, earlier: ProcessReading) -> float:
        return self.cpu_since(earlier) * 60 / (self.at - earlier.at)

    def received_per_minute(self, earlier: ProcessReading) -> float:
        """Bytes a minute (0 when connections closed meanwhile took more than came)."""
        return max(0, self.received - earlier.received) * 60 / (self.at - earlier.at)


def received_from(plane: ControlPlane) -> dict[int, int]:
    """Per process id: bytes received on its open TCP connections to the API server."""
    return received_from_port(int(plane.server.rsplit(":", 1)[1]))


def received_from_port(port: int) -> dict[int, int]:
    """Per process id: bytes received on its open TCP connections to 127.0.0.1:``port``."""
    out = subprocess.run(["ss", "-tinpH", "dst", f"127.0.0.1:{port}"], check=True,
                         capture_output=True, text=True).stdout
    found: dict[int, int] = {}
    pid = None
    for line in out.splitlines():
        owner = _PID.search(line)
        if owner is not None:
            pid = int(owner.group(1))
            continue
        count = _RECEIVED.search(line)
        if pid is not None and count is not None:
            found[pid] = found.get(pid, 0) + int(count.group(1))
            pid = None
    return found


@dataclass(frozen=True)
class WatchEvents:
    """What the API server sent all watchers of Instances so far: events and their bytes."""

    events: float
    bytes: float
    watches: float = 0.0


def watch_events(plane: ControlPlane) -> WatchEvents:
    """``apiserver_watch_events_total`` and ``apiserver_watch_events_sizes_sum`` for
    edgeplug.io Instances, and its open Instance watches (``apiserver_longrunning_requests``),
    read from the API server's own /metrics."""
    request = urllib.request.Request(plane.server + "/metrics")
    request.add_header("Authorization", f"Bearer {plane.token}")
    context = ssl.create_default_context(cafile=str(plane.ca_cert))
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        text = response.read().decode()
    events = sizes = watches = 0.0
    for line in text.splitlines():
        if line.startswith("#") or 'group="edgeplug.io"' not in line:
            continue
        if "nstance" not in line:
            continue
        name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
        if name == "apiserver_watch_events_total":
            events += value
        elif name == "apiserver_watch_events_sizes_sum":
            sizes += value
        elif name == "apiserver_longrunning_requests" and 'verb="WATCH"' in line:
            watches += value
    return WatchEvents(events, sizes, watches)
