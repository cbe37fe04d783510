"""Brokers on the real node: fixtures, the agent beside the kubelet, a Configuration deployed.

Every real-node test (tests/e2e/test_realnode_*.py) needs the same few things:
a control plane with the Node authorizer, one started ``RealNode``, the agent as a process in
the node's mount namespace with its default paths, the controller, and a broker that is a
busybox shell proving from inside the container what it got (its env, ``/dev``, a device's
bytes), read back with ``kubectl logs``. A test module asks for ``plane`` and ``node`` (module
fixtures, offered by tests/e2e/conftest.py) and uses ``deployed``. Akri-style Deployments (a
plain pod template asking for an ``edgeplug.io/...`` resource) and their pods' states too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import hermetic
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pods,
    install_peering_crds,
)
from tests.harness.controlplane import REPO_ROOT, ControlPlane, running
from tests.harness.kube_waits import until
from tests.harness.realnode import RealNode
from tests.harness.realnode_images import BUSYBOX_IMAGE

#: The agent's path settings: unset, so it uses a node's defaults (the node's own paths: the
#: agent runs in the node's mount namespace, where they are the node's bind mounts).
AGENT_PATH_SETTINGS = tuple(s.variable for s in hermetic.PATH_SETTINGS)
#: What a broker prints before its own proof, and after it (then it sleeps).
ENV_MARK, END_MARK = "edgeplug-broker-env", "edgeplug-broker-end"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with running() as cp:
        install_peering_crds(cp)
        yield cp


@pytest.fixture(scope="module")
def node(plane: ControlPlane) -> Iterator[RealNode]:
    real = RealNode(plane, node_name=f"real-{uuid.uuid4().hex[:6]}")
    started = time.monotonic()
    real.start()
    print(f"figure: real node start -> Ready {time.monotonic() - started:.1f} s "
          "(binaries cached, images imported)")
    try:
        yield real
    finally:
        print(f"--- kubelet log ---\n{real.log_tail('kubelet', 30)}")
        print(f"--- containerd log ---\n{real.log_tail('containerd', 30)}")
        real.cleanup()


@dataclass(frozen=True)
class Broker:
    namespace: str
    instance: str
    pod: str
    agent_log: str  # the agent's log name on the node


def broker_spec(proof: str) -> dict[str, Any]:
    """A busybox broker that prints its env, runs ``proof`` (shell) and sleeps."""
    script = f"echo {ENV_MARK}; env | sort; {proof}; echo {END_MARK}; exec sleep 3600"
    return {
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "broker", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
        }],
    }


def start_agent(node: RealNode, plane: ControlPlane, broker: Broker, *,
                cdi_spec_dir: str | None = None, extra_env: Mapping[str, str] | None = None,
                net: bool = False, source: Path = REPO_ROOT) -> None:
    """The agent as a process beside the kubelet (the node's mount namespace, default paths;
    ``net``: the node's network namespace too, where ``RealNode.forward_api`` must serve;
    ``source``: the directory its packages are imported from, e.g. a previous release's)."""
    env = {k: v for k, v in os.environ.items() if k not in AGENT_PATH_SETTINGS}
    env.update({"NODE_NAME": node.node_name, "KUBECONFIG": str(plane.kubeconfig),
                "WATCH_NAMESPACE": broker.namespace, **(extra_env or {})})
    if cdi_spec_dir is not None:
        env["CDI_SPEC_DIR"] = cdi_spec_dir
    if source != REPO_ROOT:
        env["PYTHONPATH"] = str(source)
    node.spawn(broker.agent_log, [sys.executable, "-m", "agent.main"], env=env, cwd=source,
               net=net)


@contextlib.contextmanager
def deployed(plane: ControlPlane, node: RealNode, tmp_path: Path, configuration: dict[str, Any],
             instance: str, *, cdi_spec_dir: str | None = None,
             agent_env: Mapping[str, str] | None = None,
             before: Sequence[dict[str, Any]] = ()) -> Iterator[Broker]:
    """Agent beside the kubelet, controller, the ``before`` objects and ``configuration`` (their
    namespace is set here), whose broker for ``instance`` the test awaits; all stopped and the
    namespace deleted after."""
    namespace = f"rn-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    broker = Broker(namespace, instance, f"{instance}-{node.node_name}-pod",
                    f"agent-{namespace}")
    ctl = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    start_agent(node, plane, broker, cdi_spec_dir=cdi_spec_dir, extra_env=agent_env)
    ctl.start()
    try:
        for obj in (*before, configuration):  # ``before``: e.g. the Configuration's Secret
            obj["metadata"]["namespace"] = namespace
            apply(plane, obj)
        yield broker
    finally:
        ctl.stop()
        node.stop_process(broker.agent_log)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        print(f"--- agent log ---\n{node.log_tail(broker.agent_log, 30)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")


