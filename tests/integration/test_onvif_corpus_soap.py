"""Real cameras' SOAP replies, replayed to the handler's SOAP client over loopback HTTP.

``tests.harness.onvif_replay`` stands in for a deployed camera: it answers with the reply
shapes in ``tests/data/onvif/soap`` (a gSOAP-style camera's device and media service, and the
ways real cameras refuse a request without credentials: Vivotek's and a gSOAP firmware's
``ter:NotAuthorized`` faults, IPyCam's ``Receiver`` fault with HTTP 401, and an HTTP digest
401 page). Sources are named in ``tests/data/onvif/README.md``.

A recorded reply cut at a byte offset (as a dropped connection or a full buffer leaves it) is
an error naming the operation and the camera's address, never read as far as it goes: lxml's
recovery once published a firmware cut to ``V5.4.5`` and a stream URI cut mid-path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from discovery_handlers.onvif.cameras import Description, Stream
from discovery_handlers.onvif.credentials import Credential
from discovery_handlers.onvif.soap import CameraError, CameraSession, SoapClients
from tests.harness.controlplane import free_port
from tests.harness.onvif_replay import Refusal, ReplayCamera, recorded

SECRET = Credential("admin", "corpus-pass-123")
#: where a recorded reply is cut: the operation, and the recorded bytes it ends with
CUTS = {
    "firmware-mid-value": ("GetDeviceInformation", b"<tds:FirmwareVersion>V5.4.5"),
    "uri-mid-path": ("GetStreamUri", b"rtsp://admin:12345@192.0.2.10:554/Streaming/Chan"),
    "clock-after-body": ("GetSystemDateAndTime", b"<SOAP-ENV:Body>"),
    "clock-mid-time": ("GetSystemDateAndTime", b"<tt:Hour>6"),
    "mac-mid-value": ("GetNetworkInterfaces", b"<tt:HwAddress>A4:14:37"),
    "profiles-second-open": ("GetProfiles", b'<trt:Profiles token="Profile_2" fixed="true">'),
}
REFUSALS = {
    "vivotek-NotAuthorized-400": Refusal(400, "fault-NotAuthorized-vivotek.xml"),
    "gsoap-NotAuthorized-400": Refusal(400, "fault-NotAuthorized-gsoap.xml"),
    "ipycam-Receiver-401": Refusal(401, "fault-Receiver-ipycam.xml"),
    "digest-html-401": Refusal(401, "http401-digest.html", "text/html"),
}


@pytest.fixture
async def clients() -> AsyncIterator[SoapClients]:
    shared = SoapClients()
    yield shared
    await shared.close()


@pytest.fixture
async def replay() -> AsyncIterator[ReplayCamera]:
    camera = ReplayCamera(free_port())
    await camera.start()
    yield camera
    await camera.close()


async def test_a_gsoap_camera_is_described_from_its_replies(
    replay: ReplayCamera, clients: SoapClients
) -> None:
    session = CameraSession(clients, replay.xaddr, None)
    await session.check_clock()
    assert not session.locked
    description = await session.describe()
    assert (description.manufacturer, description.model, description.firmware) == (
        "HIKVISION", "DS-2CD2612F-I", "V5.4.5 build 170123"
    )
    assert description.mac == "a4:14:37:00:00:01"
    uri = "rtsp://192.0.2.10:554/Streaming/Channels/101?transportmode=unicast&profile=Profile_1"
    assert description.streams == (Stream("Profile_1", uri), Stream("Profile_2", uri))
    assert not description.auth_refused
    assert not description.credentials_missing


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_locked_clock_is_asked_again_with_credentials(
    replay: ReplayCamera, clients: SoapClients, refusal: str
) -> None:
    replay.locked = REFUSALS[refusal]
    session = CameraSession(clients, replay.xaddr, SECRET)
    await session.check_clock()
    assert not session.locked
    assert replay.asked == [("GetSystemDateAndTime", False), ("GetSystemDateAndTime", True)]
    description = await session.describe()
    assert description.model == "DS-2CD2612F-I"
    assert len(description.streams) == 2


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_locked_clock_without_credentials_is_listed_bare(
    replay: ReplayCamera, clients: SoapClients, refusal: str
) -> None:
    replay.locked = REFUSALS[refusal]
    session = CameraSession(clients, replay.xaddr, None)
    await session.check_clock()  # the refusal is an answer: no CameraError
    assert session.locked
    description = await session.describe()
    assert description.credentials_missing
    assert description.model == ""
    assert replay.asked == [("GetSystemDateAndTime", False)]  # nothing more is asked


def cut_after(operation: str, end: bytes) -> int:
    """The byte offset right after ``end`` in the recorded reply to ``operation``."""
    data = recorded(f"{operation}.xml")
    return data.index(end) + len(end)


async def describe(session: CameraSession) -> Description:
    """A camera's check as the scanner makes it: the clock, then the description."""
    await session.check_clock()
    return await session.describe()


@pytest.mark.parametrize("cut", sorted(CUTS))
async def test_a_cut_reply_is_an_error_naming_the_operation_and_the_camera(
    replay: ReplayCamera, clients: SoapClients, cut: str
) -> None:
    operation, end = CUTS[cut]
    replay.cuts[operation] = cut_after(operation, end)
    session = CameraSession(clients, replay.xaddr, SECRET)
    with pytest.raises(CameraError) as caught:
        await describe(session)  # nothing of a cut reply is published
    reason = caught.value.reason
    assert reason.startswith(f"{operation}: malformed reply from {replay.base}onvif/")
    assert "not well-formed XML (Premature end of data" in reason
    assert caught.value.malformed
    assert not caught.value.auth_refused
    assert SECRET.password not in reason
    assert replay.asked[-1][0] == operation  # nothing more was asked after the cut reply

