"""ONVIF discovery across a real (namespaced) network: multicast, IPv6, unicast, filters, auth.

Simulated cameras (``tests.harness.onvif_camera``, standing in for real ONVIF Profile S IP
cameras) run in network namespaces on a bridge; the handler runs in its own namespace through
``tests.harness.onvif_runner``, so Probes, Hellos and Byes cross real veth links, and a camera
behind a router is reachable only by unicast, as on a routed site network.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from crds.naming import instance_name
from tests.harness.onvif_netns import (
    FAR_V4,
    LAN_V4,
    LAN_V6,
    LineProcess,
    NetnsBed,
    camera,
    start_cameras,
    start_runner,
)
from tests.harness.onvif_netns import edgeplug_discover as discover_in_ns

PASSWORD = "correct-horse-battery"
WRONG = "wrong-password-xyzzy"
FAST = "discoveryIntervalSeconds: 1\ndiscoveryTimeoutSeconds: 0.5\n"


def uuids(line: dict[str, Any]) -> set[str]:
    return {d["properties"]["ONVIF_DEVICE_UUID"] for d in line["devices"]}


def listed(config: str, exactly: set[str] | None = None) -> Callable[[dict[str, Any]], bool]:
    """A check for a device list of ``config`` (holding exactly these uuids, when given)."""

    def check(line: dict[str, Any]) -> bool:
        return line.get("config") == config and (exactly is None or uuids(line) == exactly)

    return check


async def test_cameras_found_over_multicast_v4_v6_and_unicast_across_a_router(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    lan = bed.add_camera_ns(10)
    secured = camera(
        1,
        f"{LAN_V4}.10",
        username="admin",
        password=PASSWORD,
        manufacturer="Axis",
        model="P1375",
        profiles=[
            {"token": "main", "name": "Main", "uri": f"rtsp://admin:{PASSWORD}@{LAN_V4}.10/main"},
            {"token": "sub", "name": "Sub", "uri": f"rtsp://{LAN_V4}.10/sub"},
        ],
    )
    v6_only = camera(2, f"{LAN_V6}a")
    processes.append(await start_cameras(bed, lan, {"cameras": [secured, v6_only]}))
    processes.append(await start_cameras(bed, bed.far_ns, {"cameras": [camera(3, f"{FAR_V4}.10")]}))
    secret = {"username_default": "admin", "password_default": {"secret": PASSWORD}}
    wrong = {"username_default": "admin", "password_default": {"secret": WRONG}}
    runner = await start_runner(
        bed,
        {
            "site": {"details": FAST + f"unicastTargets: [{FAR_V4}.0/28]", "properties": secret},
            "lan": {"details": FAST, "properties": secret},
            "wrong": {"details": FAST, "properties": wrong},
        },
    )
    processes.append(runner)
    everyone = {secured["uuid"], v6_only["uuid"], "00000000-0000-4000-8000-000000000003"}
    site = await runner.wait_for(listed("site", everyone), what="3 cameras")
    by_uuid = {d["properties"]["ONVIF_DEVICE_UUID"]: d for d in site["devices"]}
    first = by_uuid[secured["uuid"]]
    url = f"http://{LAN_V4}.10:8080/onvif/1/device_service"
    assert first["id"] == f"{url}-{secured['uuid']}"
    assert first["properties"] == {
        "ONVIF_DEVICE_SERVICE_URL": url,
        "ONVIF_DEVICE_UUID": secured["uuid"],
        "ONVIF_DEVICE_IP_ADDRESS": f"{LAN_V4}.10",
        "ONVIF_DEVICE_MAC_ADDRESS": secured["mac"],
        "ONVIF_DEVICE_MANUFACTURER": "Axis",
        "ONVIF_DEVICE_MODEL": "P1375",
        "ONVIF_DEVICE_FIRMWARE_VERSION": "1.0.0",
        "ONVIF_DEVICE_PROFILES": "main,sub",
        "ONVIF_STREAM_URI": f"rtsp://{LAN_V4}.10/main",
        "ONVIF_STREAM_URI_MAIN": f"rtsp://{LAN_V4}.10/main",
        "ONVIF_STREAM_URI_SUB": f"rtsp://{LAN_V4}.10/sub",
    }
    assert first["healthy"]
    assert by_uuid[v6_only["uuid"]]["properties"]["ONVIF_DEVICE_IP_ADDRESS"] == f"{LAN_V6}a"

    # without unicastTargets the camera behind the router is never seen (multicast stays local)
    lan_line = await runner.wait_for(listed("lan"), what="the LAN-only list")
    assert uuids(lan_line) == {secured["uuid"], v6_only["uuid"]}

    # refused credentials: still listed with what it shows without them, and a warning
    wrong_line = await runner.wait_for(listed("wrong"), what="the wrong-password list")
    refused = next(d for d in wrong_line["devices"] if d["properties"]["ONVIF_DEVICE_UUID"]
                   == secured["uuid"])
    assert set(refused["properties"]) == {
        "ONVIF_DEVICE_SERVICE_URL", "ONVIF_DEVICE_UUID", "ONVIF_DEVICE_IP_ADDRESS"
    }
    assert url in refused["warning"]
    assert f"{url} (uuid {secured['uuid']}) refused the configured credentials" in runner.stderr()
    everything = json.dumps(runner.lines) + runner.stderr()
    assert PASSWORD not in everything
    assert WRONG not in everything


FILTERS = {
    "ip-include": ("ipAddresses", [f"{LAN_V4}.11"], "Include", {1}),
    "ip-exclude": ("ipAddresses", [f"{LAN_V4}.11/32"], "Exclude", {2, 3}),
    "mac-include": ("macAddresses", ["02-00-00-00-00-02"], "Include", {2}),
    "mac-exclude": ("macAddresses", ["02:00:00:00:00:02"], "Exclude", {1, 3}),
    "scope-include": ("scopes", ["onvif://www.onvif.org/location/dock"], "Include", {1, 3}),
    "scope-exclude": ("scopes", ["onvif://www.onvif.org/location/dock"], "Exclude", {2}),
    "uuid-include": ("uuids", ["00000000-0000-4000-8000-000000000003"], "Include", {3}),
    "uuid-exclude": ("uuids", ["urn:uuid:00000000-0000-4000-8000-000000000003"], "Exclude", {1, 2}),
}


async def test_each_filter_kind_with_include_and_exclude(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    dock = "onvif://www.onvif.org/location/dock"
    gate = "onvif://www.onvif.org/location/gate"
    first = bed.add_camera_ns(11)
    second = bed.add_camera_ns(12)
    processes.append(await start_cameras(bed, first, {"cameras": [
        camera(1, f"{LAN_V4}.11", scopes=["onvif://www.onvif.org/name/one", dock]),
    ]}))
    processes.append(await start_cameras(bed, second, {"cameras": [
        camera(2, f"{LAN_V4}.12", scopes=[gate]),
        camera(3, f"{LAN_V4}.12", scopes=[dock]),
    ]}))
    configs = {
        name: {
            "details": FAST + "ipv6: false\n"
            + f"{field}: {json.dumps({'items': items, 'action': action})}"
        }
        for name, (field, items, action, _) in FILTERS.items()
    }
    runner = await start_runner(bed, configs)
    processes.append(runner)
    for name, (*_, expected) in FILTERS.items():
        want = {f"00000000-0000-4000-8000-{i:012d}" for i in expected}
        await runner.wait_for(listed(name, want), what=name)


CONFIGURATION = """\
apiVersion: edgeplug.io/v1alpha1
kind: Configuration
metadata:
  name: onvif-camera
