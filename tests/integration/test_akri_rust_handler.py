"""Akri's own kind of handler: Rust, serving gRPC with upstream tonic over hyper and h2.

h2 checks each request's ``:authority`` as RFC 9113 asks (grpc-go's server, the Go test
handler's, does not), so this is the handler that shows what the agent sends on the wire. The
handler (tests/harness/akri_rust_handler, built by cargo from its own copy of Akri's ``.proto``)
registers over the agent's real ``agent-registration.sock`` and serves ``Discover`` on its own
Unix socket; the agent runs as ``agent.main.run_agent`` wires it, against the real control
plane.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.events import condition_type
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness.akri_agents import (
    akri_agent,
    akri_configuration,
    condition_with,
    instances_become,
    is_registered,
    logged,
    rust_handler,
)
from tests.harness.controlplane import ControlPlane

#: The agent's grace for a lost handler: long, so that no registration is dropped in a test.
HANDLER_GRACE = 120.0


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
