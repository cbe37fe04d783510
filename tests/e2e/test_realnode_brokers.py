"""On a real node (the kubelet itself, containerd 2, runc, CNI): brokers really run.

The agent runs as on a node, beside the kubelet in the node's mount namespace with its default
paths (device plugins in /var/lib/kubelet/device-plugins, CDI specs in /var/run/cdi); the
controller creates the broker pod; the real kubelet admits it, calls the agent's Allocate and
has containerd create the container, which resolves the agent's CDI name from its spec. What
the container got is read from inside it: ``kubectl logs`` of a busybox broker that prints its
env. Then the kubelet restarts: the plugin registers again and the container keeps running.
A CDI name without a spec (the agent writing specs where the runtime does not look) fails the
container's creation, as on a real node.

udev: the device is a loop device the test attaches (``losetup``) to a file whose first bytes
are a marker. The agent finds it with real libudev (a udev rule on ``SUBSYSTEM=="block",
KERNEL=="loopN"``); its CDI spec names ``/dev/loopN`` as a device node; containerd creates that
node in the broker's container and allows it in the device cgroup, and the broker (busybox)
reads the marker from it: ``UDEV_DEVNODE``, ``ls -l`` showing a block device, the marker.

ONVIF and OPC-UA: the camera simulator and asyncua servers on loopback, as in the emulated
tests; the agent beside the kubelet (the host's network) finds them; the broker proves the env
it got (``ONVIF_DEVICE_SERVICE_URL``, ``OPCUA_DISCOVERY_URL``, ...). It cannot reach them: the
node's pods live in the node's own network namespace.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crds.naming import instance_name
from tests.e2e.test_onvif_brokers import onvif_configuration
from tests.e2e.test_opcua_brokers import opcua_configuration
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import until
from tests.harness.onvif_netns import camera, start_cameras
from tests.harness.opcua_servers import VALUE_IDENTIFIER, TestServer
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    allocates,
    broker_log,
    broker_spec,
    container_id,
    create_error,
    deployed,
    logged_env,
    pod,
    running_container,
)

#: A first start builds the node's binaries once (minutes, cached after).
pytestmark = pytest.mark.timeout(1500)
BACKING_BYTES = 1 << 20


def _configuration(name: str, description: str) -> dict[str, Any]:
    cfg = debug_echo_configuration(name, descriptions=[description], shared=False)
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("ls -l /dev")}
    return cfg


async def test_broker_runs_with_its_env_and_survives_a_kubelet_restart(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    started = time.monotonic()
    inst = instance_name("echo", "foo0", shared=False, node=node.node_name)
    with deployed(plane, node, tmp_path, _configuration("echo", "foo0"), inst) as broker:
        container = await running_container(plane, broker)
        print(f"figure: Configuration applied -> broker Running on the real node "
              f"{time.monotonic() - started:.1f} s")
        env = logged_env(await broker_log(plane, broker))
        assert env["DEBUG_ECHO_DESCRIPTION"] == "foo0", "the CDI spec's env, set by containerd"
        assert env["EDGEPLUG_INSTANCE"] == broker.instance
        assert any(node.host_path("/var/run/cdi").iterdir()), \
            "the agent wrote its CDI spec in the node's own /var/run/cdi"
        before = allocates(node, broker)
        assert before == 1

        restarted = time.monotonic()
        node.restart_kubelet()
        await until(lambda: node.resource_registered(f"edgeplug.io/{broker.instance}"),
                    what="the plugin registered with the restarted kubelet", within=60)
        print(f"figure: kubelet restart -> plugin re-registered "
              f"{time.monotonic() - restarted:.1f} s")
        assert container_id(pod(plane, broker)) == container, \
            "the same container ran on through the kubelet restart"
        assert allocates(node, broker) == before, "no second Allocate for the running pod"


async def test_a_cdi_name_without_a_spec_fails_the_container(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    inst = instance_name("nospec", "bar0", shared=False, node=node.node_name)
    # The agent writes its specs into a directory the node's containerd does not read.
    with deployed(plane, node, tmp_path, _configuration("nospec", "bar0"), inst,
                  cdi_spec_dir=str(tmp_path / "elsewhere")) as broker:
        message = await until(lambda: create_error(plane, broker),
                              what=f"{broker.pod}: CreateContainerError", within=120)
        print(f"--- the kubelet's reason ---\n{message}")
        assert "unresolvable CDI devices edgeplug.io/nospec=" in message
        assert any((tmp_path / "elsewhere").iterdir()), "the spec exists, where nobody looks"
        assert (pod(plane, broker) or {})["status"]["phase"] == "Pending"


@contextlib.contextmanager
def loop_device(backing: Path, marker: bytes) -> Iterator[str]:
    """A loop device over ``backing`` (the marker, then zeros); detached afterwards."""
    if shutil.which("losetup") is None:
        raise RuntimeError("the udev real-node test needs losetup (util-linux)")
    backing.write_bytes(marker + bytes(BACKING_BYTES - len(marker)))
    device = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                            capture_output=True, text=True).stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


def _udev_configuration(name: str, kernel: str) -> dict[str, Any]:
    details = {"udevRules": [f'SUBSYSTEM=="block", KERNEL=="{kernel}"'], "permissions": "r"}
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": "udev", "discoveryDetails": yaml.safe_dump(details)},
            "capacity": 1,
            # The broker reads the device it was handed, by the env the agent gave it.
            "brokerSpec": {"brokerPodSpec": broker_spec(
                'ls -l "$UDEV_DEVNODE"; echo edgeplug-read:$(head -c 32 "$UDEV_DEVNODE")')},
        },
    }


async def test_udev_broker_reads_the_loop_device_it_was_given(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    marker = f"edgeplug-loop-{uuid.uuid4().hex[:12]}".encode()
    with loop_device(tmp_path / "disk.img", marker) as device:
        kernel = Path(device).name
        inst = instance_name("loop", f"/devices/virtual/block/{kernel}", shared=False,
                             node=node.node_name)
        with deployed(plane, node, tmp_path, _udev_configuration("loop", kernel), inst) as broker:
            await running_container(plane, broker)
            out = await broker_log(plane, broker)
            env = logged_env(out)
            assert env["UDEV_DEVNODE"] == device
            [listing] = [line for line in out.splitlines() if line.endswith(f" {device}")]
            assert listing.startswith("b"), f"a block device node in the container: {listing}"
            assert f"edgeplug-read:{marker.decode()}" in out, "the broker read the device"
            assert allocates(node, broker) == 1


async def test_onvif_broker_gets_the_camera_url_and_stream(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """The ONVIF camera simulator on loopback (probed by unicast), as in the emulated test; the
    agent beside the kubelet reaches it; the broker proves its env (it cannot reach the camera:
    the node's pods live in the node's network namespace)."""
    wsd_port, http_port = free_port(), free_port()
    password = "realnode-camera-password"
    cam = camera(1, "127.0.0.1", port=http_port, username="admin", password=password,
                 profiles=[{"token": "main", "name": "Main",
                            "uri": f"rtsp://admin:{password}@127.0.0.1:8554/main"}])
    cameras = await start_cameras(None, None, {
        "multicast": False, "wsd_bind": "127.0.0.1", "wsd_port": wsd_port,
        "http_port": http_port, "cameras": [cam]}, workdir=tmp_path)
    url = f"http://127.0.0.1:{http_port}/onvif/1/device_service"
    cfg = onvif_configuration("unused", wsd_port)
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cams"},
              "data": {"password": base64.b64encode(password.encode()).decode()}}
    inst = instance_name("cams", f"{url}-{cam['uuid']}", shared=True, node=node.node_name)
    try:
        with deployed(plane, node, tmp_path, cfg, inst, before=[secret]) as broker:
            await running_container(plane, broker)
            out = await broker_log(plane, broker)
            env = logged_env(out)
            assert env["ONVIF_DEVICE_SERVICE_URL"] == url
            assert env["ONVIF_DEVICE_UUID"] == cam["uuid"]
            assert env["ONVIF_STREAM_URI"] == "rtsp://127.0.0.1:8554/main"
            assert password not in out, "the camera's password is not in the broker's env"
    finally:
        await cameras.stop()


async def test_opcua_broker_gets_the_server_url(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """asyncua servers and a discovery server on loopback, as in the emulated test; the broker
    proves its env (it cannot reach the server from the node's network namespace)."""
    lds = await TestServer("lds", discovery=True).start()
    line1 = await TestServer("line-1", register_to=lds.url).start()
    try:
        cfg = opcua_configuration("unused", lds.url)
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
        inst = instance_name("plcs", line1.url, shared=True, node=node.node_name)
        with deployed(plane, node, tmp_path, cfg, inst) as broker:
            await running_container(plane, broker)
            env = logged_env(await broker_log(plane, broker))
            assert env["OPCUA_DISCOVERY_URL"] == line1.url
            assert env["OPCUA_APPLICATION_NAME"] == "line-1"
            assert env["IDENTIFIER"] == VALUE_IDENTIFIER, "the Configuration's broker property"
    finally:
        await line1.stop()
        await lds.stop()
