"""Run the edgeplug controller for tests as a real subprocess, and build its test objects.

For the controller's integration tests, end-to-end tests and benchmarks: the real ``python -m
controller.main`` (so it can be SIGKILLed and restarted, or run as two replicas), Configurations
and Instances built from a few parameters, and a way to wait on the API server until a condition
holds, failing with a message that says what was expected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.harness import hermetic
from tests.harness.controlplane import REPO_ROOT, ControlPlane

PEERING_CRDS = REPO_ROOT / "deploy" / "kopf-peering.yaml"
POLL_S = 0.1  # seconds between checks of a condition
DEADLINE_S = 30.0  # seconds a condition gets before the test fails
STOP_TIMEOUT_S = 10.0
#: Short intervals so tests see resyncs, grace periods and takeovers quickly.
FAST_ARGS: tuple[str, ...] = (
    "--resync-interval", "1",
    "--peering-lifetime", "4",
    "--orphan-instance-grace", "2",
    "--restart-backoff-base", "0.5",
    "--restart-backoff-max", "2",
    # Tests pin brokers to bare Node objects nobody heart-beats (the controller-manager marks
    # them NotReady after a while): they must not count as dead during a test session.
    "--node-not-ready-grace", "3600",
)
#: Bare Node objects the tests' Instances name (a node absent from the API counts as deleted).
TEST_NODES = ("n-1", "n-2")
API = "/apis/edgeplug.io/v1alpha1"


def wait_until(check: Callable[[], Any], *, what: str, deadline: float = DEADLINE_S) -> Any:
    """Polls ``check`` until it returns something truthy; fails naming ``what``."""
    until = time.monotonic() + deadline
    last: object = None
    while True:
        result = check()
        if result:
            return result
        last = result
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}; last: {last!r}")
        time.sleep(POLL_S)


def install_peering_crds(plane: ControlPlane) -> None:
    """The kopf peering CRDs, and the bare test nodes most controller tests pin brokers to."""
    ensure_nodes(plane)
    plane.kubectl("apply", "-f", str(PEERING_CRDS))
    for crd in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")


def ensure_nodes(plane: ControlPlane, names: Sequence[str] = TEST_NODES) -> None:
    """Bare Node objects (no kubelet behind them: brokers pinned there stay Pending)."""
    nodes = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}} for name in names
    ]}
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(nodes))


class ControllerProcess:
    """One controller replica as a subprocess, its log in ``log_path``."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        namespaces: Sequence[str],
        log_path: Path,
        priority: int | None = None,
        extra_args: Sequence[str] = FAST_ARGS,
        source: Path = REPO_ROOT,
    ) -> None:
        self.plane = plane
        self.source = source  # the directory its packages are imported from
        self.namespaces = tuple(namespaces)
        self.log_path = log_path
        self.priority = priority
        self.extra_args = tuple(extra_args)
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        args = [sys.executable, "-m", "controller.main", "--kubeconfig", str(self.plane.kubeconfig)]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        if self.priority is not None:
            args += ["--priority", str(self.priority)]
        args += list(self.extra_args)
        env = hermetic.controller_environment(
            {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "PYTHONUNBUFFERED": "1"})
        if self.source != REPO_ROOT:
            env["PYTHONPATH"] = str(self.source)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                args, cwd=self.source, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye to the peering object."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# -- objects ----------------------------------------------------------------------------------

def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def broker_pod_spec(*, image: str = "registry.example/broker:1", name: str = "broker") -> dict[
    str, Any
]:
    return {
        "containers": [
            {
                "name": name,
                "image": image,
                "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
            }
        ]
    }


