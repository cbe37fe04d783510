"""Akri's own kind of handler: Rust, serving gRPC with upstream tonic over hyper and h2.

h2 checks each request's ``:authority`` as RFC 9113 asks (grpc-go's server, the Go test
handler's, does not), so this is the handler that shows what the agent sends on the wire. The
handler (tests/harness/akri_rust_handler, built by cargo from its own copy of Akri's ``.proto``)
registers over the agent's real ``agent-registration.sock`` and serves ``Discover`` on its own
Unix socket; the agent runs as ``agent.main.run_agent`` wires it, against the real control
plane.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.discovery.events import condition_type, health_condition_type
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness.akri_agents import (
    INSTANCE_GRACE,
    akri_agent,
    akri_configuration,
    all_online,
    condition_with,
    instances_become,
    is_registered,
    logged,
    properties_matching,
    rust_handler,
)
from tests.harness.controlplane import ControlPlane

#: The agent's grace for a lost handler: long, so that no registration is dropped in a test.
HANDLER_GRACE = 120.0
#: Tries of a refusing handler that span the Instances' offline grace: at 0, 0.25, 0.75, 1.75,
#: 3.75 and 7.75 s (the backoff doubles), the last past ``INSTANCE_GRACE``.
TRIES_PAST_THE_INSTANCE_GRACE = 6
REFUSAL = "this handler refuses every Discover"


@pytest.fixture
def handlers_dir() -> Iterator[Path]:
    """A discovery-handlers directory of the test's own (short: socket paths fit 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="akri-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_tonic_handler_on_a_unix_socket_serves(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """The agent's channel to a handler on a Unix socket sends a valid authority: gRPC's
    default there, the socket's path, is refused by h2 with RST_STREAM before the handler
    sees the call (the agent reported INTERNAL, and no device ever came)."""
    node = harness.new_node(control_plane)
    cfg = akri_configuration("akri-rust", handler="akriRust", details={"descriptions": ["r0"]})
    r0 = instance_name("akri-rust", "r0", shared=True, node=node)
    client = harness.api_client(control_plane)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=HANDLER_GRACE) as agent:
        harness.apply(control_plane, namespace, cfg)
        with rust_handler(handlers_dir, tmp_path, name="akriRust") as handler:
            await harness.eventually(lambda: is_registered(agent, "akriRust"),
                                     what="the Rust handler registered")
            found = await instances_become(client, namespace, {r0})
            assert found[r0]["spec"]["brokerProperties"] == {
                "DEBUG_ECHO_DESCRIPTION": "r0", "HANDLER_STACK": "rust-tonic"}
            assert await logged(handler, "discover called", 1)
            await condition_with(client, namespace, "akri-rust", condition_type(node), None)
    await client.close()


async def test_a_handler_that_never_answers_leaves_the_built_in_serving_until_one_does(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Akri's debugEcho DaemonSet deployed on a node where the built-in serves: while its
    handler refuses every Discover, the built-in's devices stay (their Instances outlive the
    offline grace several times over), this node's DiscoveryHealthy condition and one log
    line say why, and the tries back off. Once a handler answers, it takes over, under the
    same Instance."""
    caplog.set_level(logging.WARNING)
    node = harness.new_node(control_plane)
    cfg = harness.debug_echo_configuration("echo", descriptions=["foo0"], grace=INSTANCE_GRACE)
    foo0 = instance_name("echo", "foo0", shared=True, node=node)
    client = harness.api_client(control_plane)
    health = health_condition_type(node)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=HANDLER_GRACE) as agent:
        harness.apply(control_plane, namespace, cfg)
        before = await instances_become(client, namespace, {foo0})
        uid = before[foo0]["metadata"]["uid"]
        with rust_handler(handlers_dir, tmp_path, name="debugEcho", refuse=REFUSAL) as refusing:
            waiting = await condition_with(client, namespace, "echo", health,
                                           "has not answered Discover")
            assert REFUSAL in waiting["message"]
            assert "the built-in 'debugEcho' serves on this node until it does" in waiting[
                "message"]
            await harness.eventually(
                lambda: logged(refusing, "discover called", TRIES_PAST_THE_INSTANCE_GRACE),
                what=f"{TRIES_PAST_THE_INSTANCE_GRACE} refused Discover calls",
                deadline=30.0)
            assert await all_online(agent, namespace, {foo0}), "the built-in's device stays"
            assert agent.properties(namespace, foo0) == {"DEBUG_ECHO_DESCRIPTION": "foo0"}
            after = await harness.instances(client, namespace)
            assert {n: i["metadata"]["uid"] for n, i in after.items()} == {foo0: uid}
            await condition_with(client, namespace, "echo", condition_type(node), None)
            lines = [r.getMessage() for r in caplog.records if "has not answered" in
                     r.getMessage()]
            assert len(lines) == 1, lines
        with rust_handler(handlers_dir, tmp_path, name="debugEcho"):
            await properties_matching(agent, namespace, foo0,
                                      lambda p: p.get("HANDLER_STACK") == "rust-tonic")
            serving = await condition_with(client, namespace, "echo", health,
                                           "in place of the built-in 'debugEcho'")
            assert "has not answered" not in serving["message"]
            after = await harness.instances(client, namespace)
            assert {n: i["metadata"]["uid"] for n, i in after.items()} == {foo0: uid}
    await client.close()
