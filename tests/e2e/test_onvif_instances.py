"""End to end on the namespaced camera network: Instances follow cameras' Hello, Bye and silence.

The real agent runs in the test's handler namespace (``tests.harness.onvif_agent_netns``: its
API connection crosses to the host's loopback through a Unix socket, so its multicast never
can), simulated cameras (standing in for ONVIF IP cameras) in a camera namespace on the same
bridge, and the real API server holds the Instances a user would look at.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import uuid
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import pytest

from crds.naming import instance_name
from tests.harness.controller_process import apply, configuration, items, secret_property
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until
from tests.harness.onvif_agent_netns import NetnsAgent
from tests.harness.onvif_netns import LAN_V4, NetnsBed, camera, start_cameras

GRACE_S = 3
PASSWORD = "netns-camera-password"
WRONG = "netns-wrong-password"


@pytest.fixture
def bed() -> Iterator[NetnsBed]:
    with NetnsBed() as network:
        yield network


def cams_configuration(namespace: str) -> dict[str, Any]:
    return configuration(
        namespace, "cams", handler="onvif", grace=GRACE_S,
        details="discoveryTimeoutSeconds: 0.5\ndiscoveryIntervalSeconds: 2\nipv6: false\n",
        properties=[{"name": "username_default", "value": "admin"},
                    secret_property("password_default", "cams", "password")])



@pytest.mark.slow
async def test_instances_follow_hello_bye_and_silence(
    control_plane: ControlPlane, namespace: str, bed: NetnsBed
) -> None:
    host = f"{LAN_V4}.30"
    ns = bed.add_camera_ns(30)
    first = camera(1, host, username="admin", password=PASSWORD, model="M1")
    second = camera(2, host)
    refusing = camera(3, host, username="admin", password=WRONG, model="M3")
    cameras = await start_cameras(bed, ns, {"cameras": [first, second, refusing]})
    node = f"node-{uuid.uuid4().hex[:8]}"
    agent = NetnsAgent(control_plane, ns=bed.handler_ns, node_name=node, namespace=namespace,
                       workdir=bed.workdir)
    path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"

    def names() -> set[str] | None:
        try:
            return {i["metadata"]["name"] for i in items(control_plane, path)}
        except urllib.error.HTTPError as error:
            if error.code == HTTPStatus.TOO_MANY_REQUESTS:  # the API server sheds load: look again
                return None
            raise

    def name_of(cam: dict[str, Any]) -> str:
        url = f"http://{host}:8080/onvif/{cam['index']}/device_service"
        return instance_name("cams", f"{url}-{cam['uuid']}", shared=True, node=node)

    try:
        apply(control_plane, {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "cams", "namespace": namespace},
            "data": {"password": base64.b64encode(PASSWORD.encode()).decode()},
        })
        apply(control_plane, cams_configuration(namespace))
        await agent.start()
        three = {name_of(first), name_of(second), name_of(refusing)}
        await until(lambda: names() == three, what="an Instance per camera")
        by_name = {i["metadata"]["name"]: i for i in items(control_plane, path)}
        assert by_name[name_of(first)]["spec"]["brokerProperties"]["ONVIF_DEVICE_MODEL"] == "M1"
        # the camera that refuses our password is listed with what it shows without it
        refused = by_name[name_of(refusing)]["spec"]["brokerProperties"]
        assert "ONVIF_DEVICE_MODEL" not in refused
        assert refused["ONVIF_DEVICE_UUID"] == refusing["uuid"]

        newcomer = camera(4, host)
        await cameras.command(cmd="add", camera=newcomer)  # says Hello
        await until(lambda: name_of(newcomer) in (names() or ()), what="the Instance of a Hello")

        said_bye = time.monotonic()
        await cameras.command(cmd="bye", uuid=first["uuid"])
        await until(lambda: name_of(first) not in (names() or {name_of(first)}),
                    what="the Instance of a Bye gone")
        assert time.monotonic() - said_bye >= GRACE_S, "kept for offlineGracePeriodSeconds"

        await cameras.command(cmd="silence", uuid=second["uuid"])
        await until(lambda: name_of(second) not in (names() or {name_of(second)}),
                    what="a silent camera's Instance gone")
        assert names() == {name_of(refusing), name_of(newcomer)}

        log = agent.log()
        assert PASSWORD not in log
        assert f"uuid {refusing['uuid']}) refused the configured credentials" in log
        # ... and a Warning Event on its Instance names the camera, never the password
        def warnings() -> list[dict[str, Any]]:
            return list(json.loads(control_plane.kubectl(
                "get", "events", "-n", namespace, "--field-selector",
                f"involvedObject.name={name_of(refusing)},reason=DeviceWarning",
                "-o", "json").stdout)["items"])

        await until(warnings, what="a DeviceWarning Event on the refusing camera's Instance")
        [event] = warnings()
        assert event["type"] == "Warning"
        assert refusing["uuid"] in event["message"]
        assert PASSWORD not in json.dumps(event)
        assert PASSWORD not in str(items(control_plane, path))
    finally:
        await agent.stop()
        await cameras.stop()
        print(f"--- agent log ---\n{agent.log()[-6000:]}")
