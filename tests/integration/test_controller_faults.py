"""The controller rides out an API outage of any length, and its standby takes over within
seconds with the default settings (real control plane, real controller processes)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane

#: Longer than kopf's default API retries (1+1+2+3+5+8+13+21 = 54 s), after which a controller
#: left at kopf's defaults failed its peering keep-alive and exited.
OUTAGE_S = 60.0
#: After the server is back, the controller must still heart-beat this much later (the old
#: controller exited about 10 s after the server returned).
STILL_ALIVE_AFTER_S = 20.0
POLL_S = 0.2
#: The default peering lifetime (5 s) plus a margin for a loaded machine; with the old default
#: (30 s) the standby took 23.5 s.
FAILOVER_DEADLINE_S = 12.0
PRIORITY_ACTIVE, PRIORITY_STANDBY = 200, 100
#: FAST_ARGS without their short peering lifetime: the failover test runs the defaults.
DEFAULT_PEERING_ARGS = tuple(
    arg for i, arg in enumerate(h.FAST_ARGS)
    if arg != "--peering-lifetime" and (i == 0 or h.FAST_ARGS[i - 1] != "--peering-lifetime")
)


def _peers(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    body: Any = h.get(plane, f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/"
                           "edgeplug-controller") or {}
    return dict(body.get("status") or {})


def _last_seen(plane: ControlPlane, namespace: str, priority: int) -> datetime | None:
    for info in _peers(plane, namespace).values():
        if int(info.get("priority", 0)) == priority:
            return datetime.fromisoformat(str(info["lastseen"]))
    return None


def _live_brokers(plane: ControlPlane, namespace: str) -> set[str]:
    return {p["metadata"]["labels"]["edgeplug.io/instance"] for p in h.broker_pods(plane, namespace)
            if not p["metadata"].get("deletionTimestamp")}


@pytest.mark.slow
def test_controller_rides_out_a_minute_long_api_outage(tmp_path: Path) -> None:
    with ControlPlane() as plane:
        h.install_peering_crds(plane)
        namespace = "outage"
        plane.kubectl("create", "namespace", namespace)
        ctl = h.ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log",
                                  priority=PRIORITY_ACTIVE).start()
        try:
            cfg = h.unique("cam")
            before, after = f"{cfg}-aaaaaa", f"{cfg}-bbbbbb"
            h.apply(plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec()))
            h.apply(plane, h.instance(namespace, before, configuration_name=cfg, nodes=["n-1"]))
            h.wait_until(lambda: _live_brokers(plane, namespace) == {before}, what="the broker")

            server_args = plane.stop_server("kube-apiserver")
            outage_ends = time.monotonic() + OUTAGE_S
            while time.monotonic() < outage_ends:  # the outage itself, watched throughout
                assert ctl.popen is not None
                assert ctl.popen.poll() is None, f"exited during the outage:\n{ctl.log_tail()}"
                time.sleep(POLL_S)
            plane.start_server("kube-apiserver", server_args)
            back = datetime.now(UTC)

            # It converges on what changed after the outage...
            h.apply(plane, h.instance(namespace, after, configuration_name=cfg, nodes=["n-1"]))
            plane.kubectl("delete", "instances.edgeplug.io", before, "-n", namespace)
            h.wait_until(lambda: _live_brokers(plane, namespace) == {after},
                         what="brokers following the Instances after the outage", deadline=60)
            # ...and keeps heart-beating in its peering object long after kopf's default
            # retries would have given up.
            h.wait_until(
                lambda: (seen := _last_seen(plane, namespace, PRIORITY_ACTIVE)) is not None
                and (seen - back).total_seconds() >= STILL_ALIVE_AFTER_S,
                what=f"a keep-alive {STILL_ALIVE_AFTER_S:.0f} s after the server's return",
                deadline=STILL_ALIVE_AFTER_S + 30,
            )
            assert ctl.popen is not None
            assert ctl.popen.poll() is None, f"the controller exited:\n{ctl.log_tail()}"
        finally:
            ctl.stop()
            print(f"--- controller log ---\n{ctl.log_tail(40)}")


def test_standby_takes_over_within_seconds_with_default_settings(
    peering: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    plane = peering
    active = h.ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "active.log",
                                 priority=PRIORITY_ACTIVE, extra_args=DEFAULT_PEERING_ARGS).start()
    standby = h.ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "standby.log",
                                  priority=PRIORITY_STANDBY, extra_args=DEFAULT_PEERING_ARGS)
    try:
        h.wait_until(lambda: _last_seen(plane, namespace, PRIORITY_ACTIVE), what="active peered")
        standby.start()
        h.wait_until(lambda: _last_seen(plane, namespace, PRIORITY_STANDBY), what="standby peered")
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
