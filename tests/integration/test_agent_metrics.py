"""The agent's Prometheus endpoint says what a node operator looks for, and a metric means what
its help text says.

The agent runs as its own process (``python -m agent.main``, as the DaemonSet runs it) with
``METRICS_PORT`` set; the test scrapes ``/metrics`` over HTTP on loopback like Prometheus would.
The discovery-pass test runs the agent's discovery side in-process to read its registry.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
    # The pass is observed when its list has been handled, which is after its Instances are
    # counted: a scrape in between shows the 3 Instances and no pass yet, so wait for both.
    pass_line = 'edgeplug_discovery_duration_seconds_count{handler="debugEcho"}'

    async def counted() -> str | None:
        try:
            text = _scrape(port)
        except OSError:
            return None  # the agent is still starting its metrics server
        return text if instances_line in text and pass_line in text else None

    text = await harness.eventually(counted, what=f"'{instances_line}' and '{pass_line}' "
                                    "on /metrics")
    # Every family an operator alerts on is exported, even before it has samples.
    for family, kind in [
        ("edgeplug_discovery_errors_total", "counter"), ("edgeplug_allocations_total", "counter"),
        ("edgeplug_slot_conflicts_total", "counter"),
        ("edgeplug_kubelet_registrations_total", "counter"),
    ]:
        assert f"# TYPE {family} {kind}" in text, family


#: How long the device stays plugged in between the two lists: no pass runs meanwhile, so none
#: may count it (the scenario's pacing, not a wait for something).
PLUGGED_S = 2.0


async def test_a_discovery_pass_is_one_list_handled_not_the_wait_for_the_next(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """``edgeplug_discovery_duration_seconds`` counts one pass per device list, from the list's
    arrival (the run's start for the first) to its publish; the wait for a change is no pass.
    Each pass lies inside a window the test measures around it: from the apply (or the file
    write) until the pass is counted."""
    offline = tmp_path / "offline"
    offline.write_text("")
    node = harness.new_node(control_plane)
    labels = {"handler": "debugEcho"}
    async with harness.agent_in_process(control_plane, node_name=node,
                                        namespace=namespace) as agent:
        get = agent.metrics.registry.get_sample_value

        async def passes(count: int) -> bool:
            return get("edgeplug_discovery_duration_seconds_count", labels) == count

        applied = time.monotonic()
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "cams", descriptions=["cam0", "cam1"], shared=False, availability_file=offline))
        await harness.eventually(lambda: passes(1), what="the first pass counted")
        first_window = time.monotonic() - applied
        assert get("edgeplug_instances", {"namespace": namespace, "configuration": "cams"}) == 2

        await asyncio.sleep(PLUGGED_S)
        unplugged = time.monotonic()
        offline.write_text("cam1\n")
        await harness.eventually(lambda: passes(2), what="the second pass counted")
        second_window = time.monotonic() - unplugged
        assert get("edgeplug_instances", {"namespace": namespace, "configuration": "cams"}) == 1

        spent = get("edgeplug_discovery_duration_seconds_sum", labels)
        assert spent is not None
        assert spent <= first_window + second_window, (
            f"{spent:.3f} s counted in two passes that took at most "
            f"{first_window:.3f} + {second_window:.3f} s (the {PLUGGED_S} s between them is "
            f"no pass)")
