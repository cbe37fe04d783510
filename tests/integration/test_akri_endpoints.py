"""Two handlers registered under one name on one node: both serve, neither takes the other's
devices away, and no registration loop starts between them.

Both are the Rust handler on Akri's own stack (tests/harness/akri_rust_handler), each on its
own Unix socket, one of them putting ``b-`` before its device ids so the user can tell whose
Instances are whose; devices are local, so a device dropped from the node's list would lose its
Instance at once. The name is a custom one, or ``debugEcho`` (whose built-in stands in until a
handler answers). The agent runs as ``agent.main.run_agent`` wires it, against the real control
plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from lightkube.resources.core_v1 import Event

from crds.naming import instance_name
from discovery_handlers.external.akriapi import discovery_pb2 as pb
from discovery_handlers.external.akriapi import discovery_pb2_grpc as pb_grpc
from tests.harness import agent_process as harness
from tests.harness.akri_agents import (
    AkriAgent,
    akri_agent,
    akri_configuration,
    all_online,
    instances_become,
    is_registered,
    logged,
    rust_handler,
)
from tests.harness.akri_rust_handler import RustHandler
from tests.harness.controlplane import ControlPlane
from tests.integration.test_akri_rust_handler import HANDLER_GRACE
from tests.integration.test_akri_rust_handler import handlers_dir as handlers_dir  # fixture

#: Warning Events a registered handler serving a built-in's name posts (one per set of
#: endpoints serving): not about any failure.
TAKEOVER = "in place of the built-in"


def _uids(found: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: item["metadata"]["uid"] for name, item in found.items()}


def _registrations(agent: AkriAgent, name: str) -> float | None:
    return agent.metrics.registry.get_sample_value(
        "edgeplug_discovery_handler_registrations_total", {"handler": name})


def _configuration(name: str, handler: str, description: str) -> dict[str, Any]:
    return akri_configuration(name, handler=handler,
                              details={"descriptions": [description], "shared": False})


async def _warnings(client: Any, namespace: str, configuration: str) -> list[str]:
    """The messages of the Warning Events on ``configuration``, but a takeover's."""
    return [e.message or "" async for e in client.list(
        Event, namespace=namespace, fields={"involvedObject.name": configuration})
        if e.type == "Warning" and TAKEOVER not in (e.message or "")]


@pytest.fixture(params=["akriMulti", "debugEcho"])
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def second(handlers_dir: Path, tmp_path: Path, name: str) -> Iterator[RustHandler]:
    """The second handler of the name (not started): its own socket, ``b-`` ids."""
    handler = RustHandler(handlers_dir, name=name, shared=False,
                          socket=handlers_dir / "second.sock", prefix="b-",
                          log_path=tmp_path / "second.log")
    yield handler
    handler.stop()
    print(f"--- second handler log ---\n{handler.log_tail()}")


async def test_two_handlers_of_one_name_both_serve_and_do_not_alternate(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    name: str, second: RustHandler,
) -> None:
    """A second handler registering the name at another socket adds its devices beside the
    first's (the first's Instance keeps its uid) and closes no stream: neither handler
    registers again (Akri's handlers do whenever the agent closes a stream of theirs), so the
    agent counts two registrations over a window in which both serve a second Configuration
    too, and no Warning Event is posted (but the notes of a built-in's name taken over)."""
    node = harness.new_node(control_plane)
    client = harness.api_client(control_plane)

    def instances(configuration: str, description: str) -> set[str]:
        return {instance_name(configuration, i, shared=False, node=node)
                for i in (description, f"b-{description}")}

    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=HANDLER_GRACE) as agent:
        d0 = instance_name("multi-a", "d0", shared=False, node=node)
        with rust_handler(handlers_dir, tmp_path, name=name, shared=False) as first:
            await harness.eventually(lambda: is_registered(agent, name), what="registered")
            harness.apply(control_plane, namespace, _configuration("multi-a", name, "d0"))
            before = await instances_become(client, namespace, {d0})
            second.start()
            both = await instances_become(client, namespace, instances("multi-a", "d0"))
            assert _uids(both)[d0] == _uids(before)[d0]

            # The window: a second Configuration of the name, served by both.
            harness.apply(control_plane, namespace, _configuration("multi-b", name, "e0"))
            everything = instances("multi-a", "d0") | instances("multi-b", "e0")
            after = await instances_become(client, namespace, everything)
            assert _uids(after)[d0] == _uids(before)[d0]
            assert await all_online(agent, namespace, everything)
            assert _registrations(agent, name) == 2
            for handler in (first, second):
                assert await logged(handler, "discover called", 2)
                assert not await logged(handler, "discover called", 3), handler.log_tail()
                assert not await logged(handler, "again", 1), handler.log_tail()
            for configuration in ("multi-a", "multi-b"):
                assert await _warnings(client, namespace, configuration) == []
    await client.close()


async def _register_early(directory: Path, name: str, socket: Path) -> None:
    """Register ``socket`` under the name, as a handler does that registers before it serves."""
    target = f"unix://{directory / 'agent-registration.sock'}"
    async with grpc.aio.insecure_channel(target) as channel:
        await pb_grpc.RegistrationStub(channel).RegisterDiscoveryHandler(
            pb.RegisterDiscoveryHandlerRequest(
                name=name, endpoint=str(socket),
                endpoint_type=pb.RegisterDiscoveryHandlerRequest.UDS, shared=False),
            timeout=10.0)


async def test_a_handler_registering_before_its_socket_answers_takes_nothing_away(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    name: str, second: RustHandler,
) -> None:
    """The second handler registers before anything listens on its socket: the agent says so
    (a Warning Event naming the socket) and the first handler's local Instance stays, online,
    with its uid; once the second serves there, its device is added and the first's Instance
    still has the same uid."""
    node = harness.new_node(control_plane)
    client = harness.api_client(control_plane)
    d0 = instance_name("multi", "d0", shared=False, node=node)
    b_d0 = instance_name("multi", "b-d0", shared=False, node=node)
    socket = handlers_dir / "second.sock"
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=HANDLER_GRACE) as agent:
        with rust_handler(handlers_dir, tmp_path, name=name, shared=False) as first:
            await harness.eventually(lambda: is_registered(agent, name), what="registered")
            harness.apply(control_plane, namespace, _configuration("multi", name, "d0"))
            before = await instances_become(client, namespace, {d0})
            await _register_early(handlers_dir, name, socket)

            async def told() -> list[str] | None:
                return [m for m in await _warnings(client, namespace, "multi")
                        if str(socket) in m and "the socket does not exist" in m] or None

            await harness.eventually(told, what="a Warning Event naming the silent socket")
            assert await all_online(agent, namespace, {d0})
            assert _uids(await harness.instances(client, namespace)) == _uids(before)

            second.start()  # it serves there now, and registers the same endpoint
            after = await instances_become(client, namespace, {d0, b_d0})
            assert _uids(after)[d0] == _uids(before)[d0]
            assert await all_online(agent, namespace, {d0, b_d0})
            assert await logged(first, "discover called", 1)
            assert not await logged(first, "discover called", 2), first.log_tail()
    await client.close()
