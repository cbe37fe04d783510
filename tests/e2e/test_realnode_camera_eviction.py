"""On two real nodes, a camera that goes away moves the Deployment's pod that used it to the
other camera (the DRA default, ``spec.unhealthyDevices.evictAfterSeconds``).

Two real nodes (kubelet, containerd, runc), each with its agent (``DRA=on``) and one controller
(``--dra``). Two shared debugEcho devices stand for two network cameras every node sees (as
ONVIF cameras on the nodes' network are); ``offlineGracePeriodSeconds`` keeps a camera that
went away listed, unhealthy, long enough for the Configuration's 2 s eviction grace. A
Deployment of one replica takes a camera through a ResourceClaimTemplate. Its camera goes away:
the controller taints the device ``NoExecute`` once the grace is over, the device taint
eviction controller deletes the pod, the ReplicaSet makes another, and the new container runs
with the other camera's env. Judged by what the containers print.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from crds import dra
from tests.e2e.test_realnode_akri_dra import pod_env
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    Broker,
    akri_style_deployment,
    app_pods,
    is_running,
    refusal,
    start_agent,
)

pytestmark = pytest.mark.timeout(600)
CAMERAS = ("cam0", "cam1")
EVICT_AFTER_S = 2
#: Long enough that a camera gone stays listed (unhealthy) past the eviction grace.
OFFLINE_GRACE_S = 120
DEADLINE_S = 90.0


def _viewer(template: str) -> dict[str, Any]:
    """A Deployment of one busybox printing its env, its camera through a claim template."""
    deployment = akri_style_deployment("viewer", "unused", 1)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["resources"] = {"claims": [{"name": "camera"}]}
    pod["resourceClaims"] = [{"name": "camera", "resourceClaimTemplateName": template}]
    return deployment


def _live_running(plane: ControlPlane, ns: str) -> list[dict[str, Any]]:
    pods = app_pods(plane, ns, "viewer")
    assert not [p["metadata"]["name"] for p in pods if refusal(p)], "refused at admission"
    return [p for p in pods if is_running(p) and not p["metadata"].get("deletionTimestamp")]


async def test_a_camera_gone_moves_its_deployments_pod_to_the_other_camera(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    other = RealNode(plane, node_name=f"real-{uuid.uuid4().hex[:6]}")
    other.start()
    ns = f"cams-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    agent_log = f"agent-{ns}"
    broker = Broker(ns, "", "", agent_log)
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    offline = tmp_path / "offline"  # debugEcho: the cameras listed here are gone
    try:
        await wait_service_account(kube, ns)
        for each in (node, other):
            start_agent(each, plane, broker, extra_env={"DRA": "on"})
        ctl.start()
        cfg = debug_echo_configuration("cams", descriptions=list(CAMERAS), shared=True,
                                       availability_file=offline, grace=OFFLINE_GRACE_S)
        cfg["spec"]["unhealthyDevices"] = {"evictAfterSeconds": EVICT_AFTER_S}
        h.apply(plane, ns, cfg, h.claim_template("camera", dra.device_class_name(ns, "cams")),
                _viewer("camera"))

        async def one_running() -> dict[str, Any] | None:
            running = _live_running(plane, ns)
            return running[0] if len(running) == 1 else None

        first = await eventually(one_running, what="the viewer Running", deadline=DEADLINE_S)
        seen = (await pod_env(plane, first))["DEBUG_ECHO_DESCRIPTION"]
        assert seen in CAMERAS

        offline.write_text(f"{seen}\n")  # its camera goes away
        gone_at = time.monotonic()

        async def replaced() -> dict[str, Any] | None:
            now = await one_running()
            return now if now is not None and now["metadata"]["uid"] != first["metadata"][
                "uid"] else None

        second = await eventually(replaced, what="a new viewer Running", deadline=DEADLINE_S)
        moved_s = time.monotonic() - gone_at
        got = (await pod_env(plane, second))["DEBUG_ECHO_DESCRIPTION"]
        assert got == next(c for c in CAMERAS if c != seen), "the replacement: the other camera"
        assert moved_s >= EVICT_AFTER_S, "evicted before the Configuration's grace"
        print(f"figure: camera gone -> the Deployment's new pod Running with the other camera "
              f"{moved_s:.1f} s (grace {EVICT_AFTER_S} s), on {second['spec']['nodeName']}")
    finally:
        ctl.stop()
        for each in (node, other):
            each.stop_process(agent_log)
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for each in (node, other):
            await h.delete_slices(kube, each.node_name)
        await h.delete_controller_slices(kube, ns)
        await kube.close()
        other.cleanup()
