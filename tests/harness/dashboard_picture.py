"""``python -m tests.harness.dashboard_picture OUT.svg``: the dashboard as a real run draws it.

Why this exists: docs/operations.md shows deploy/monitoring/dashboard.json with data, and no
Grafana runs here. This starts what tests/integration/test_prometheus.py starts (a real control
plane, the agent and the controller as processes, Debian's Prometheus scraping both every
second), runs that test's scenario in stages (two healthy debugEcho devices; one unplugged; a
Configuration naming a missing handler; a broker the API server refuses on a node without an
agent; the controller stopped; the agent stopped), holding each stage ``HOLD_S`` seconds so the
plots show it, then asks Prometheus' ``query_range`` for every panel's expressions over the run
and writes one SVG through tests/harness/dashboard_svg.py.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import agent_process as agents
from tests.harness import controller_process as controllers
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.dashboard_svg import Series, legend, points, render
from tests.harness.prometheus import DASHBOARD, Prometheus, alert_exprs

NAMESPACE = "factory"
HOLD_S = 20.0  # how long each stage stays on the plots (a picture's pacing, not a wait)
STEP_S = 2.0


def _hold(prometheus: Prometheus) -> None:
    """Leave the stage running for ``HOLD_S``, checking that Prometheus still runs."""
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        assert prometheus.process.poll() is None, prometheus.log.read_text()[-3000:]
        time.sleep(1)


def _scenario(cp: ControlPlane, node: str, lonely: str, offline: Path, prometheus: Prometheus,
              agent: agents.AgentSubprocess, controller: controllers.ControllerProcess) -> None:
    alerts = alert_exprs()
    q = prometheus.query
    agents.apply(cp, NAMESPACE, agents.debug_echo_configuration(
        "cams", descriptions=["cam0", "cam1"], availability_file=offline, grace=3600))
    prometheus.wait("two healthy devices", lambda: q(
        f'edgeplug_devices{{namespace="{NAMESPACE}",health="healthy"}} == 2'))
    prometheus.wait("the controller active", lambda: q("edgeplug_controller_active == 1"))
    _hold(prometheus)

    staged = offline.with_name("offline.new")
    staged.write_text("cam1\n")
    staged.replace(offline)
    prometheus.wait("a device unhealthy", lambda: q(alerts["EdgeplugDeviceUnhealthy"]))
    _hold(prometheus)

    bad = agents.debug_echo_configuration("nohandler", descriptions=["x"])
    bad["spec"]["discoveryHandler"]["name"] = "noSuchHandler"
    agents.apply(cp, NAMESPACE, bad)
    prometheus.wait("discovery failing", lambda: q(alerts["EdgeplugDiscoveryFailing"]))
    _hold(prometheus)

    pod_spec = controllers.broker_pod_spec()
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    controllers.apply(cp, controllers.configuration(NAMESPACE, "refused", pod_spec=pod_spec))
    controllers.apply(cp, controllers.instance(
        NAMESPACE, "refused-abcdef", configuration_name="refused", nodes=[lonely]))
    prometheus.wait("a broker refused", lambda: q(
        f'edgeplug_broker_refusals_total{{configuration="refused",namespace="{NAMESPACE}"}} > 0'))
    _hold(prometheus)

    controller.stop()
    prometheus.wait("no active controller", lambda: q(alerts["EdgeplugNoActiveController"]))
    _hold(prometheus)
    agent.stop()
    prometheus.wait("the agent's scrape failing", lambda: q('up{job="agent"} == 0'))
    _hold(prometheus)


def picture(plane: ControlPlane, workdir: Path) -> str:
    """Runs the scenario against ``plane`` and returns the dashboard's SVG."""
    plane.kubectl("create", "namespace", NAMESPACE)
    node = agents.new_node(plane)
    lonely = agents.new_node(plane)
    agent_port, controller_port = free_port(), free_port()
    offline = workdir / "offline"
    offline.write_text("")
    agent = agents.AgentSubprocess(
        plane, node_name=node, namespace=NAMESPACE, log_path=workdir / "agent.log",
        extra_env={"METRICS_PORT": str(agent_port), "METRICS_ADDRESS": "127.0.0.1"})
    controller = controllers.ControllerProcess(
        plane, namespaces=[NAMESPACE], log_path=workdir / "controller.log",
        extra_args=(*controllers.FAST_ARGS, "--metrics-port", str(controller_port),
                    "--metrics-address", "127.0.0.1"))
    prometheus = Prometheus(workdir, {"agent": agent_port, "controller": controller_port})
    controllers.install_peering_crds(plane)
    start = time.time()
    agent.start()
    controller.start()
    try:
        _scenario(plane, node, lonely, offline, prometheus, agent, controller)
        end = time.time()
        dashboard = json.loads(DASHBOARD.read_text())
        data: dict[str, list[Series]] = {}
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            series = data.setdefault(panel["title"], [])
            for target in panel["targets"]:
                for result in prometheus.query_range(target["expr"], start, end, STEP_S):
                    series.append(Series(legend(target.get("legendFormat", ""),
                                                result["metric"]), points(result["values"])))
        return render(dashboard, data, start, end)
    finally:
        agent.stop()
        controller.stop()
        prometheus.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.harness.dashboard_picture OUT.svg", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ep-dash-", dir="/tmp"))
    try:
        with ControlPlane() as plane:
            svg = picture(plane, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    Path(argv[0]).write_text(svg)
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
