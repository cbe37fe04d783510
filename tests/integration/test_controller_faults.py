"""The controller's standby takes over within seconds with the default settings (real control
plane, real controller processes). Riding out API outages longer than kopf's own retries is
tests/faults/test_api_outage.py's (35 s and 90 s, with the keep-alive checked after)."""

from __future__ import annotations

from pathlib import Path

from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

POLL_S = 0.2
#: The default peering lifetime (5 s) plus a margin for a loaded machine.
FAILOVER_DEADLINE_S = 12.0
PRIORITY_ACTIVE, PRIORITY_STANDBY = 200, 100
#: FAST_ARGS without their short peering lifetime: the failover test runs the defaults.
DEFAULT_PEERING_ARGS = tuple(
    arg for i, arg in enumerate(h.FAST_ARGS)
    if arg != "--peering-lifetime" and (i == 0 or h.FAST_ARGS[i - 1] != "--peering-lifetime")
)


def _live_brokers(plane: ControlPlane, namespace: str) -> set[str]:
    return {p["metadata"]["labels"]["edgeplug.io/instance"] for p in h.broker_pods(plane, namespace)
            if not p["metadata"].get("deletionTimestamp")}


def test_standby_takes_over_within_seconds_with_default_settings(
    peering: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    plane = peering
    active = h.ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "active.log",
                                 priority=PRIORITY_ACTIVE, extra_args=DEFAULT_PEERING_ARGS).start()
    standby = h.ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "standby.log",
                                  priority=PRIORITY_STANDBY, extra_args=DEFAULT_PEERING_ARGS)
    try:
        h.wait_until(lambda: h.last_seen(plane, namespace, PRIORITY_ACTIVE), what="active peered")
        standby.start()
        h.wait_until(lambda: h.last_seen(plane, namespace, PRIORITY_STANDBY), what="standby peered")
        h.wait_until(lambda: "every watch has listed" in standby.log_path.read_text(),
                     what="the standby's watches listed")
        cfg = h.unique("cam")
        first, second = f"{cfg}-111111", f"{cfg}-222222"
        h.apply(plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec()))
        h.apply(plane, h.instance(namespace, first, configuration_name=cfg, nodes=["n-1"]))
        h.wait_until(lambda: _live_brokers(plane, namespace) == {first}, what="the first broker")

        active.kill()
        h.apply(plane, h.instance(namespace, second, configuration_name=cfg, nodes=["n-1"]))
        h.wait_until(lambda: _live_brokers(plane, namespace) == {first, second},
                     what="the standby's broker for an Instance created after the kill",
                     deadline=FAILOVER_DEADLINE_S)
        # The standby logs the creation once the API server has answered it: the pod can be
        # seen a moment before the line is written.
        h.wait_until(lambda: f"created Pod {namespace}/{second}" in standby.log_path.read_text(),
                     what="the standby's log of creating the second broker")
    finally:
        active.stop()
        standby.stop()
        print(f"--- standby log ---\n{standby.log_tail(30)}")
