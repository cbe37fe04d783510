"""ONVIF cameras coming and going on a real (namespaced) network, and peers that misbehave.

Simulated cameras stand in for real ONVIF IP cameras; the hostile ones for a broken firmware or
an attacker on the camera network. The handler runs in its own namespace (see
``tests.harness.onvif_netns``); what it yields is what the agent would publish.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.kube_waits import wait_until
from tests.harness.onvif_camera import HOSTILE_KINDS
from tests.harness.onvif_camera_soap import FAULTS
from tests.harness.onvif_netns import LAN_V4, LineProcess, NetnsBed, camera, cameras_and_runner

FAST = "discoveryIntervalSeconds: 1\ndiscoveryTimeoutSeconds: 0.5\nipv6: false\n"
#: What the runner may hold with hostile peers around (a bound, not a timing).
RSS_BOUND_KIB = 300 * 1024


def state(line: dict[str, Any]) -> dict[str, bool]:
    """uuid → healthy, for one device list."""
    return {d["properties"]["ONVIF_DEVICE_UUID"]: d["healthy"] for d in line.get("devices", [])}


def newer_than(line: dict[str, Any], check: Callable[[dict[str, bool]], bool]) -> Any:
    """A check for a list printed after ``line`` whose uuid → health map satisfies ``check``."""

    def matches(candidate: dict[str, Any]) -> bool:
        return "devices" in candidate and candidate["t"] > line["t"] and check(state(candidate))

    return matches


@pytest.mark.slow
async def test_hello_and_bye_act_between_passes(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    first, second = camera(1, f"{LAN_V4}.20"), camera(2, f"{LAN_V4}.20")
    # a slow interval: anything that happens between passes is Hello and Bye at work
    cameras, runner = await cameras_and_runner(
        bed, processes, 20, {"cameras": [first]},
        FAST.replace("discoveryIntervalSeconds: 1", "discoveryIntervalSeconds: 30"))
    start = await runner.wait_for(
        lambda line: state(line) == {first["uuid"]: True}, what="first camera"
    )

    await cameras.command(cmd="add", camera=second)  # announced by Hello
    hello = await runner.wait_for(
        newer_than(start, lambda s: s == {first["uuid"]: True, second["uuid"]: True}),
        what="the camera that said Hello",
    )
    await cameras.command(cmd="bye", uuid=second["uuid"])
    await runner.wait_for(
        newer_than(hello, lambda s: s == {first["uuid"]: True}), what="the camera that said Bye"
    )


@pytest.mark.slow
async def test_silent_camera_goes_and_soap_failure_is_unhealthy(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    first, second = camera(1, f"{LAN_V4}.21"), camera(2, f"{LAN_V4}.21")
    cameras, runner = await cameras_and_runner(bed, processes, 21,
                                               {"cameras": [first, second]}, FAST)
    healthy = {first["uuid"]: True, second["uuid"]: True}
    both = await runner.wait_for(lambda line: state(line) == healthy, what="both cameras")
    await cameras.command(cmd="fault", uuid=second["uuid"], fault="soap_fault")
    await cameras.command(cmd="silence", uuid=first["uuid"])
    unhealthy = await runner.wait_for(
        newer_than(both, lambda s: s.get(second["uuid"]) is False), what="an unhealthy camera"
    )
    reason = next(
        d["reason"]
        for d in unhealthy["devices"]
        if d["properties"]["ONVIF_DEVICE_UUID"] == second["uuid"]
    )
    assert "SOAP fault" in reason
    await runner.wait_for(
        newer_than(unhealthy, lambda s: s == {second["uuid"]: False}), what="the silent camera gone"
    )
    await cameras.command(cmd="fault", uuid=second["uuid"], fault=None)
    await runner.wait_for(
        newer_than(unhealthy, lambda s: s == {second["uuid"]: True}), what="recovery"
    )


async def test_a_camera_faulting_get_device_information_is_listed_unhealthy_until_it_answers(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    """ONVIF makes GetDeviceInformation mandatory: a camera that answers it with a SOAP fault is
    listed (an operator sees it, and why) but unhealthy; it turns healthy, described, once it
    answers. A fault of an optional call (GetNetworkInterfaces) only leaves its property out."""
    faulty = camera(1, f"{LAN_V4}.23", faulted_operations=["GetDeviceInformation"])
    no_nics = camera(2, f"{LAN_V4}.23", faulted_operations=["GetNetworkInterfaces"])
    cameras, runner = await cameras_and_runner(bed, processes, 23,
                                               {"cameras": [faulty, no_nics]}, FAST)
    first = await runner.wait_for(
        lambda line: state(line) == {faulty["uuid"]: False, no_nics["uuid"]: True},
        what="the faulting camera listed unhealthy beside the other")
    by_uuid = {d["properties"]["ONVIF_DEVICE_UUID"]: d for d in first["devices"]}
    listed = by_uuid[faulty["uuid"]]
    assert listed["reason"].startswith("GetDeviceInformation: SOAP fault")
    assert listed["properties"]["ONVIF_DEVICE_IP_ADDRESS"] == f"{LAN_V4}.23"
    assert "ONVIF_DEVICE_MANUFACTURER" not in listed["properties"]
    assert "ONVIF_DEVICE_MAC_ADDRESS" not in by_uuid[no_nics["uuid"]]["properties"]
    assert by_uuid[no_nics["uuid"]]["properties"]["ONVIF_DEVICE_MANUFACTURER"] == "SimCam"
    assert "GetDeviceInformation: SOAP fault" in runner.stderr()

    await cameras.command(cmd="fault_operations", uuid=faulty["uuid"], operations=[])
    healed = await runner.wait_for(
        newer_than(first, lambda s: s == {faulty["uuid"]: True, no_nics["uuid"]: True}),
        what="the camera described once it answers")
    (device,) = (d for d in healed["devices"]
                 if d["properties"]["ONVIF_DEVICE_UUID"] == faulty["uuid"])
    assert device["properties"]["ONVIF_DEVICE_MANUFACTURER"] == "SimCam"


async def test_hostile_peers_publish_nothing_and_cost_bounded_memory(
    bed: NetnsBed, processes: list[LineProcess]
) -> None:
    good = camera(1, f"{LAN_V4}.22")
    broken = [camera(10 + i, f"{LAN_V4}.22", fault=fault) for i, fault in enumerate(FAULTS)]
    config = {"cameras": [good, *broken], "hostile": list(HOSTILE_KINDS)}
    cameras, runner = await cameras_and_runner(bed, processes, 22, config, FAST)
    first = await runner.wait_for(lambda line: "devices" in line, what="a device list")
    assert state(first) == {good["uuid"]: True}
    # more passes, every hostile answer again: the list never gains anything, nothing crashes
    await wait_probes(cameras, 6)
    assert all(state(line) == {good["uuid"]: True} for line in runner.lines if "devices" in line)
    assert runner.proc.returncode is None
    log = runner.stderr()
    assert "ignored a WS-Discovery datagram" in log
    # every camera left out is named once (at warning level: the runner logs from info up),
    # with why, however many passes it fails: a cut reply, an entity bomb or an XXE payload
    # used to make a camera that had never been described vanish without a word
    for peer in broken:
        lines = [line for line in log.splitlines() if f"(uuid {peer['uuid']}," in line]
        assert len(lines) == 1, (peer["fault"], lines)
        (line,) = lines
        assert line.startswith("WARNING:"), line
        assert " is not listed " in line
        assert f"http://{peer['host']}:{peer['port']}/onvif/" in line
        if peer["fault"] in ("bomb", "xxe"):
            assert "malformed reply from http://" in line
            assert line.endswith("declares a DTD or entities (until it answers, the same "
                                 "again at debug level)"), line
    assert "root:x:0:0" not in json.dumps(runner.lines) + log  # no external entity resolved
    assert runner.rss_kib() < RSS_BOUND_KIB


async def wait_probes(cameras: LineProcess, count: int) -> None:
    async def enough() -> bool:
        return int((await cameras.command(cmd="stats"))["probes_seen"]) >= count

    await wait_until(enough, what=f"{count} probes at the cameras")
