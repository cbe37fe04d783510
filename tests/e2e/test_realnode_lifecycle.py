"""On a real node: a running broker through an agent SIGKILL, a node reboot and an unplug.

One debugEcho broker (a busybox container) lives through what a node does to it:

* the agent beside the kubelet is SIGKILLed and started again: its plugin registers with the
  kubelet again, the broker's container keeps running, the Instance is the same object and the
  kubelet asks no second ``Allocate``;
* the node reboots (tests/harness/realnode.py ``reboot``: every process ends, ``/run`` is
  emptied, the disk keeps the kubelet's device checkpoint and containerd's images), and the
  agent starts again: the broker runs again in a new container, which again gets the device's
  env from the agent's CDI spec (rewritten into the emptied ``/var/run/cdi``). The kubelet
  admits its pods at once, usually before the agent's plugin is back, and then rejects the
  broker (``UnexpectedAdmissionError``: its checkpointed devices are not healthy yet); the
  controller replaces it and the new pod's devices are checkpointed, the old pod's freed;
* the device goes offline: the agent deletes the Instance, the controller the broker, and the
  kubelet stops and removes its container in containerd.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crds.naming import instance_name
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    Broker,
    allocates,
    broker_log,
    broker_spec,
    container_id,
    deployed,
    logged_env,
    node,
    plane,
    pod,
    running_container,
    start_agent,
)

__all__ = ["node", "plane"]  # the module fixtures

pytestmark = pytest.mark.timeout(1500)
CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _instance_uid(plane: ControlPlane, broker: Broker) -> str:
    path = f"/apis/edgeplug.io/v1alpha1/namespaces/{broker.namespace}/instances/{broker.instance}"
    found = plane.get_json(path)
    assert found is not None, f"Instance {broker.instance} exists"
    return str(found["metadata"]["uid"])  # type: ignore[index]


def _containers(node: RealNode) -> set[str]:
    return set(node.ctr("containers", "list", "--quiet").split())


async def test_a_broker_through_agent_kill_reboot_and_unplug(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    offline = tmp_path / "offline"  # debugEcho: the devices listed here are offline
    inst = instance_name("life", "dev0", shared=False, node=node.node_name)
    resource = f"edgeplug.io/{inst}"
    cfg = debug_echo_configuration("life", descriptions=["dev0"], shared=False,
                                   availability_file=offline)
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
    with deployed(plane, node, tmp_path, cfg, inst) as broker:
        first = await running_container(plane, broker)
        uid = _instance_uid(plane, broker)
        pod_uid = str((pod(plane, broker) or {})["metadata"]["uid"])
        assert allocates(node, broker) == 1

        # The agent is SIGKILLed with its broker running, and comes back.
        registered = node.registrations(resource)
        node.kill_process(broker.agent_log)
        start_agent(node, plane, broker)
        await until(lambda: node.registrations(resource) > registered,
                    what="the restarted agent's plugin registered again", within=60)
        assert container_id(pod(plane, broker)) == first, "the container ran on"
        assert _instance_uid(plane, broker) == uid, "the same Instance, not a new one"
        assert allocates(node, broker) == 1, "no second Allocate"

        # The node reboots: containers gone, the device checkpoint on disk kept.
        checkpoint = node.host_path(CHECKPOINT)
        assert pod_uid in checkpoint.read_text(), "the broker's devices are checkpointed"
        rebooted = time.monotonic()
        node.reboot()
        start_agent(node, plane, broker)

        def new_container() -> str | None:
            current = container_id(pod(plane, broker))
            return current if current and current != first else None

        second = await until(new_container, what="the broker in a new container after the "
                             "reboot", within=120)
        now_uid = str((pod(plane, broker) or {})["metadata"]["uid"])
        # The kubelet admits the pods bound to it at once, usually before the agent's plugin is
        # back: it then rejects the broker (UnexpectedAdmissionError, no healthy devices) and
        # the controller replaces it; or the plugin was first and the same pod runs again.
        print(f"figure: node reboot -> broker running again {time.monotonic() - rebooted:.1f} s"
              f" ({'a replacement pod' if now_uid != pod_uid else 'the same pod'}, "
              f"{allocates(node, broker) - 1} Allocate after the reboot)")
        env = logged_env(await broker_log(plane, broker))
        assert env["DEBUG_ECHO_DESCRIPTION"] == "dev0", "the CDI env again, from the new spec"
        assert now_uid in checkpoint.read_text(), "the running broker's devices checkpointed"
        if now_uid != pod_uid:
            assert pod_uid not in checkpoint.read_text(), "the rejected pod's devices freed"
        assert _instance_uid(plane, broker) == uid

        # The device goes offline while its broker runs.
        offline.write_text("dev0\n")
        await until(lambda: pod(plane, broker) is None, what="the broker deleted", within=60)
        await until(lambda: second.removeprefix("containerd://") not in _containers(node),
                    what="the broker's container removed from containerd", within=60)
