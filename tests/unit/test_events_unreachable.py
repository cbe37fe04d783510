"""A discovery run's report never ends the run when the API server cannot be reached, and
never takes a write it did not see answered for one not made.

Found at the end of a fresh-machine run: a run reporting invalid details met a dropped
connection (httpx's ReadError), the error escaped the reporter, and the run ended with it. Here
the reporter writes to a real TCP port nothing listens on (connection refused, as while the API
server restarts): the report is logged and the call returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.discovery.events import ConfigurationReporter
from crds.configuration import Configuration


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_problem_reported_while_the_api_server_is_away_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = AsyncClient(KubeConfig.from_dict({
        "clusters": [{"name": "away", "cluster": {"server": f"http://127.0.0.1:{_closed_port()}"}}],
        "users": [{"name": "agent", "user": {"token": "t"}}],
        "contexts": [{"name": "away", "context": {"cluster": "away", "user": "agent"}}],
        "current-context": "away",
    }))
    configuration = Configuration.from_object({
        "metadata": {"name": "cam", "namespace": "factory", "uid": "u1", "generation": 1},
        "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": "x"}},
    })
    reporter = ConfigurationReporter(client=client, node_name="node-a",
                                     configuration=configuration)
    caplog.set_level(logging.WARNING, logger="agent.discovery.events")
    try:
        await reporter.problem("InvalidDetails", "descriptions: required")
    finally:
        await client.close()
    failures = [r.getMessage() for r in caplog.records if "could not report" in r.getMessage()]
    assert len(failures) == 1, failures
    assert "factory/cam" in failures[0]
    assert "ConnectError" in failures[0]


async def test_warnings_whose_write_was_cancelled_in_flight_are_withdrawn_all_the_same() -> None:
    """A run stopped while its warnings' write was in flight (the API server may have applied
    it) still withdraws them: the reporter does not take an unanswered write for one not made.
    The server here answers every request but the warnings' write, which it holds."""
    bodies: list[dict[str, object]] = []
    held = asyncio.Event()
    answer = b'{"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration"}'

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = json.loads(await reader.readexactly(length))
            bodies.append(body)
            if body.get("status"):
                held.set()
                await asyncio.Event().wait()  # never answered
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncClient(KubeConfig.from_dict({
        "clusters": [{"name": "slow", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "agent", "user": {"token": "t"}}],
        "contexts": [{"name": "slow", "context": {"cluster": "slow", "user": "agent"}}],
        "current-context": "slow",
    }))
    configuration = Configuration.from_object({
        "metadata": {"name": "npus", "namespace": "farm", "uid": "u1", "generation": 1},
        "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": "x"}},
    })
    reporter = ConfigurationReporter(client=client, node_name="node-a",
                                     configuration=configuration)
    try:
        await reporter.warnings([])  # the run's first call: nothing to warn of, written once
        writing = asyncio.create_task(reporter.warnings(["health unknown"]))
        await held.wait()  # the warnings' write has reached the server
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        await reporter.warnings([])  # the run stops: its warnings are over
    finally:
        await client.close()
        server.close()
    assert len(bodies) == 3, "the withdrawal was never written"
    assert (bodies[0]["status"], bodies[2]["status"]) == ({}, {})
    assert "health unknown" in json.dumps(bodies[1]["status"])
