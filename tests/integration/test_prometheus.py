"""A real Prometheus (Debian's ``prometheus``) scrapes a real agent and controller while a
scenario runs; the alert expressions and the dashboard's queries are evaluated through its HTTP
API.

Why this exists: a metric's help text and an alert's PromQL are claims; this checks them against
what the processes really export. The quiet phase (one healthy device, no broker asked for) must
fire no alert; then a debugEcho device is unplugged (its availability file), a Configuration names
a handler that does not exist, a Configuration's broker is refused by the API server, and finally
the agent and the controller are stopped: each alert's ``expr`` must then hold for the series the
scenario produced (the ``for`` durations are left to promtool's rule tests). Prometheus runs from
a directory of the test's own (config, storage), on a free loopback port, and is stopped at the
end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import agent_process as agents
from tests.harness import controller_process as controllers
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.prometheus import Prometheus, alert_exprs, panel_queries

#: Panels this scenario cannot feed, and why: the agent runs without device plugins (no slots,
#: no Allocate), nothing is refused at admission by a kubelet (there is none), and the API server
#: answers every request (no errors; watch restarts only happen when it ends a watch).
NOT_FED = {"Slots used / capacity", "Allocate latency p50 / p99",
           "API errors and watch restarts (5m)"}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def test_alerts_fire_in_their_scenario_and_the_dashboard_has_its_series(
    control_plane: ControlPlane, namespace: str, workdir: Path
) -> None:
    node = agents.new_node(control_plane)
    lonely = agents.new_node(control_plane)  # Instances list it; no agent runs there
    agent_port, controller_port = free_port(), free_port()
    offline = workdir / "offline"
    offline.write_text("")
    agent = agents.AgentSubprocess(
        control_plane, node_name=node, namespace=namespace, log_path=workdir / "agent.log",
        extra_env={"METRICS_PORT": str(agent_port), "METRICS_ADDRESS": "127.0.0.1"})
    controller = controllers.ControllerProcess(
        control_plane, namespaces=[namespace], log_path=workdir / "controller.log",
        extra_args=(*controllers.FAST_ARGS, "--metrics-port", str(controller_port),
                    "--metrics-address", "127.0.0.1"))
    prometheus = Prometheus(workdir, {"agent": agent_port, "controller": controller_port})
    controllers.install_peering_crds(control_plane)
    agent.start()
    controller.start()
    try:
        _scenario(control_plane, namespace, node, lonely, offline, prometheus, agent, controller)
    finally:
        agent.stop()
        controller.stop()
        prometheus.stop()


def _scenario(cp: ControlPlane, namespace: str, node: str, lonely: str, offline: Path,
              prometheus: Prometheus, agent: agents.AgentSubprocess,
              controller: controllers.ControllerProcess) -> None:
    alerts = alert_exprs()
    q = prometheus.query
    # Quiet: one Configuration, two healthy devices, no broker asked for.
    agents.apply(cp, namespace, agents.debug_echo_configuration(
        "cams", descriptions=["cam0", "cam1"], availability_file=offline, grace=3600))
    prometheus.wait("two healthy devices", lambda: [
        r for r in q(f'edgeplug_devices{{namespace="{namespace}",health="healthy"}} == 2')])
    prometheus.wait("the controller active", lambda: q("edgeplug_controller_active == 1"))
    prometheus.wait("the node's Instances counted",
                    lambda: q(f'edgeplug_node_instances{{node="{node}"}} == 2'))
    for name, expr in alerts.items():
        assert q(expr) == [], f"{name} holds in the quiet run: {q(expr)}"

    # A device unplugged (shared: it stays, unhealthy, for its grace).
    staged = offline.with_name("offline.new")
    staged.write_text("cam1\n")
    staged.replace(offline)
    unhealthy = prometheus.wait("EdgeplugDeviceUnhealthy",
                                lambda: q(alerts["EdgeplugDeviceUnhealthy"]))
    assert unhealthy[0]["metric"]["node"] == node
    assert unhealthy[0]["metric"]["configuration"] == "cams"

    # A handler that does not exist.
    bad = agents.debug_echo_configuration("nohandler", descriptions=["x"])
    bad["spec"]["discoveryHandler"]["name"] = "noSuchHandler"
    agents.apply(cp, namespace, bad)
    failing = prometheus.wait("EdgeplugDiscoveryFailing",
                              lambda: q(alerts["EdgeplugDiscoveryFailing"]))
    assert {r["metric"]["configuration"] for r in failing} == {"nohandler"}

    # A broker the API server refuses (requests above limits), on an Instance of the lonely node.
    pod_spec = controllers.broker_pod_spec()
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    controllers.apply(cp, controllers.configuration(namespace, "refused", pod_spec=pod_spec))
    controllers.apply(cp, controllers.instance(
        namespace, "refused-abcdef", configuration_name="refused", nodes=[lonely]))
    without = prometheus.wait("EdgeplugConfigurationWithoutBrokers",
                              lambda: q(alerts["EdgeplugConfigurationWithoutBrokers"]))
    assert {r["metric"]["configuration"] for r in without} == {"refused"}
    prometheus.wait("a refusal counted", lambda: q(
        f'edgeplug_broker_refusals_total{{configuration="refused",namespace="{namespace}"}} > 0'))
    down = prometheus.wait("EdgeplugAgentDown", lambda: q(alerts["EdgeplugAgentDown"]))
    assert {r["metric"]["node"] for r in down} == {lonely}

    # Every panel the scenario feeds has its series.
    prometheus.wait("a discovery rate", lambda: q(
        "sum by (handler) (rate(edgeplug_discovery_duration_seconds_count[5m])) > 0"))
    for title, exprs in panel_queries().items():
        if title in NOT_FED:
            continue
        for expr in exprs:
            assert prometheus.wait(f"panel {title!r}: {expr}", lambda e=expr: q(e)), title

    # The controller stopped: no active replica. The agent stopped: its node is down too.
    controller.stop()
    prometheus.wait("EdgeplugNoActiveController", lambda: q(alerts["EdgeplugNoActiveController"]))
    assert q(alerts["EdgeplugPodsRefusedAtAdmission"]) == []  # no kubelet refused anything
