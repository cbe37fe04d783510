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

A second broker, for a shared device with a short ``offlineGracePeriodSeconds``, is unplugged
while it runs: through the grace the Instance and the same container stay; after it the agent
deletes the Instance, the controller the broker pod, and the kubelet stops the container (its
process ends) and removes it from containerd. The device comes back: a new Instance, a new
broker pod under the same name, and ``kubectl logs`` shows the same device env as the first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from agent.discovery.device_health import REASON_UNHEALTHY
from agent.discovery.instance_publisher import OFFLINE_REASON
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
    pod,
    running_container,
    start_agent,
)

pytestmark = pytest.mark.timeout(1500)
CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _instance_uid(plane: ControlPlane, broker: Broker) -> str:
    path = f"/apis/edgeplug.io/v1alpha1/namespaces/{broker.namespace}/instances/{broker.instance}"
    found = plane.get_json(path)
    assert found is not None, f"Instance {broker.instance} exists"
    return str(found["metadata"]["uid"])  # type: ignore[index]


def _containers(node: RealNode) -> set[str]:
    return set(node.ctr("containers", "list", "--quiet").split())


def _task_pid(node: RealNode, container: str) -> int:
    """The host pid of a running container's process (``ctr tasks list``: TASK PID STATUS)."""
    for line in node.ctr("tasks", "list").splitlines():
        fields = line.split()
        if fields and fields[0] == container.removeprefix("containerd://"):
            assert fields[2] == "RUNNING", line
            return int(fields[1])
    raise AssertionError(f"no task for container {container}")


def _unhealthy_marks(plane: ControlPlane, namespace: str, uid: str) -> list[str]:
    """The messages of the agent's DeviceUnhealthy Events on the Instance ``uid``."""
    events: Any = plane.get_json(f"/api/v1/namespaces/{namespace}/events") or {}
    return [str(e["message"]) for e in events.get("items", [])
            if e["involvedObject"].get("uid") == uid and e["reason"] == REASON_UNHEALTHY]


def _started(pid: int) -> str | None:
    """A process's start time (``/proc/<pid>/stat`` field 22); None once it has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


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


async def test_a_shared_device_unplugged_while_its_broker_runs_and_back(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    grace = 2
    offline = tmp_path / "offline"
    inst = instance_name("unplug", "dev0", shared=True, node=node.node_name)
    cfg = debug_echo_configuration("unplug", descriptions=["dev0"], shared=True,
                                   availability_file=offline, grace=grace)
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
    with deployed(plane, node, tmp_path, cfg, inst) as broker:
        first = await running_container(plane, broker)
        first_env = logged_env(await broker_log(plane, broker))
        device_env = {k: v for k, v in first_env.items() if k.startswith("DEBUG_ECHO_")}
        assert device_env.get("DEBUG_ECHO_DESCRIPTION") == "dev0", first_env
        uid = _instance_uid(plane, broker)
        pod_uid = str((pod(plane, broker) or {})["metadata"]["uid"])
        pid = _task_pid(node, first)
        started = _started(pid)
        assert started is not None

        # Unplugged while it runs: the agent marks the device unhealthy for the grace (an
        # Event on the Instance says so; it outlives the Instance, so this reads no clock).
        unplugged = time.monotonic()
        offline.write_text("dev0\n")
        # After the grace: the Instance goes, the controller deletes the broker, the kubelet
        # stops its container (the process ends) and removes it from containerd.
        path = (f"/apis/edgeplug.io/v1alpha1/namespaces/{broker.namespace}/instances/"
                f"{broker.instance}")
        await until(lambda: plane.get_json(path) is None, what="the Instance deleted", within=60)
        await until(lambda: pod(plane, broker) is None, what="the broker pod deleted",
                    within=60)
        await until(lambda: _started(pid) != started, what="the old container's process ended",
                    within=60)
        await until(lambda: first.removeprefix("containerd://") not in _containers(node),
                    what="the old container removed from containerd", within=60)
        marks = _unhealthy_marks(plane, broker.namespace, uid)
        assert marks, "the device was kept (unhealthy) for the grace first"
        assert OFFLINE_REASON in marks[0], marks
        print(f"figure: unplug -> old broker's container gone "
              f"{time.monotonic() - unplugged:.1f} s (grace {grace} s)")

        # The device comes back: a new Instance, a new broker pod with the same device env.
        back = time.monotonic()
        offline.write_text("")
        second = await running_container(plane, broker)
        assert second != first
        assert _instance_uid(plane, broker) != uid, "a new Instance"
        assert str((pod(plane, broker) or {})["metadata"]["uid"]) != pod_uid, "a new broker pod"
        env = logged_env(await broker_log(plane, broker))
        assert {k: v for k, v in env.items() if k.startswith("DEBUG_ECHO_")} == device_env
        print(f"figure: device back -> new broker running {time.monotonic() - back:.1f} s")
