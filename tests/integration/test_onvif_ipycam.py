"""The ONVIF handler against a camera implementation this project did not write: IPyCam.

IPyCam (``tests.harness.onvif_ipycam``: a pure-Python virtual IP camera from PyPI, run
unmodified through its own entry point and config file) stands in for a deployed camera whose
firmware reads the standards its own way: its ProbeMatch has no ProbeMatches wrapper and its
EndpointReference is in the WS-Discovery namespace, and with credentials configured it refuses
even the GetSystemDateAndTime that ONVIF says must be open. It runs in network namespaces
beside our own simulated camera; the handler runs in its own namespace (real multicast).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.harness.onvif_ipycam import IpyCam
from tests.harness.onvif_netns import (
    LAN_V4,
    LineProcess,
    NetnsBed,
    camera,
    edgeplug_discover,
    start_cameras,
    start_runner,
)

PASSWORD = "ipycam-Pa55-word"
WRONG = "not-the-ipycam-password"
FAST = "discoveryIntervalSeconds: 1\ndiscoveryTimeoutSeconds: 0.5\nipv6: false\n"
AKRI_PROPERTIES = {"ONVIF_DEVICE_SERVICE_URL", "ONVIF_DEVICE_UUID", "ONVIF_DEVICE_IP_ADDRESS"}


async def ipycam(
    bed: NetnsBed,
    processes: list[IpyCam | LineProcess],
    host: int,
    *,
    username: str = "",
    password: str = "",
) -> IpyCam:
    cam = IpyCam(bed, host, name=f"ipycam-{host}", username=username, password=password)
    processes.append(cam)
    await cam.start()
    return cam


def by_ip(line: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["properties"]["ONVIF_DEVICE_IP_ADDRESS"]: d for d in line["devices"]}


def listed(config: str, addresses: set[str]) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line.get("config") == config and set(by_ip(line)) == addresses


async def test_ipycam_is_discovered_described_filtered_and_authenticated(
    bed: NetnsBed, processes: list[IpyCam | LineProcess]
) -> None:
    open_cam = await ipycam(bed, processes, 30)
    locked = await ipycam(bed, processes, 31, username="admin", password=PASSWORD)
    ours_ns = bed.add_camera_ns(32)
    processes.append(await start_cameras(bed, ours_ns, {"cameras": [camera(1, f"{LAN_V4}.32")]}))
    everyone = {open_cam.address, locked.address, f"{LAN_V4}.32"}
    right = {"username_default": "admin", "password_default": {"secret": PASSWORD}}
    wrong = {"username_default": "admin", "password_default": {"secret": WRONG}}
    runner = await start_runner(bed, {
        "right": {"details": FAST, "properties": right},
        "none": {"details": FAST},
        "wrong": {"details": FAST, "properties": wrong},
        "by-ip": {"details": FAST + f"ipAddresses: {{items: [{open_cam.address}]}}"},
        "by-scope": {
            "details": FAST + f"scopes: {{items: ['{open_cam.name_scope}'], action: Exclude}}",
            "properties": right,
        },
    })
    processes.append(runner)

    # the right credentials: every camera fully described, the locked one too
    line = await runner.wait_for(listed("right", everyone), what="3 cameras, right credentials")
    devices = by_ip(line)
    described = devices[open_cam.address]
    uuid = described["properties"]["ONVIF_DEVICE_UUID"]
    assert described["id"] == f"{open_cam.service_url}-{uuid}"
    assert described["properties"]["ONVIF_DEVICE_SERVICE_URL"] == open_cam.service_url
    assert described["properties"]["ONVIF_DEVICE_PROFILES"] == "Profile_Main,Profile_Sub"
    assert described["properties"]["ONVIF_STREAM_URI_PROFILE_MAIN"] == (
        f"rtsp://{open_cam.address}:8554/video_main"
    )
    assert described["properties"]["ONVIF_DEVICE_MODEL"]
    assert described["healthy"]
    assert devices[locked.address]["properties"]["ONVIF_DEVICE_PROFILES"] == (
        "Profile_Main,Profile_Sub"
    )
    assert devices[locked.address]["warning"] == ""

    # no credentials: the locked camera is listed with what discovery shows, and a warning
    line = await runner.wait_for(listed("none", everyone), what="3 cameras, no credentials")
    bare = by_ip(line)[locked.address]
    assert set(bare["properties"]) == AKRI_PROPERTIES
    assert bare["healthy"]
    assert "wants credentials and none are configured" in bare["warning"]
    assert locked.service_url in bare["warning"]

    # wrong credentials: the same, and the warning says they were refused
    line = await runner.wait_for(listed("wrong", everyone), what="3 cameras, wrong credentials")
    refused = by_ip(line)[locked.address]
    assert set(refused["properties"]) == AKRI_PROPERTIES
    assert "refused the configured credentials" in refused["warning"]

    # filters on what IPyCam announces
    await runner.wait_for(listed("by-ip", {open_cam.address}), what="the address filter")
    await runner.wait_for(
        listed("by-scope", {locked.address, f"{LAN_V4}.32"}), what="the scope filter"
    )
    log = runner.stderr()
    assert f"{locked.service_url} (uuid " in log
    everything = json.dumps(runner.lines) + log
    assert PASSWORD not in everything
    assert WRONG not in everything


CONFIGURATION = """\
apiVersion: edgeplug.io/v1alpha1
kind: Configuration
metadata:
  name: ipycams
