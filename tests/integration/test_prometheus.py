"""A real Prometheus (Debian's ``prometheus``) scrapes a real agent and controller while a
scenario runs; the alert expressions and the dashboard's queries are evaluated through its HTTP
API.

A metric's help text and an alert's PromQL are claims; this checks them against
what the processes really export. The scenario (tests/harness/monitoring_scenario.py) runs the
agent with its device plugins on the kubelet's own device manager (``DeviceNode``). The quiet
phase (healthy devices, one pod on an NPU slot, no broker asked for) must fire no alert; then a
debugEcho device is unplugged, a Configuration names a handler that does not exist, a broker is
refused by the API server, a failing admission webhook makes the API server answer the agent's
writes with 500, the API server restarts, and finally the controller is stopped: each alert's
``expr`` must then hold for the series the scenario produced (the ``for`` durations are left to
promtool's rule tests), and every dashboard panel's every query must return the series the
scenario should produce, with the values it should have.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest

from agent.metrics import ALLOCATE_BUCKETS
from tests.harness.controlplane import ControlPlane
from tests.harness.monitoring_scenario import NPUS, Stand, stand
from tests.harness.prometheus import alert_exprs, panel_queries

pytestmark = pytest.mark.timeout(400)


async def test_alerts_fire_in_their_scenario_and_the_dashboard_has_its_series(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with stand(control_plane, namespace, tmp_path) as s:
        try:
            await _scenario(s)
        except AssertionError as error:
            raise AssertionError(
                f"{error}\n--- agent log ---\n{(tmp_path / 'agent.log').read_text()[-3000:]}"
            ) from None


def _values(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}


async def _scenario(s: Stand) -> None:
    alerts = alert_exprs()
    q = s.q
    await s.quiet()
    for name, expr in alerts.items():
        assert q(expr) == [], f"{name} holds in the quiet run: {q(expr)}"

    unhealthy = await s.unplug()
    assert unhealthy[0]["metric"]["node"] == s.node_name
    assert unhealthy[0]["metric"]["configuration"] == "cams"

    failing = await s.missing_handler()
    assert {r["metric"]["configuration"] for r in failing} == {"nohandler"}

    without = await s.refused_broker()
    assert {r["metric"]["configuration"] for r in without} == {"refused"}
    down = await s.until("EdgeplugAgentDown", alerts["EdgeplugAgentDown"])
    assert {r["metric"]["node"] for r in down} == {s.lonely}

    refused_writes = await s.failing_webhook()
    assert _values(refused_writes, "code").keys() == {("500",)}
    restarted = await s.apiserver_restart()
    assert all(v > 0 for v in _values(restarted, "kind").values())

    # Every panel's every query has its series.
    await s.until("a discovery rate",
                  "sum by (handler) (rate(edgeplug_discovery_duration_seconds_count[5m])) > 0")
    panels = panel_queries()
    for title, exprs in panels.items():
        for expr in exprs:
            assert await s.prometheus.until(f"panel {title!r}: {expr}",
                                            functools.partial(q, expr)), title
    _check_fed_panels(s, panels)

    # The controller stopped: no active replica. The agent stopped: its node is down too.
    await s.stop_controller()
    assert q(alerts["EdgeplugPodsRefusedAtAdmission"]) == []  # the kubelet refused nothing


def _check_fed_panels(s: Stand, panels: dict[str, list[str]]) -> None:
    """The panels that need device plugins and API trouble show what the scenario did."""
    ns, q = s.namespace, s.q
    [slots] = panels["Slots used / capacity"]
    shown = _values(q(slots), "namespace", "configuration")
    # One pod holds one of the NPUs' two slots; nothing holds a camera's.
    assert shown[(ns, NPUS)] == 0.5, shown
    assert all(v == 0 for k, v in shown.items() if k != (ns, NPUS)), shown

    # One Allocate, answered: both quantiles lie in the bucket its duration fell in.
    [allocated] = q(f'edgeplug_allocations_total{{namespace="{ns}",configuration="{NPUS}",'
                    f'kind="configuration",outcome="ok"}}')
    assert float(allocated["value"][1]) == 1
    [spent] = q('edgeplug_allocate_duration_seconds_sum{outcome="ok"}')
    took = float(spent["value"][1])
    upper = next(b for b in (*ALLOCATE_BUCKETS, math.inf) if took <= b)
    lower = max((b for b in ALLOCATE_BUCKETS if b < took), default=0.0)
    for expr in panels["Allocate latency p50 / p99"]:
        [quantile] = q(expr)
        assert lower <= float(quantile["value"][1]) <= upper, (expr, quantile, took)

    errors, restarts = panels["API errors and watch restarts (5m)"]
    assert _values(q(errors), "code").get(("500",), 0) > 0, q(errors)
    assert any(v > 0 for v in _values(q(restarts), "kind").values()), q(restarts)
