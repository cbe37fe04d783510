"""A discovery run's report never ends the run when the API server cannot be reached.

Found at the end of a fresh-machine run: a run reporting invalid details met a dropped
connection (httpx's ReadError), the error escaped the reporter, and the run ended with it. Here
the reporter writes to a real TCP port nothing listens on (connection refused, as while the API
server restarts): the report is logged and the call returns.
"""

from __future__ import annotations

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
