"""What the scanner publishes and logs for real cameras' replies, replayed over loopback HTTP.

A recorded ProbeMatches (``tests/data/onvif/wsd``) names a camera whose SOAP service is
``tests.harness.onvif_replay`` answering with recorded replies (``tests/data/onvif/soap``);
each check is the scanner's own, through the real SOAP client. What is checked:

- a camera whose reply is cut is not published from it, and the log says so once per cause,
  with its address, where it was heard from and the reason, even before it was ever listed (a
  camera that had never been described used to vanish without a log line at any level);
- the Bosch FLEXIDOME panoramic 5100i's profiles that fault GetStreamUri
  (``ter:IncompleteConfiguration``) are left out of ``ONVIF_DEVICE_PROFILES``, so every token
  listed has its ``ONVIF_STREAM_URI_<TOKEN>``, and the log names the ones left out, once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from discovery_handlers.contract import PropertyValue, Secret
from discovery_handlers.onvif.cameras import (
    FIRMWARE,
    PROFILES,
    STREAM_URI,
    Camera,
    property_suffix,
    visible_devices,
)
from discovery_handlers.onvif.details import parse_details
from discovery_handlers.onvif.scanner import Scanner
from tests.harness.controlplane import free_port
from tests.harness.onvif_replay import CORPUS, Refusal, ReplayCamera, recorded

LOGGER = "discovery_handlers.onvif.scanner"
PROBE_ID = "urn:uuid:p"
UUID = "2419d68a-2dd2-21b2-a205-ec3a7c5b1a01"  # the recorded ProbeMatches' camera
PASSWORD = "corpus-pass-123"
#: the Bosch panoramic's profiles that answer GetStreamUri with ter:IncompleteConfiguration
INCOMPLETE = ("9", "10", "11")


@pytest.fixture
async def replay() -> AsyncIterator[ReplayCamera]:
    camera = ReplayCamera(free_port())
    await camera.start()
    yield camera
    await camera.close()


@pytest.fixture
async def scanner() -> AsyncIterator[Scanner]:
    properties: dict[str, PropertyValue] = {
        "username_default": "admin", "password_default": Secret(PASSWORD.encode())
    }
    scan = Scanner(parse_details("", properties))
    scan._probe_id = PROBE_ID  # as if a pass had just sent this Probe
    scan._gathering = True  # and were gathering its answers: a pass checks what answers
    yield scan
    await scan._clients.close()


async def heard(scan: Scanner, replay: ReplayCamera) -> Camera:
    """The recorded gSOAP ProbeMatches, its XAddr on the replay camera, heard from it during
    a pass, and the check the scanner starts for it."""
    text = (CORPUS.parent / "wsd" / "probematches-gsoap-soap12.xml").read_text(encoding="utf-8")
    text = text.replace("{relates_to}", PROBE_ID)
    text = text.replace("http://192.0.2.10:8899/", replay.base)
    scan._on_datagram(text.encode(), "127.0.0.1")
    (check,) = scan._pass_checks.values()
    await check
    scan._pass_checks = {}
    return scan._cameras[UUID]


async def one_pass(scan: Scanner, camera: Camera) -> None:
    """The check a later pass makes of the camera (a description when one is due)."""
    await scan._check(camera)


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    found = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    return found


def cut_after(operation: str, end: bytes) -> int:
    data = recorded(f"{operation}.xml")
    return data.index(end) + len(end)


async def test_a_camera_with_a_cut_reply_is_logged_once_per_cause_and_never_repaired(
    scanner: Scanner, replay: ReplayCamera, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    replay.cuts["GetDeviceInformation"] = cut_after(
        "GetDeviceInformation", b"<tds:FirmwareVersion>V5.4.5"
    )
    camera = await heard(scanner, replay)
    url = f"{replay.base}onvif/device_service"
    for _ in range(2):
        await one_pass(scanner, camera)
    logged = records(caplog)
    warnings = [text for level, text in logged if level >= logging.WARNING]
    assert len(warnings) == 1, logged  # once, not on every pass
    (warning,) = warnings
    assert f"camera {url} (uuid {UUID}, heard from 127.0.0.1) is not listed" in warning
    assert f"GetDeviceInformation: malformed reply from {url}: not well-formed XML" in warning
    assert [level for level, text in logged if "is not listed" in text] == [
        logging.WARNING, logging.DEBUG, logging.DEBUG
    ]
    assert visible_devices(scanner._details, scanner._cameras) == []

    replay.cuts.clear()  # the camera answers in full
    await one_pass(scanner, camera)
    assert (logging.INFO, f"camera {url} (uuid {UUID}, heard from 127.0.0.1) answers again") in (
        records(caplog)
    )
    (device,) = visible_devices(scanner._details, scanner._cameras)
    assert device.health.healthy
    assert device.properties[FIRMWARE] == "V5.4.5 build 170123"

    replay.cuts["GetSystemDateAndTime"] = cut_after("GetSystemDateAndTime", b"<tt:Hour>6")
    for _ in range(2):
        await one_pass(scanner, camera)
    logged = records(caplog)
    assert [level for level, text in logged if "is unhealthy" in text] == [
        logging.WARNING, logging.DEBUG
    ]
    (device,) = visible_devices(scanner._details, scanner._cameras)
    assert not device.health.healthy
    assert device.health.reason.startswith(f"GetSystemDateAndTime: malformed reply from {url}")
    assert device.properties[FIRMWARE] == "V5.4.5 build 170123"  # what it said in full
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)


async def test_a_failing_camera_the_filters_leave_out_is_logged_at_debug_level_only(
    replay: ReplayCamera, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    scan = Scanner(parse_details("ipAddresses: {items: [192.0.2.0/24]}", {}))
    scan._probe_id, scan._gathering = PROBE_ID, True
    replay.cuts["GetSystemDateAndTime"] = cut_after("GetSystemDateAndTime", b"<tt:Hour>6")
    try:
        await heard(scan, replay)
    finally:
        await scan._clients.close()
    ((level, text),) = records(caplog)
    assert level == logging.DEBUG
    assert f"(uuid {UUID}, heard from 127.0.0.1) is not listed" in text


async def test_a_cut_stream_uri_is_never_published(
    scanner: Scanner, replay: ReplayCamera, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    replay.cuts["GetStreamUri"] = cut_after(
        "GetStreamUri", b"rtsp://admin:12345@192.0.2.10:554/Streaming/Chan"
    )
    await heard(scanner, replay)
    assert visible_devices(scanner._details, scanner._cameras) == []
    (warning,) = [text for level, text in records(caplog) if level >= logging.WARNING]
    assert f"GetStreamUri: malformed reply from {replay.base}onvif/Media" in warning


async def test_profiles_without_a_stream_are_left_out_and_named_once(
    scanner: Scanner, replay: ReplayCamera, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    replay.corpus = (CORPUS / "bosch-panoramic", CORPUS)
    fault = Refusal(500, "fault-IncompleteConfiguration.xml")
    replay.answers = {("GetStreamUri", token): fault for token in INCOMPLETE}
    camera = await heard(scanner, replay)
    (device,) = visible_devices(scanner._details, scanner._cameras)
    assert device.health.healthy
    listed = [str(token) for token in range(16) if str(token) not in INCOMPLETE]
    assert device.properties[PROFILES] == ",".join(listed)
    for token in listed:  # every token listed has its stream
        uri = device.properties[f"{STREAM_URI}_{property_suffix(token)}"]
        assert uri == f"rtsp://192.0.2.10/rtsp_tunnel?p={token}&inst=1&vcd=2"
    assert device.properties[STREAM_URI] == device.properties[f"{STREAM_URI}_0"]
    assert not any(f"{STREAM_URI}_{token}" in device.properties for token in INCOMPLETE)
    (note,) = [text for level, text in records(caplog) if level == logging.INFO]
    assert "profile(s) 9, 10, 11 have no stream URI" in note
    assert "GetStreamUri: SOAP fault IncompleteConfiguration: Configuration not complete" in note

    camera.described_at = None  # the next full description finds the same: not logged again
    await one_pass(scanner, camera)
    assert [text for level, text in records(caplog) if level >= logging.INFO] == []
