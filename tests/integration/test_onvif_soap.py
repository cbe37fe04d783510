"""The SOAP seam against simulated cameras on loopback: answers read, misbehaviour bounded.

The simulator (``tests.harness.onvif_camera_soap``) stands in for an ONVIF camera's device and
media services; each fault stands in for a broken firmware or a hostile peer. Every failure must
come back as a ``CameraError`` with a short reason that quotes neither the reply nor a secret.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from discovery_handlers.onvif.cameras import Stream
from discovery_handlers.onvif.credentials import Credential
from discovery_handlers.onvif.soap import (
    CALL_TIMEOUT_S,
    MAX_REPLY_BYTES,
    CameraError,
    CameraSession,
    SoapClients,
)
from tests.harness.controlplane import free_port
from tests.harness.onvif_camera_soap import CameraSpec, Profile, SoapServer

PASSWORD = "s3cret-camera-pass"


@pytest.fixture
async def server() -> AsyncIterator[SoapServer]:
    port = free_port()
    cameras = {
        1: CameraSpec(
            index=1, uuid="u1", host="127.0.0.1", port=port, username="admin", password=PASSWORD,
            manufacturer="Bosch", model="FLEXIDOME", firmware="7.8",
            profiles=[Profile("p1", "main", f"rtsp://admin:{PASSWORD}@127.0.0.1/p1")],
        ),
        2: CameraSpec(index=2, uuid="u2", host="127.0.0.1", port=port),
    }
    soap = SoapServer(cameras, port=port)
    await soap.start()
    yield soap
    await soap.close()


@pytest.fixture
async def clients() -> AsyncIterator[SoapClients]:
    shared = SoapClients()
    yield shared
    await shared.close()


def session(
    server: SoapServer, clients: SoapClients, index: int, credential: Credential | None
) -> CameraSession:
    return CameraSession(clients, server.responder.cameras[index].xaddr, credential)


async def test_describe_with_accepted_credentials(
    server: SoapServer, clients: SoapClients
) -> None:
    camera = session(server, clients, 1, Credential("admin", PASSWORD))
    await camera.check_clock()
    description = await camera.describe()
    assert (description.manufacturer, description.model, description.firmware) == (
        "Bosch", "FLEXIDOME", "7.8"
    )
    assert description.mac == "02:00:00:00:00:01"
    assert description.streams == (Stream("p1", "rtsp://127.0.0.1/p1"),)
    assert not description.auth_refused


async def test_refused_credentials_leave_what_the_camera_shows_without(
    server: SoapServer, clients: SoapClients
) -> None:
    camera = session(server, clients, 1, Credential("admin", "wrong"))
    await camera.check_clock()  # open to everyone, as ONVIF requires
    description = await camera.describe()
    assert description.auth_refused
    assert description.mac == ""
    assert description.streams == ()


async def test_a_locked_clock_is_asked_again_with_the_credentials(
    server: SoapServer, clients: SoapClients
) -> None:
    server.responder.cameras[1].clock_auth = True
    camera = session(server, clients, 1, Credential("admin", PASSWORD))
    await camera.check_clock()
    assert not camera.locked
    assert (await camera.describe()).model == "FLEXIDOME"
    await camera.check_clock()  # signed at once from now on
    assert not camera.locked


@pytest.mark.parametrize(
    ("credential", "refused", "missing"),
    [(None, False, True), (Credential("admin", "wrong"), True, False)],
)
async def test_a_locked_clock_without_the_right_credentials_is_an_answer(
    server: SoapServer,
    clients: SoapClients,
    credential: Credential | None,
    refused: bool,
    missing: bool,
) -> None:
    server.responder.cameras[1].clock_auth = True
    camera = session(server, clients, 1, credential)
    await camera.check_clock()  # a refusal proves the camera is there: no CameraError
    assert camera.locked
    description = await camera.describe()
    assert (description.auth_refused, description.credentials_missing) == (refused, missing)
    assert description.manufacturer == description.mac == ""


async def test_an_open_camera_needs_no_credentials(
    server: SoapServer, clients: SoapClients
) -> None:
    description = await session(server, clients, 2, None).describe()
    assert description.manufacturer == "SimCam"


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("soap_fault", "SOAP fault"),
        ("garbage", "GetSystemDateAndTime: malformed reply from http://127.0.0.1:"),
        ("bomb", "malformed reply from http://127.0.0.1:"),
        ("bomb", "declares a DTD or entities"),
        ("xxe", "declares a DTD or entities"),
        ("huge", f"reply over {MAX_REPLY_BYTES} bytes"),
        ("silent", f"no answer within {CALL_TIMEOUT_S:g}s"),
        ("trickle", f"no answer within {CALL_TIMEOUT_S:g}s"),
        ("no_soap", "GetSystemDateAndTime: "),
    ],
)
async def test_misbehaving_cameras_fail_with_a_short_reason(
    server: SoapServer, clients: SoapClients, fault: str, reason: str
) -> None:
    server.responder.cameras[2].fault = fault
    with pytest.raises(CameraError) as caught:
        await session(server, clients, 2, Credential("admin", PASSWORD)).check_clock()
    assert reason in caught.value.reason
    assert len(caught.value.reason) < 300
    assert "passwd" not in caught.value.reason
    assert PASSWORD not in caught.value.reason
