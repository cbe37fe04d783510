"""Run the edgeplug agent for tests and the demo: in-process, or as a subprocess to SIGKILL.

The agent's integration tests and the demo all need the same few things: a
Node object for the agent to label, Configurations built from a few parameters, the agent
running (as a task, or as ``python -m agent.main`` for the restart test), and a way to wait on
the API server until a condition holds, failing with a message that says what was expected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from lightkube import ApiError, AsyncClient, KubeConfig

from agent.discovery.configuration_watch import ConfigurationWatch
from agent.discovery.node_devices import NodeDeviceTable
from agent.kube.client import InstanceResource, as_dict
from agent.metrics import AgentMetrics
from agent.settings import current, in_use
from tests.harness import hermetic
from tests.harness.aio_process import ChildProcess
from tests.harness.controlplane import ControlPlane

POLL_INTERVAL = 0.1  # seconds between checks of a condition
DEFAULT_DEADLINE = 20.0  # seconds a condition gets before the test fails
AGENT_EXIT_TIMEOUT = 10.0

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T | None]], *, what: str, deadline: float = DEFAULT_DEADLINE
) -> T:
    """Poll ``check`` until it returns something other than None/False; fail naming ``what``.

    An empty list or dict *is* an answer (some checks wait for a condition to be gone): a check
    waiting for something to appear returns None until it has (``... or None``).
    """
    until = time.monotonic() + deadline
    last: object = None
    while True:
        try:
            result = await check()
            if result is not None and result is not False:
                return result
            last = result
        except (ApiError, AssertionError, KeyError) as exc:
            last = exc
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {deadline}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(POLL_INTERVAL)


def debug_echo_configuration(
    name: str,
    *,
    descriptions: list[str],
    shared: bool = True,
    availability_file: Path | None = None,
    capacity: int = 1,
    grace: int | None = None,
    broker_properties: Mapping[str, str] | None = None,
    discovery_properties: list[dict[str, Any]] | None = None,
    node_selector: dict[str, Any] | None = None,
    raw_details: str | None = None,
    allocator: str | None = None,
) -> dict[str, Any]:
    """A debugEcho Configuration; ``allocator`` pins ``spec.allocator`` (``dra`` where no
    controller runs to choose one)."""
    details: dict[str, Any] = {"descriptions": descriptions, "shared": shared}
    if availability_file is not None:
        details["availabilityFile"] = str(availability_file)
    spec: dict[str, Any] = {
        "discoveryHandler": {
            "name": "debugEcho",
            "discoveryDetails": raw_details if raw_details is not None else yaml.safe_dump(details),
        },
        "capacity": capacity,
    }
    if grace is not None:
        spec["offlineGracePeriodSeconds"] = grace
    if broker_properties:
        spec["brokerProperties"] = dict(broker_properties)
    if discovery_properties:
        spec["discoveryHandler"]["discoveryProperties"] = discovery_properties
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if allocator is not None:
        spec["allocator"] = allocator
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": name},
        "spec": spec,
    }


def apply(cp: ControlPlane, namespace: str, *objects: Mapping[str, Any]) -> None:
    text = "\n---\n".join(json.dumps(obj) for obj in objects)
    cp.kubectl("apply", "-n", namespace, "-f", "-", stdin=text)


def create_node(cp: ControlPlane, name: str, labels: Mapping[str, str] | None = None) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                                                             "labels": dict(labels or {})}}
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(node))


def new_node(cp: ControlPlane, *, labels: Mapping[str, str] | None = None) -> str:
    """Create a Node object with a fresh name (no kubelet behind it); returns the name."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    create_node(cp, name, labels)
    return name


def api_client(cp: ControlPlane) -> AsyncClient:
    return AsyncClient(KubeConfig.from_file(str(cp.kubeconfig)))


async def instances(client: AsyncClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Every Instance in ``namespace``, by name, as plain dicts."""
    found = {}
    async for obj in client.list(InstanceResource, namespace=namespace):
        data = as_dict(obj)
        found[data["metadata"]["name"]] = data
    return found


@dataclass
class InProcessAgent:
    watch: ConfigurationWatch
    devices: NodeDeviceTable
    metrics: AgentMetrics
    client: AsyncClient
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def agent_in_process(
    cp: ControlPlane, *, node_name: str, namespace: str | None, resync_interval: float = 60.0
) -> AsyncIterator[InProcessAgent]:
    """The discovery side of one node's agent, running as a task of the test's loop."""
    client = api_client(cp)
    devices = NodeDeviceTable()
    metrics = AgentMetrics()
    tree = current()
    with in_use(replace(tree, discovery=replace(tree.discovery,
                                                resync_interval_s=resync_interval))):
        watch = ConfigurationWatch(client=client, node_name=node_name, namespace=namespace,
                                   devices=devices, metrics=metrics)
        agent = InProcessAgent(watch, devices, metrics, client)
        task = asyncio.create_task(watch.run(), name=f"agent-{node_name}")
    agent.tasks.append(task)
    try:
        yield agent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


class AgentSubprocess(ChildProcess):
    """``python -m agent.main`` with the given settings; ``kill()`` sends SIGKILL."""

    grace_s = AGENT_EXIT_TIMEOUT

    def __init__(self, cp: ControlPlane, *, node_name: str, namespace: str | None,
                 serve_device_plugins: bool = False, plugin_dir: Path | None = None,
                 log_path: Path | None = None,
                 extra_env: Mapping[str, str] | None = None,
                 python_args: Sequence[str] = ("-m", "agent.main"),
                 source: Path | None = None) -> None:
        """``python_args``: what the interpreter runs (another module that runs the agent);
        ``source``: the checkout it runs from (its packages come first on ``sys.path``), by
        default this one; a benchmark sets another commit's worktree to compare the two."""
        env = dict(os.environ)
        # No CDI specs, pod-resources, handler registration or kubelet certificate unless a
        # test asks (extra_env): their defaults are this machine's own directories, which the
        # check below refuses.
        env.update({"NODE_NAME": node_name, "KUBECONFIG": str(cp.kubeconfig),
                    "POD_RESOURCES_SOCKET": "", "CDI_SPEC_DIR": "",
                    "DISCOVERY_HANDLERS_DIRECTORY": "", "KUBELET_CLIENT_CERT": ""})
        if namespace:
            env["WATCH_NAMESPACE"] = namespace
        if plugin_dir is not None:
            env["PLUGIN_DIR"] = str(plugin_dir)
        if not serve_device_plugins:
            env["DEVICE_PLUGINS"] = "off"
        env.update(extra_env or {})
        hermetic.refuse_host_environment(env, what=f"the agent of {node_name}")
        self._env = env
        self._log_path = log_path
        self._python_args = tuple(python_args)
        self._source = source or Path(__file__).resolve().parents[2]
        self.process = None

    def start(self) -> None:
        out = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, *self._python_args], env=self._env, stdout=out, stderr=out,
            cwd=self._source,
        )

