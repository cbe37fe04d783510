"""On a real node: the agent as the DaemonSet from deploy/manifests, in the image ``make images``
builds, admitted and run by the real kubelet; a debugEcho broker then runs with its env.

Two things stand in for a cluster's parts: no registry (the agent's OCI archive is imported
into the node's containerd, tagged as the manifest names it) and no kube-proxy (the node's
pods, host-network ones included, live in the node's network namespace, where
tests/harness/realnode_forward.py makes the API server reachable on 127.0.0.1:<its port>; the
DaemonSet is given that address in ``KUBERNETES_SERVICE_HOST``/``PORT``, which a pod's own env
overrides). The manifests are otherwise applied as they are.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crds.naming import instance_name
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controller_process import ControllerProcess, apply
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.kube_waits import until
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    Broker,
    broker_log,
    broker_spec,
    logged_env,
    running_container,
)

pytestmark = pytest.mark.timeout(1500)
MANIFESTS = REPO_ROOT / "deploy" / "manifests"
ARCHIVE = REPO_ROOT / "build" / "images" / "edgeplug-agent.oci.tar"
AGENT_NAMESPACE = "edgeplug-system"
BUILD_TIMEOUT_S = 840
TERMINATION_MESSAGE = "/tmp/termination-log"  # /tmp: the DaemonSet's emptyDir


@pytest.fixture(scope="module")
def agent_archive() -> Path:
    """The full agent image, through ``make images`` (nothing to do when it is up to date)."""
    done = subprocess.run(["make", "--no-print-directory", "images", "AGENT_HANDLER_SETS=all"],
                          cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"make images failed:\n{done.stderr[-4000:]}"
    assert ARCHIVE.is_file(), f"make images wrote no {ARCHIVE}"
    return ARCHIVE


@pytest.fixture(scope="module")
def node(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    # The DaemonSet's DirectoryOrCreate host path the machine lacks: the node's own.
    udev = tmp_path_factory.mktemp("node-udev")
    real = RealNode(plane, node_name=f"ds-{uuid.uuid4().hex[:6]}", host_dirs={"/run/udev": udev})
    real.start()
    try:
        yield real
    finally:
        print(f"--- kubelet log ---\n{real.log_tail('kubelet', 30)}")
        real.cleanup()


def _manifests(port: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for name in ("namespace.yaml", "agent-rbac.yaml", "agent-node-policy.yaml",
                 "agent-instance-policy.yaml", "agent-daemonset.yaml"):
        objects += [o for o in yaml.safe_load_all((MANIFESTS / name).read_text()) if o]
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    [agent] = daemonset["spec"]["template"]["spec"]["containers"]
    agent["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)}]
    # Found by this test: the manifest mounts the host's /dev read-only over /dev, so the
    # kubelet's default terminationMessagePath (/dev/termination-log) is a bind mount runc
    # cannot create and the agent never started on a runc node. The manifest now says /tmp.
    assert agent["terminationMessagePath"] == TERMINATION_MESSAGE
    return objects


def _image_name() -> str:
    """The image the DaemonSet runs (as the manifest names it)."""
    objects = yaml.safe_load_all((MANIFESTS / "agent-daemonset.yaml").read_text())
    [daemonset] = [o for o in objects if o and o["kind"] == "DaemonSet"]
    return str(daemonset["spec"]["template"]["spec"]["containers"][0]["image"])


def _archive_ref(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        [name] = [n for n in tar.getnames() if n.lstrip("./") == "index.json"]
        member = tar.extractfile(name)
        assert member is not None
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])


def _agent_pod(plane: ControlPlane, node: str) -> dict[str, Any] | None:
    found = plane.get_json(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods"
                           f"?fieldSelector=spec.nodeName%3D{node}")
    pods: list[dict[str, Any]] = list((found or {}).get("items") or [])  # type: ignore[call-overload]
    return pods[0] if pods else None


async def test_the_agent_daemonset_runs_on_the_real_node_and_serves_a_broker(
    plane: ControlPlane, node: RealNode, agent_archive: Path, tmp_path: Path,
) -> None:
    image = _image_name()
    ref = _archive_ref(agent_archive)
    node.ctr("images", "import", "--base-name", image.rsplit(":", 1)[0], str(agent_archive))
    if f"{image.rsplit(':', 1)[0]}:{ref}" != image:
        node.ctr("images", "tag", f"{image.rsplit(':', 1)[0]}:{ref}", image)
    port = node.forward_api()
    for obj in _manifests(port):
        apply(plane, obj)

    def agent_running() -> dict[str, Any] | None:
        found = _agent_pod(plane, node.node_name)
        statuses = (found or {}).get("status", {}).get("containerStatuses") or []
        return found if statuses and statuses[0].get("ready") else None

    agent = await until(agent_running, what="the agent DaemonSet's pod ready on the real node",
                        within=180)
    assert agent["spec"]["hostNetwork"] is True

    namespace = f"ds-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    cfg = debug_echo_configuration("echo", descriptions=["ds0"], shared=False)
    cfg["metadata"]["namespace"] = namespace
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
    inst = instance_name("echo", "ds0", shared=False, node=node.node_name)
    broker = Broker(namespace, inst, f"{inst}-{node.node_name}-pod", "")
    ctl = ControllerProcess(plane, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    ctl.start()
    try:
        apply(plane, cfg)
        await running_container(plane, broker)
        env = logged_env(await broker_log(plane, broker))
        assert env["DEBUG_ECHO_DESCRIPTION"] == "ds0", "the CDI env from the DaemonSet's agent"
    finally:
        ctl.stop()
        logs = plane.kubectl("logs", "-n", AGENT_NAMESPACE, agent["metadata"]["name"],
                             "--tail=30", check=False)
        print(f"--- agent pod log ---\n{logs.stdout}{logs.stderr}")
