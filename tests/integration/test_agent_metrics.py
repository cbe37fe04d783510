"""The agent's Prometheus endpoint says what a node operator looks for.

The agent runs as its own process (``python -m agent.main``, as the DaemonSet runs it) with
``METRICS_PORT`` set; the test scrapes ``/metrics`` over HTTP on loopback like Prometheus would.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane, free_port


@pytest.fixture
def metrics_agent(control_plane: ControlPlane, namespace: str) -> Iterator[tuple[str, int]]:
    node = harness.new_node(control_plane)
    port = free_port()
    agent = harness.AgentSubprocess(
        control_plane, node_name=node, namespace=namespace,
        extra_env={"METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"},
    )
    agent.start()
    try:
        yield node, port
    finally:
        agent.stop()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        body: bytes = response.read()
    return body.decode()


async def test_metrics_count_instances_and_discovery(
    control_plane: ControlPlane, namespace: str, metrics_agent: tuple[str, int]
) -> None:
    _node, port = metrics_agent
    harness.apply(control_plane, namespace,
                  harness.debug_echo_configuration("cams", descriptions=["cam0", "cam1", "cam2"]))
    instances_line = f'edgeplug_instances{{configuration="cams",namespace="{namespace}"}} 3.0'

    async def counted() -> str | None:
        try:
            text = _scrape(port)
        except OSError:
            return None  # the agent is still starting its metrics server
        return text if instances_line in text else None

    text = await harness.eventually(counted, what=f"'{instances_line}' on /metrics")
    assert 'edgeplug_discovery_duration_seconds_count{handler="debugEcho"}' in text
    # Every family an operator alerts on is exported, even before it has samples.
    for family, kind in [
        ("edgeplug_discovery_errors_total", "counter"), ("edgeplug_allocations_total", "counter"),
        ("edgeplug_slot_conflicts_total", "counter"),
        ("edgeplug_kubelet_registrations_total", "counter"),
    ]:
        assert f"# TYPE {family} {kind}" in text, family
