"""An agent hosting Akri's handler registration, the Go and Rust test handlers, and the waits
their tests share (tests/integration/test_akri_handlers.py, test_akri_rust_handler.py, the e2e
and the bench).

Every test of the Akri protocol starts the agent as ``run_agent`` wires it with
a discovery-handlers directory, runs the Go handler against it, and waits for Instances, node
devices and conditions; those parts live here once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.discovery.node_devices import NodeDeviceTable
from agent.kube.client import ConfigurationResource, as_dict
from agent.main import run_agent
from agent.metrics import AgentMetrics
from agent.settings import DEFAULT_PLUGIN_DIR, AgentSettings, DiscoverySettings
from tests.harness import agent_process as harness
from tests.harness import hermetic
from tests.harness.aio_process import task_running
from tests.harness.akri_go_handler import GoHandler
from tests.harness.akri_rust_handler import RustHandler
from tests.harness.controlplane import ControlPlane

#: offlineGracePeriodSeconds of the tests' Configurations: long enough to see Instances kept.
INSTANCE_GRACE = 6


@dataclass
class AkriAgent:
    """What a test reads of a running agent: its node device table and its metrics."""

    devices: NodeDeviceTable
    metrics: AgentMetrics
    directory: Path

    def registered(self, handler: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "edgeplug_discovery_handlers_registered", {"handler": handler})

    def properties(self, namespace: str, instance: str) -> dict[str, str] | None:
        served = self.devices.snapshot().get((namespace, instance))
        return dict(served.device.properties) if served is not None else None


@contextlib.asynccontextmanager
async def akri_agent(
    cp: ControlPlane, *, node: str, namespace: str, directory: Path, grace: float,
    plugin_dir: Path | None = None,
) -> AsyncIterator[AkriAgent]:
    """The whole agent as ``run_agent`` wires it; device plugins only with a ``plugin_dir``."""
    settings = AgentSettings(
        node_name=node, kubeconfig=cp.kubeconfig, namespace=namespace,
        serve_device_plugins=plugin_dir is not None, discovery_handlers_dir=directory,
        discovery=DiscoverySettings(external_handler_grace_s=grace), pod_resources_socket=None,
        plugin_dir=plugin_dir if plugin_dir is not None else DEFAULT_PLUGIN_DIR,
    )
    hermetic.refuse_host_paths(settings, what=f"the agent of {node}")
    agent = AkriAgent(NodeDeviceTable(), AgentMetrics(), directory)
    async with task_running(run_agent(settings, devices=agent.devices, metrics=agent.metrics)):
        await harness.eventually(
            lambda: _exists(directory / "agent-registration.sock"),
            what="the agent's registration socket",
        )
        yield agent


async def _exists(path: Path) -> bool:
    return os.path.exists(path)  # noqa: ASYNC240 (one stat, polled)


@contextlib.contextmanager
def go_handler(directory: Path, tmp_path: Path, **kwargs: Any) -> Iterator[GoHandler]:
    handler = GoHandler(directory, log_path=tmp_path / "handler.log", **kwargs)
    handler.start()
    try:
        yield handler
    finally:
        handler.stop()
        print(f"--- handler log ---\n{handler.log_tail()}")


@contextlib.contextmanager
def rust_handler(directory: Path, tmp_path: Path, **kwargs: Any) -> Iterator[RustHandler]:
    handler = RustHandler(directory, log_path=tmp_path / "rust-handler.log", **kwargs)
    handler.start()
    try:
        yield handler
    finally:
        handler.stop()
        print(f"--- rust handler log ---\n{handler.log_tail()}")


@contextlib.asynccontextmanager
async def agent_with_handler(
    cp: ControlPlane, *, node: str, namespace: str, directory: Path, tmp_path: Path,
    configuration: dict[str, Any], handler: str, grace: float,
) -> AsyncIterator[tuple[AkriAgent, GoHandler]]:
    """The in-process agent (``akri_agent``), ``configuration`` applied once it is up, and the
    Go handler ``handler`` registering with it (``go_handler``): the usual order of a test."""
    async with akri_agent(cp, node=node, namespace=namespace, directory=directory,
                          grace=grace) as agent:
        harness.apply(cp, namespace, configuration)
        with go_handler(directory, tmp_path, name=handler) as running:
            yield agent, running


def akri_configuration(name: str, *, handler: str, details: dict[str, Any],
                       properties: list[dict[str, Any]] | None = None,
                       grace: int = INSTANCE_GRACE) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "discoveryHandler": {"name": handler, "discoveryDetails": yaml.safe_dump(details)},
        "offlineGracePeriodSeconds": grace,
    }
    if properties:
        spec["discoveryHandler"]["discoveryProperties"] = properties
    return {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
            "metadata": {"name": name}, "spec": spec}


async def instances_become(
    client: Any, namespace: str, expected: set[str], *, deadline: float = 30.0
) -> dict[str, dict[str, Any]]:
    async def there() -> dict[str, dict[str, Any]] | None:
        found = await harness.instances(client, namespace)
        return found if set(found) == expected else None

    if not expected:
        async def gone() -> bool:
            return not await harness.instances(client, namespace)

        await harness.eventually(gone, what="no Instances", deadline=deadline)
        return {}
    return await harness.eventually(there, what=f"Instances {sorted(expected)}",
                                    deadline=deadline)


async def condition_with(client: Any, namespace: str, name: str, kind: str,
                     containing: str | None) -> dict[str, Any]:
    """Wait for condition ``kind`` to hold ``containing`` in its message (None: to be gone)."""
    async def found() -> dict[str, Any] | None:
        cfg = as_dict(await client.get(ConfigurationResource, name, namespace=namespace))
        conditions = {c["type"]: c for c in (cfg.get("status") or {}).get("conditions") or []}
        condition = conditions.get(kind)
        if containing is None:
            return {} if condition is None else None
        return condition if condition and containing in condition["message"] else None

    return await harness.eventually(found, what=f"{kind} with {containing!r}")


async def is_registered(agent: AkriAgent, name: str) -> bool:
    return agent.registered(name) == 1


async def logged(handler: GoHandler | RustHandler, text: str, times: int) -> bool:
    return sum(text in line for line in handler.log_tail(200).splitlines()) >= times


async def served_device(agent: AkriAgent, namespace: str, instance: str) -> Any:
    async def device() -> Any:
        served = agent.devices.snapshot().get((namespace, instance))
        return served.device if served is not None else None

    return await harness.eventually(device, what=f"{instance} in the node's device table")


async def properties_matching(agent: AkriAgent, namespace: str, instance: str,
                      wanted: Any) -> dict[str, str]:
    async def matching() -> dict[str, str] | None:
        props = agent.properties(namespace, instance)
        return props if props is not None and wanted(props) else None

    return await harness.eventually(matching, what=f"{instance}'s properties")


async def all_offline(agent: AkriAgent, namespace: str, names: set[str]) -> bool:
    table = agent.devices.snapshot()
    return all((namespace, n) in table and not table[(namespace, n)].health.healthy
               for n in names)


async def all_online(agent: AkriAgent, namespace: str, names: set[str]) -> bool:
    table = agent.devices.snapshot()
    return all((namespace, n) in table and table[(namespace, n)].health.healthy for n in names)
