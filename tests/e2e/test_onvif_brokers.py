"""End to end: a camera is found → its Instance → a broker pod whose Allocate carries the camera's
service URL and stream URI → the camera goes silent → Instance and broker gone after the grace.

The camera is the simulator (``tests.harness.onvif_camera``, standing in for an ONVIF IP camera)
on loopback, probed by unicast (``multicast: false``) so that nothing leaves this machine; the
agent and controller are the product, the kubelet the node emulator, as in the debugEcho test.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from crds.naming import instance_name
from tests.harness.broker_stack import agent_in_process, broker_stack, new_node_name
from tests.harness.controller_process import (
    apply,
    broker_pod_spec,
    broker_pods,
    configuration,
    items,
    secret_property,
)
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import until
from tests.harness.onvif_netns import camera, start_cameras

POLL_S = 0.1
PASSWORD = "e2e-camera-password"




def onvif_configuration(namespace: str, wsd_port: int) -> dict[str, Any]:
    details = (
        "multicast: false\n"
        f"unicastTargets: ['127.0.0.1:{wsd_port}']\n"
        "discoveryTimeoutSeconds: 0.5\n"
        "discoveryIntervalSeconds: 1\n"
    )
    return configuration(
        namespace, "cams", handler="onvif", details=details, pod_spec=broker_pod_spec(), grace=2,
        properties=[{"name": "username_default", "value": "admin"},
                    secret_property("password_default", "cams", "password")])


async def test_broker_gets_the_camera_url_and_stream_and_goes_with_the_camera(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path
) -> None:
    node = new_node_name()
    wsd_port, http_port = free_port(), free_port()
    cam = camera(
        1,
        "127.0.0.1",
        port=http_port,
        username="admin",
        password=PASSWORD,
        profiles=[{"token": "main", "name": "Main",
                   "uri": f"rtsp://admin:{PASSWORD}@127.0.0.1:8554/main"}],
    )
    cameras = await start_cameras(
        None,
        None,
        {"multicast": False, "wsd_bind": "127.0.0.1", "wsd_port": wsd_port,
         "http_port": http_port, "cameras": [cam]},
        workdir=tmp_path,
    )
    url = f"http://127.0.0.1:{http_port}/onvif/1/device_service"
    inst = instance_name("cams", f"{url}-{cam['uuid']}", shared=True, node=node)
    try:
        async with (
            broker_stack(control_plane, namespace, plugin_dir, tmp_path, node=node) as stack,
            agent_in_process(stack, plugin_dir),
        ):
            apply(control_plane, {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "cams", "namespace": namespace},
                "data": {"password": base64.b64encode(PASSWORD.encode()).decode()},
            })
            apply(control_plane, onvif_configuration(namespace, wsd_port))
            pod_name = f"{inst}-{node}-pod"

            await stack.running_broker(pod_name)
            [allocation] = stack.emulator.allocations(namespace, pod_name)
            assert allocation.envs["ONVIF_DEVICE_SERVICE_URL"] == url
            assert allocation.envs["ONVIF_DEVICE_UUID"] == cam["uuid"]
            assert allocation.envs["ONVIF_STREAM_URI"] == "rtsp://127.0.0.1:8554/main"
            instances = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
            [instance] = items(control_plane, instances)
            assert PASSWORD not in str(instance)

            await cameras.command(cmd="silence", uuid=cam["uuid"])  # unplugged: no answer at all
            await until(lambda: not items(control_plane, instances), what="the Instance deleted")
            await until(lambda: not broker_pods(control_plane, namespace), what="the broker gone")
    finally:
        await cameras.stop()