spec:
  discoveryHandler:
    name: onvif
    discoveryDetails: |
      discoveryTimeoutSeconds: 0.5
      ipAddresses: {{items: [{addresses}]}}
{properties}"""
CREDENTIALS = """\
    discoveryProperties:
      - name: username_default
        value: admin
      - name: password_default
        valueFrom:
          secretKeyRef: {name: cameras, key: password}
"""


async def test_edgeplug_discover_lists_unmodified_ipycams(
    bed: NetnsBed, processes: list[IpyCam | LineProcess]
) -> None:
    open_cam = await ipycam(bed, processes, 33)
    locked = await ipycam(bed, processes, 34, username="admin", password=PASSWORD)
    addresses = f"{open_cam.address}, {locked.address}"
    configuration = CONFIGURATION.format(addresses=addresses, properties=CREDENTIALS)
    status, out, err = await edgeplug_discover(
        bed, configuration, "--property", f"password_default={PASSWORD}"
    )
    assert status == 0, err
    listing = json.loads(out.splitlines()[0])
    devices = {d["properties"]["ONVIF_DEVICE_IP_ADDRESS"]: d for d in listing["devices"]}
    assert set(devices) == {open_cam.address, locked.address}
    for cam in (open_cam, locked):
        device = devices[cam.address]
        assert device["id"].startswith(f"{cam.service_url}-")
        assert device["properties"]["ONVIF_DEVICE_PROFILES"] == "Profile_Main,Profile_Sub"
    assert PASSWORD not in out + err

    # without credentials: the locked one is still listed, bare, and the warning says why
    bare = CONFIGURATION.format(addresses=addresses, properties="")
    status, out, err = await edgeplug_discover(bed, bare)
    assert status == 0, err
    listing = json.loads(out.splitlines()[0])
    devices = {d["properties"]["ONVIF_DEVICE_IP_ADDRESS"]: d for d in listing["devices"]}
    assert set(devices) == {open_cam.address, locked.address}
    assert set(devices[locked.address]["properties"]) == AKRI_PROPERTIES
    assert f"camera {locked.service_url} (uuid " in err
    assert "wants credentials and none are configured" in err


async def test_ipycam_hello_and_bye_are_followed_between_passes(
    bed: NetnsBed, processes: list[IpyCam | LineProcess]
) -> None:
    # one pass an hour: only IPyCam's Hello and Bye can change the list within the test
    details = "discoveryIntervalSeconds: 3600\ndiscoveryTimeoutSeconds: 0.5\nipv6: false\n"
    runner = await start_runner(bed, {"hourly": {"details": details}})
    processes.append(runner)
    empty = await runner.wait_for(lambda line: "devices" in line, what="the first list")
    assert all(d["properties"]["ONVIF_DEVICE_IP_ADDRESS"] != f"{LAN_V4}.35"
               for d in empty["devices"])
    cam = await ipycam(bed, processes, 35)
    seen = len(runner.lines)
    await runner.wait_for(
        lambda line: cam.address in by_ip(line), what="IPyCam listed on its Hello", after=seen
    )
    seen = len(runner.lines)
    await cam.stop()
    await runner.wait_for(
        lambda line: "devices" in line and cam.address not in by_ip(line),
        what="IPyCam gone on its Bye", after=seen,
    )
