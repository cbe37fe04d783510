"""An Akri handler's device → allocatable, beside the same device through the built-in debugEcho.

What the out-of-process path costs. One node (the agent as
``python -m agent.main`` with device plugins, the emulated kubelet, the real control plane)
runs both: a Configuration naming ``akriEcho`` (the Go handler of tests/harness/akri_handler,
registered over the agent's socket, one gRPC ``Discover`` stream per Configuration) and one
naming the built-in ``debugEcho``, alternately, each with one new device. A sample is from the
Configuration's creation to the Node's allocatable showing its Instance's resource (both
watched), and to the Instance's creation. Prints medians and tails; asserts nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agent.discovery.akri_registration import HandlerRegistration
from agent.kube.client import ConfigurationResource
from agent.metrics import AgentMetrics
from crds.naming import instance_name, instance_resource_name
from discovery_handlers.debug_echo import handler as debug_echo
from discovery_handlers.external import stream
from tests.bench.bench_agent_setup import bench_node, quiet_logs
from tests.bench.stats import machine_speed_line, summary
from tests.harness.akri_go_handler import GoHandler
from tests.harness.controlplane import ControlPlane

RUNS = 20  # per side, after one warm-up each
HOP_RUNS = 200
REGISTER_DEADLINE_S = 30.0
EXTERNAL, BUILTIN = "akriEcho", "debugEcho"


def _configuration(name: str, namespace: str, handler: str, description: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"discoveryHandler": {
            "name": handler,
            "discoveryDetails": yaml.safe_dump({"descriptions": [description], "shared": False}),
        }},
    }


async def bench_external_vs_builtin(plane: ControlPlane) -> None:
    handlers_dir = Path(tempfile.mkdtemp(prefix="akb-", dir="/tmp"))
    env = {"DISCOVERY_HANDLERS_DIRECTORY": str(handlers_dir)}
    samples: dict[str, list[float]] = {EXTERNAL: [], BUILTIN: []}
    to_instance: dict[str, list[float]] = {EXTERNAL: [], BUILTIN: []}
    try:
        async with bench_node(plane, label="akri", env=env) as node:
            handler = GoHandler(handlers_dir, name=EXTERNAL, shared=False,
                                log_path=handlers_dir.parent / f"{handlers_dir.name}.log")
            handler.start()
            try:
                for run in range(RUNS + 1):
                    sides = (EXTERNAL, BUILTIN) if run % 2 == 0 else (BUILTIN, EXTERNAL)
                    for side in sides:
                        name, description = f"{side.lower()}-{run}", f"d{run}"
                        instance = instance_name(name, description, shared=False, node=node.name)
                        resource = instance_resource_name(instance)
                        body = ConfigurationResource.from_dict(
                            _configuration(name, node.namespace, side, description))

                        def allocatable(wanted: str = resource) -> bool:
                            return node.state.allocatable.get(wanted) == "1"

                        def published(wanted: str = instance) -> bool:
                            return wanted in node.state.instances

                        started = time.monotonic()
                        await node.client.create(body)
                        listed = await node.state.until(published, what=f"Instance {instance}")
                        seen = await node.state.until(allocatable, what=f"{resource} allocatable")
                        if run > 0:  # the first of each side warms the paths up
                            samples[side].append(seen - started)
                            to_instance[side].append(listed - started)
            finally:
                handler.stop()
    finally:
        shutil.rmtree(handlers_dir, ignore_errors=True)
    print(summary("Akri handler (Go, gRPC over UDS) Configuration -> Instance   ",
                  to_instance[EXTERNAL]))
    print(summary("built-in debugEcho              Configuration -> Instance   ",
                  to_instance[BUILTIN]))
    print(summary("Akri handler (Go, gRPC over UDS) Configuration -> allocatable",
                  samples[EXTERNAL]))
    print(summary("built-in debugEcho              Configuration -> allocatable",
                  samples[BUILTIN]))


async def bench_discover_hop() -> None:
    """The hop alone, no API server: dial the registered Go handler and read its first list
    (what a discovery run does when it starts), beside the built-in's first list."""
    handlers_dir = Path(tempfile.mkdtemp(prefix="akh-", dir="/tmp"))
    service = HandlerRegistration(directory=handlers_dir, grace=60.0, metrics=AgentMetrics())
    serving = asyncio.create_task(service.run())
    registered = service.registrations.changed(EXTERNAL)
    handler = GoHandler(handlers_dir, name=EXTERNAL)
    handler.start()
    details = yaml.safe_dump({"descriptions": ["d0"]})
    hop: list[float] = []
    builtin: list[float] = []
    try:
        await asyncio.wait_for(registered.wait(), REGISTER_DEADLINE_S)
        registration = service.registrations.get(EXTERNAL)
        assert registration is not None
        for _ in range(HOP_RUNS):
            started = time.monotonic()
            lists = stream.discover(registration, details, {})
            await anext(lists)
            hop.append(time.monotonic() - started)
            await lists.aclose()
            started = time.monotonic()
            echo = debug_echo.discover(debug_echo.parse_details(details, {}))
            await anext(echo)
            builtin.append(time.monotonic() - started)
            await echo.aclose()  # type: ignore[attr-defined]
    finally:
        handler.stop()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        shutil.rmtree(handlers_dir, ignore_errors=True)
    print(summary("dial + Discover -> first list (Go handler, UDS)", hop))
    print(summary("built-in debugEcho parse + first list         ", builtin))


async def _bench_with_plane() -> None:
    with ControlPlane() as plane:
        await bench_external_vs_builtin(plane)


def main(argv: list[str]) -> None:
    del argv
    quiet_logs()
    print(machine_speed_line())
    asyncio.run(bench_discover_hop())
    asyncio.run(_bench_with_plane())


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