def pod(plane: ControlPlane, broker: Broker) -> dict[str, Any] | None:
    for found in broker_pods(plane, broker.namespace):
        if found["metadata"]["name"] == broker.pod:
            return found
    return None


def container_id(found: dict[str, Any] | None) -> str | None:
    """The broker's container id once it runs and is ready."""
    if found is None or found.get("status", {}).get("phase") != "Running":
        return None
    statuses = found["status"].get("containerStatuses") or []  # none for a moment: a reboot
    ready = [s for s in statuses if s.get("ready") and s.get("containerID")]
    return str(ready[0]["containerID"]) if len(ready) == 1 else None


async def running_container(plane: ControlPlane, broker: Broker) -> str:
    return await until(lambda: container_id(pod(plane, broker)),
                       what=f"broker {broker.pod} Running and ready", within=120)


async def broker_log(plane: ControlPlane, broker: Broker) -> str:
    """``kubectl logs`` of the broker once its proof is printed (API server -> kubelet)."""

    def logs() -> str | None:
        out = plane.kubectl("logs", "-n", broker.namespace, broker.pod, check=False).stdout
        return out if END_MARK in out else None

    out = await until(logs, what=f"{broker.pod}'s own output in kubectl logs")
    print(f"--- broker log (kubectl logs) ---\n{out}")
    return out


def logged_env(out: str) -> dict[str, str]:
    """The ``env`` the broker printed (between its first two marks)."""
    lines = out.split(ENV_MARK, 1)[1].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def allocates(node: RealNode, broker: Broker) -> int:
    """Allocate calls the agent answered for the broker's resource (its log says each)."""
    return sum(1 for line in node.log_tail(broker.agent_log, 100_000).splitlines()
               if "Allocate answered" in line and f"edgeplug.io/{broker.instance}" in line)


def create_error(plane: ControlPlane, broker: Broker) -> str | None:
    """The kubelet's message when the broker's container could not be created."""
    for status in (pod(plane, broker) or {}).get("status", {}).get("containerStatuses") or []:
        waiting = status.get("state", {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerError":
            return str(waiting.get("message", ""))
    return None


def akri_style_deployment(name: str, resource: str, replicas: int, *,
                          proof: str = "true") -> dict[str, Any]:
    """A plain Deployment (Akri's "Requesting Akri Resources"): busybox asking for
    ``resource: 1`` in its limits, no claim, printing its env, then running ``proof``
    (shell: e.g. reading the device it was given)."""
    script = f"echo {ENV_MARK}; env | sort; {proof}; echo {END_MARK}; exec sleep 3600"
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                        "resources": {"limits": {resource: "1"}},
                    }],
                },
            },
        },
    }


def app_pods(plane: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    """The pods labelled ``app=<app>`` (a Deployment's above)."""
    out = plane.kubectl("get", "pods", "-n", namespace, "-l", f"app={app}", "-o",
                        "json").stdout
    return list(json.loads(out)["items"])


def is_running(found: dict[str, Any]) -> bool:
    statuses = (found.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def refusal(found: dict[str, Any]) -> str | None:
    """The admission refusal a kubelet gave the pod (``UnexpectedAdmissionError`` and kin)."""
    status = found.get("status") or {}
    return str(status.get("reason")) if status.get("phase") == "Failed" else None


def is_unschedulable(found: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
               for c in (found.get("status") or {}).get("conditions") or [])
