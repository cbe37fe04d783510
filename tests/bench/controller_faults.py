"""The controller's faults, timed: an API server outage, and the active replica killed.

How long after an outage of N seconds the controller has converged, and how long after the
active replica dies its standby acts. Both are timed here from the user's side: the moment the
API server is ready again (or the active replica was killed), a new Instance is created, and the
time until its broker pod exists is the figure. Each part runs its own control plane and the
real controller processes, with peering on.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Final

from controller import naming
from tests.bench.stats import summary
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    configuration,
    get,
    install_peering_crds,
    instance,
    wait_until,
)
from tests.harness.controlplane import ControlPlane

NAMESPACE: Final = "bench-faults"
CONFIGURATION: Final = "faults"
#: Generous deadlines: a figure beyond them is a failure of the run, not a measurement.
BROKER_DEADLINE_S: Final = 120.0
POLL_S: Final = 0.02
#: Bare test nodes never turn Ready, and their brokers stay Pending: neither may be acted on.
QUIET_ARGS: Final = ("--pending-grace", "3600", "--node-not-ready-grace", "3600")
PEERING_PATH: Final = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings/edgeplug-controller"


def _broker_exists(plane: ControlPlane, name: str) -> bool:
    pod = naming.broker_pod_name(name, "n-1")
    return get(plane, f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}") is not None


def _time_new_broker(plane: ControlPlane, name: str, since: float) -> float:
    """Creates Instance ``name`` and returns the seconds from ``since`` until its broker."""
    apply(plane, instance(NAMESPACE, name, configuration_name=CONFIGURATION, nodes=["n-1"]))
    deadline = time.monotonic() + BROKER_DEADLINE_S
    while not _broker_exists(plane, name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no broker for {name} after {BROKER_DEADLINE_S}s")
        time.sleep(POLL_S)
    return time.monotonic() - since


def _setup(plane: ControlPlane) -> None:
    install_peering_crds(plane)
    plane.kubectl("create", "namespace", NAMESPACE)
    apply(plane, configuration(NAMESPACE, CONFIGURATION, pod_spec=broker_pod_spec()))


def outage(outage_s: float, runs: int) -> None:
    """API server down ``outage_s`` → a new Instance's broker, timed from the server's return."""
    samples: list[float] = []
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        _setup(plane)
        ctl = ControllerProcess(plane, namespaces=[NAMESPACE], log_path=Path(tmp) / "ctl.log",
                                extra_args=QUIET_ARGS).start()
        try:
            _time_new_broker(plane, "faults-warm00", time.monotonic())
            for run in range(runs):
                args = plane.stop_server("kube-apiserver")
                until = time.monotonic() + outage_s
                while time.monotonic() < until:  # the outage itself; the controller must live
                    if ctl.popen is not None and ctl.popen.poll() is not None:
                        raise RuntimeError(f"the controller exited during the outage:\n"
                                           f"{ctl.log_tail()}")
                    time.sleep(POLL_S * 10)
                plane.start_server("kube-apiserver", args)
                samples.append(_time_new_broker(plane, f"faults-out{run:03d}", time.monotonic()))
        finally:
            ctl.stop()
    print(summary(f"API server down {outage_s:.0f} s → new Instance's broker, from the server's"
                  " return", samples, unit="s", scale=1.0), flush=True)


def _peered(plane: ControlPlane, priority: int) -> bool:
    body: Any = get(plane, PEERING_PATH) or {}
    return any(int(p.get("priority", 0)) == priority for p in (body.get("status") or {}).values())


def _failover_once(plane: ControlPlane, tmp: Path, run: int) -> float:
    high, low = 200 + run, 100 + run
    active = ControllerProcess(plane, namespaces=[NAMESPACE], priority=high,
                               log_path=tmp / f"active{run}.log", extra_args=QUIET_ARGS).start()
    standby = ControllerProcess(plane, namespaces=[NAMESPACE], priority=low,
                                log_path=tmp / f"standby{run}.log", extra_args=QUIET_ARGS)
    try:
        wait_until(lambda: _peered(plane, high), what="the active replica peered")
        standby.start()
        wait_until(lambda: _peered(plane, low), what="the standby peered")
        wait_until(lambda: "every watch has listed" in standby.log_path.read_text(),
                   what="the standby's watches listed")
        _time_new_broker(plane, f"faults-warm{run:02d}", time.monotonic())
        active.kill()
        return _time_new_broker(plane, f"faults-fo{run:04d}", time.monotonic())
    finally:
        active.stop()
        standby.stop()


def failover(runs: int) -> None:
    """Active replica SIGKILLed → a new Instance's broker from the standby (default lifetime)."""
    samples: list[float] = []
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as tmp:
        _setup(plane)
        for run in range(runs):
            samples.append(_failover_once(plane, Path(tmp), run))
    print(summary("active replica killed → new Instance's broker from the standby", samples,
                  unit="s", scale=1.0), flush=True)
