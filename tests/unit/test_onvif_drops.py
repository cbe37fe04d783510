"""Every WS-Discovery message the scanner does not use is logged with the reason: a warning
the first time per sender, debug level after that (a chatty broken camera must not flood the
log, and a user must still learn why their camera is missing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import pytest

from discovery_handlers.onvif.cameras import Description
from discovery_handlers.onvif.details import parse_details
from discovery_handlers.onvif.scanner import Scanner

WSD = Path(__file__).resolve().parents[1] / "data" / "onvif" / "wsd"
LOGGER = "discovery_handlers.onvif.scanner"


def datagram(name: str, relates_to: str = "urn:uuid:p") -> bytes:
    return (WSD / name).read_text(encoding="utf-8").replace("{relates_to}", relates_to).encode()


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def scanner() -> Scanner:
    found = Scanner(parse_details("", {}))
    found._probe_id = "urn:uuid:p"  # as if a pass had just sent this Probe
    found._pass_started = time.monotonic()
    return found


def test_first_drop_per_sender_is_a_warning_then_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    scan = scanner()
    for sender in ("192.0.2.7", "192.0.2.7", "192.0.2.8"):
        scan._on_datagram(b"<not xml", sender)
    levels = [(level, "192.0.2.8" in text) for level, text in records(caplog)]
    assert levels == [(logging.WARNING, False), (logging.DEBUG, False), (logging.WARNING, True)]
    assert all("not well-formed" in text for _, text in records(caplog))


def test_a_probe_fault_and_a_stray_answer_say_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    scan = scanner()
    scan._on_datagram(datagram("fault-probe-hikvision.xml"), "192.0.2.9")
    scan._on_datagram(datagram("probematches-gsoap-soap12.xml", "urn:uuid:nobody"), "192.0.2.11")
    (fault, stray) = records(caplog)
    assert fault[0] == stray[0] == logging.WARNING
    assert "MatchingRuleNotSupported" in fault[1]
    assert "relate to no Probe we sent" in stray[1]
    assert scan._cameras == {}


async def test_a_late_answer_to_our_probe_is_checked_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    scan = scanner()
    scan._old_probe_ids.append("urn:uuid:old")
    scan._on_datagram(datagram("probematches-gsoap-soap12.xml", "urn:uuid:old"), "192.0.2.10")
    ((level, text),) = records(caplog)
    assert level == logging.DEBUG
    assert "answered after discoveryTimeoutSeconds (1); checked at once" in text
    assert list(scan._cameras) == ["2419d68a-2dd2-21b2-a205-ec3a7c5b1a01"]
    (check,) = scan._hello_tasks  # its check runs now, not at the next pass
    check.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await check
    # found healthy since the pass began: the answer to the Probe's repeat starts no check
    (camera,) = scan._cameras.values()
    camera.description, camera.checked_at = Description(), time.monotonic()
    scan._on_datagram(datagram("probematches-gsoap-soap12.xml", "urn:uuid:old"), "192.0.2.10")
    assert not scan._hello_tasks


def test_other_devices_hellos_are_only_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    scanner()._on_datagram(datagram("hello-windows-pc.xml"), "192.0.2.20")
    ((level, text),) = records(caplog)
    assert level == logging.DEBUG
    assert "not a NetworkVideoTransmitter" in text