spec:
  discoveryHandler:
    name: onvif
    discoveryDetails: |
      discoveryTimeoutSeconds: 0.5
      {extra}
    discoveryProperties:
      - name: username_default
        value: admin
      - name: password_default
        valueFrom:
          secretKeyRef: {{name: cameras, key: password}}
  capacity: 2
"""


async def edgeplug_discover(
    bed: NetnsBed, extra: str, *, near_boot: bool = False
) -> tuple[int, str, str]:
    configuration = CONFIGURATION.format(extra=extra)
    return await discover_in_ns(bed, configuration, "--property", f"password_default={PASSWORD}",
                                near_boot=near_boot)


async def test_edgeplug_discover_lists_the_simulated_cameras(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    ns = bed.add_camera_ns(13)
    secured = camera(1, f"{LAN_V4}.13", username="admin", password=PASSWORD, model="Q6135")
    processes.append(await start_cameras(bed, ns, {"cameras": [secured]}))
    status, out, err = await edgeplug_discover(
        bed, f"ipAddresses: {{items: [{LAN_V4}.13], action: Include}}"
    )
    assert status == 0, err
    listing = json.loads(out.splitlines()[0])
    (device,) = listing["devices"]
    url = f"http://{LAN_V4}.13:8080/onvif/1/device_service"
    assert device["id"] == f"{url}-{secured['uuid']}"
    assert device["instance"] == instance_name(
        "onvif-camera", device["id"], shared=True, node="any-node"
    )
    assert device["properties"]["ONVIF_DEVICE_MODEL"] == "Q6135"
    assert PASSWORD not in out + err

    status, out, err = await edgeplug_discover(bed, "scopes: {items: [x], action: Sometimes}")
    assert status == 2
    assert "scopes.action" in err


async def test_a_camera_is_described_at_once_when_the_clock_has_just_started(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    """An agent starts with its node: its monotonic clock reads a second or two. The camera is
    found and described on the first pass, not once the clock passes the description refresh
    interval."""
    ns = bed.add_camera_ns(14)
    processes.append(await start_cameras(bed, ns, {"cameras": [camera(2, f"{LAN_V4}.14")]}))
    status, out, err = await edgeplug_discover(
        bed, f"ipAddresses: {{items: [{LAN_V4}.14], action: Include}}", near_boot=True
    )
    assert status == 0, err
    listing = json.loads(out.splitlines()[0])
    (device,) = listing["devices"]
    assert device["properties"]["ONVIF_DEVICE_IP_ADDRESS"] == f"{LAN_V4}.14"