def configuration(
    namespace: str,
    name: str,
    *,
    pod_spec: Mapping[str, Any] | None = None,
    job_spec: Mapping[str, Any] | None = None,
    instance_service: bool = False,
    configuration_service: bool = False,
    capacity: int = 1,
    handler: str = "debugEcho",
    details: str = "descriptions: [foo0]",
    properties: Sequence[Mapping[str, Any]] = (),
    grace: int | None = None,
) -> dict[str, Any]:
    """A Configuration (debugEcho unless ``handler`` says otherwise) with the given broker,
    services, ``discoveryProperties`` and ``offlineGracePeriodSeconds`` (``grace``)."""
    discovery: dict[str, Any] = {"name": handler, "discoveryDetails": details}
    if properties:
        discovery["discoveryProperties"] = [dict(p) for p in properties]
    spec: dict[str, Any] = {"discoveryHandler": discovery, "capacity": capacity}
    if grace is not None:
        spec["offlineGracePeriodSeconds"] = grace
    if pod_spec is not None:
        spec["brokerSpec"] = {"brokerPodSpec": dict(pod_spec)}
    if job_spec is not None:
        spec["brokerSpec"] = {"brokerJobSpec": dict(job_spec)}
    service = {"type": "ClusterIP", "ports": [{"name": "grpc", "port": 80, "targetPort": 8083}]}
    if instance_service:
        spec["instanceServiceSpec"] = service
    if configuration_service:
        spec["configurationServiceSpec"] = service
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def configuration_file(path: Path, name: str, handler: str, details: str) -> Path:
    """A Configuration's YAML as a user writes it for ``edgeplug discover -f`` (no namespace)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {"discoveryHandler": {"name": handler, "discoveryDetails": details}}}))
    return path


def secret_property(name: str, secret: str, key: str) -> dict[str, Any]:
    """A ``discoveryProperties`` entry whose value is a Secret's key."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def instance(
    namespace: str,
    name: str,
    *,
    configuration_name: str,
    nodes: Sequence[str],
    device_usage: Mapping[str, str] | None = None,
    shared: bool = True,
    capacity: int = 1,
) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Instance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"edgeplug.io/configuration": configuration_name},
        },
        "spec": {
            "configurationName": configuration_name,
            "cdiName": f"edgeplug.io/{configuration_name}={name[-6:]}",
            "capacity": capacity,
            "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "foo0"},
            "shared": shared,
            "nodes": list(nodes),
            "deviceUsage": dict(device_usage)
            if device_usage is not None
            else {f"{name}-{i}": "" for i in range(capacity)},
        },
    }


def apply(plane: ControlPlane, obj: Mapping[str, Any]) -> None:
    plane.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=test", "-f",
                  "-", stdin=json.dumps(obj))


def patch(plane: ControlPlane, kind: str, namespace: str, name: str, body: Mapping[str, Any],
          *, patch_type: str = "merge") -> None:
    plane.kubectl("patch", kind, name, "-n", namespace, "--type", patch_type, "-p",
                  json.dumps(body))


def items(plane: ControlPlane, path: str) -> list[dict[str, Any]]:
    found = plane.get_json(path)
    return list(found.get("items") or []) if found else []  # type: ignore[call-overload]


def broker_pods(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    selector = "app.kubernetes.io/component%3Dbroker,edgeplug.io/target-node"
    return items(plane, f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")


def get(plane: ControlPlane, path: str) -> dict[str, Any] | None:
    return plane.get_json(path)


def last_seen(plane: ControlPlane, namespace: str, priority: int) -> datetime | None:
    """When the controller of ``priority`` last heart-beat in the namespace's kopf peering
    object (None: it never peered there)."""
    body: Any = get(plane, f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/"
                           "edgeplug-controller") or {}
    for info in (body.get("status") or {}).values():
        if int(info.get("priority", 0)) == priority:
            return datetime.fromisoformat(str(info["lastseen"]))
    return None


def instance_path(namespace: str, name: str) -> str:
    return f"{API}/namespaces/{namespace}/instances/{name}"


def configuration_path(namespace: str, name: str) -> str:
    return f"{API}/namespaces/{namespace}/configurations/{name}"
