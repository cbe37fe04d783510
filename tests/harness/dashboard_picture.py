"""``python -m tests.harness.dashboard_picture OUT.svg``: the dashboard as a real run draws it.

Docs/operations.md shows deploy/monitoring/dashboard.json with data, and no
Grafana runs here. This runs tests/integration/test_prometheus.py's scenario
(tests/harness/monitoring_scenario.py: a real control plane, the kubelet's own device manager,
the agent and the controller as processes, Debian's Prometheus scraping both every second)
stage by stage, holding each stage ``HOLD_S`` seconds so the plots show it, then asks
Prometheus' ``query_range`` for every panel's expressions over the run and writes one SVG
through tests/harness/dashboard_svg.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.harness.controlplane import ControlPlane
from tests.harness.dashboard_svg import Series, legend, points, render
from tests.harness.monitoring_scenario import Stand, stand
from tests.harness.prometheus import DASHBOARD

NAMESPACE = "factory"
HOLD_S = 20.0  # how long each stage stays on the plots (a picture's pacing, not a wait)
STEP_S = 2.0


async def _hold(s: Stand) -> None:
    """Leave the stage running for ``HOLD_S``, checking that Prometheus still runs."""
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        assert s.prometheus.process.poll() is None, s.prometheus.log.read_text()[-3000:]
        await asyncio.sleep(1)


async def _scenario(s: Stand) -> None:
    for stage in (s.quiet, s.unplug, s.missing_handler, s.refused_broker, s.failing_webhook,
                  s.apiserver_restart, s.stop_controller, s.stop_agent):
        await stage()
        await _hold(s)


async def picture(plane: ControlPlane, workdir: Path) -> str:
    """Runs the scenario against ``plane`` and returns the dashboard's SVG."""
    plane.kubectl("create", "namespace", NAMESPACE)
    start = time.time()
    async with stand(plane, NAMESPACE, workdir) as s:
        await _scenario(s)
        end = time.time()
        dashboard = json.loads(DASHBOARD.read_text())
        data: dict[str, list[Series]] = {}
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            series = data.setdefault(panel["title"], [])
            for target in panel["targets"]:
                for result in s.prometheus.query_range(target["expr"], start, end, STEP_S):
                    series.append(Series(legend(target.get("legendFormat", ""),
                                                result["metric"]), points(result["values"])))
        return render(dashboard, data, start, end)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.harness.dashboard_picture OUT.svg", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ep-dash-", dir="/tmp"))
    try:
        with ControlPlane() as plane:
            svg = asyncio.run(picture(plane, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    Path(argv[0]).write_text(svg)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
