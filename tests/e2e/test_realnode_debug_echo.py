"""On a real node (the kubelet itself, containerd 2, runc, CNI): a debugEcho broker really runs.

The agent runs as on a node, beside the kubelet in the node's mount namespace with its default
paths (device plugins in /var/lib/kubelet/device-plugins, CDI specs in /var/run/cdi); the
controller creates the broker pod; the real kubelet admits it, calls the agent's Allocate and
has containerd create the container, which resolves the agent's CDI name from its spec. What
the container got is read from inside it: ``kubectl logs`` of a busybox broker that prints its
env. Then the kubelet restarts: the plugin registers again and the container keeps running.
A CDI name without a spec (the agent writing specs where the runtime does not look) fails the
container's creation, as on a real node.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crds.naming import instance_name
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pods,
    install_peering_crds,
)
from tests.harness.controlplane import REPO_ROOT, ControlPlane, running
from tests.harness.kube_waits import until
from tests.harness.realnode import API_SERVER_ARGS, RealNode
from tests.harness.realnode_images import BUSYBOX_IMAGE

#: A first start pulls nothing but builds the node's binaries once (minutes, cached after).
pytestmark = pytest.mark.timeout(1500)
#: The agent's path settings: unset, so it uses a node's defaults (the node's own paths).
AGENT_PATH_SETTINGS = ("PLUGIN_DIR", "POD_RESOURCES_SOCKET", "CDI_SPEC_DIR")
PROOF = "sh -c 'echo edgeplug-broker-env; env | sort; echo edgeplug-broker-dev; ls -l /dev; " \
        "exec sleep 3600'"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with running(apiserver_args=API_SERVER_ARGS) as cp:
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


def _namespace(plane: ControlPlane) -> str:
    name = f"rn-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", name)
    return name


def _agent(node: RealNode, plane: ControlPlane, broker: Broker, *,
           cdi_spec_dir: str | None) -> None:
    """The agent as a process beside the kubelet (the node's mount namespace, default paths)."""
    env = {k: v for k, v in os.environ.items() if k not in AGENT_PATH_SETTINGS}
    env.update({"NODE_NAME": node.node_name, "KUBECONFIG": str(plane.kubeconfig),
                "WATCH_NAMESPACE": broker.namespace})
    if cdi_spec_dir is not None:
        env["CDI_SPEC_DIR"] = cdi_spec_dir
    node.spawn(broker.agent_log, [sys.executable, "-m", "agent.main"], env=env, cwd=REPO_ROOT)


def _configuration(namespace: str, name: str, description: str) -> dict[str, Any]:
    cfg = debug_echo_configuration(name, descriptions=[description], shared=False)
    cfg["metadata"]["namespace"] = namespace
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "broker", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", PROOF.removeprefix("sh -c '").removesuffix("'")],
            "resources": {"limits": {"{{PLACEHOLDER}}": "1"}},
        }],
    }}
    return cfg


def _pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    for pod in broker_pods(plane, namespace):
        if pod["metadata"]["name"] == name:
            return pod
    return None


def _container_id(pod: dict[str, Any] | None) -> str | None:
    if pod is None or pod.get("status", {}).get("phase") != "Running":
        return None
    [status] = pod["status"]["containerStatuses"]
    return str(status["containerID"]) if status.get("ready") else None


@contextlib.contextmanager
def _deployed(plane: ControlPlane, node: RealNode, tmp_path: Path, name: str, description: str,
              *, cdi_spec_dir: str | None = None) -> Iterator[Broker]:
    """Agent beside the kubelet, controller, and a debugEcho Configuration whose broker is the
    busybox proof; everything stopped and the namespace deleted afterwards."""
    namespace = _namespace(plane)
    inst = instance_name(name, description, shared=False, node=node.node_name)
    broker = Broker(namespace, inst, f"{inst}-{node.node_name}-pod", f"agent-{namespace}")
    ctl = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    _agent(node, plane, broker, cdi_spec_dir=cdi_spec_dir)
    ctl.start()
    try:
        apply(plane, _configuration(namespace, name, description))
        yield broker
    finally:
        ctl.stop()
        node.stop_process(broker.agent_log)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        print(f"--- agent log ---\n{node.log_tail(broker.agent_log, 30)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")


async def test_broker_runs_with_its_env_and_survives_a_kubelet_restart(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    started = time.monotonic()
    with _deployed(plane, node, tmp_path, "echo", "foo0") as broker:
        container = await until(lambda: _container_id(_pod(plane, broker.namespace, broker.pod)),
                                what=f"broker {broker.pod} Running and ready", within=120)
        print(f"figure: Configuration applied -> broker Running on the real node "
              f"{time.monotonic() - started:.1f} s")

        def logs() -> str | None:
            out = plane.kubectl("logs", "-n", broker.namespace, broker.pod, check=False).stdout
            return out if "edgeplug-broker-dev" in out else None

        out = await until(logs, what="the broker's own output in kubectl logs")
        print(f"--- broker log (kubectl logs) ---\n{out}")
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert env["DEBUG_ECHO_DESCRIPTION"] == "foo0", "the CDI spec's env, set by containerd"
        assert env["EDGEPLUG_INSTANCE"] == broker.instance
        assert any(node.host_path("/var/run/cdi").iterdir()), \
            "the agent wrote its CDI spec in the node's own /var/run/cdi"
        allocates = _allocates(node, broker)
        assert allocates == 1

        restarted = time.monotonic()
        node.restart_kubelet()
        await until(lambda: node.resource_registered(f"edgeplug.io/{broker.instance}"),
                    what="the plugin registered with the restarted kubelet", within=60)
        print(f"figure: kubelet restart -> plugin re-registered "
              f"{time.monotonic() - restarted:.1f} s")
        assert _container_id(_pod(plane, broker.namespace, broker.pod)) == container, \
            "the same container ran on through the kubelet restart"
        assert _allocates(node, broker) == allocates, "no second Allocate for the running pod"


def _allocates(node: RealNode, broker: Broker) -> int:
    """Allocate calls the agent answered for the broker's resource (its log says each)."""
    return sum(1 for line in node.log_tail(broker.agent_log, 100_000).splitlines()
               if "Allocate answered" in line and f"edgeplug.io/{broker.instance}" in line)


async def test_a_cdi_name_without_a_spec_fails_the_container(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    # The agent writes its specs into a directory the node's containerd does not read.
    with _deployed(plane, node, tmp_path, "nospec", "bar0",
                   cdi_spec_dir=str(tmp_path / "elsewhere")) as broker:

        def create_failed() -> str | None:
            pod = _pod(plane, broker.namespace, broker.pod)
            for status in (pod or {}).get("status", {}).get("containerStatuses") or []:
                waiting = status.get("state", {}).get("waiting") or {}
                if waiting.get("reason") == "CreateContainerError":
                    return str(waiting.get("message", ""))
            return None

        message = await until(create_failed, what=f"{broker.pod}: CreateContainerError",
                              within=120)
        print(f"--- the kubelet's reason ---\n{message}")
        assert "unresolvable CDI devices edgeplug.io/nospec=" in message
        assert any((tmp_path / "elsewhere").iterdir()), "the spec exists, where nobody looks"
        assert _pod(plane, broker.namespace, broker.pod)["status"]["phase"] == "Pending"  # type: ignore[index]
