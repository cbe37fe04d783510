"""debugEcho: details parsing (errors name the field) and the availability file."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from discovery_handlers.contract import Device, InvalidDetails
from discovery_handlers.debug_echo import DESCRIPTION_PROPERTY, DebugEchoDetails, handler

NEXT_LIST_TIMEOUT = 5.0


def test_parses_descriptions_shared_and_file() -> None:
    details = handler.parse_details(
        "descriptions: [foo0, foo1]\nshared: false\navailabilityFile: /tmp/x\n", {}
    )
    assert details == DebugEchoDetails(("foo0", "foo1"), shared=False,
                                       availability_file=Path("/tmp/x"))


def test_shared_defaults_to_true() -> None:
    assert handler.parse_details("descriptions: [a]", {}).shared is True


@pytest.mark.parametrize(
    ("details", "field"),
    [
        ("", "descriptions"),
        ("descriptions: []", "descriptions"),
        ("descriptions: foo", "descriptions"),
        ("descriptions: [a, 3]", "descriptions[1]"),
        ("descriptions: [a, b, a]", "descriptions[2]"),
        ("descriptions: [a]\nshared: maybe", "shared"),
        ("descriptions: [a]\navailabilityFile: 7", "availabilityFile"),
        ("descriptions: [a]\ncolour: red", "colour"),
        ("descriptions: [a", "(root)"),
    ],
)
def test_bad_details_name_the_field(details: str, field: str) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(details, {})
    assert caught.value.field == field
    assert field in str(caught.value)


async def _next(stream: AsyncIterator[Sequence[Device]]) -> list[str]:
    devices = await asyncio.wait_for(anext(stream), NEXT_LIST_TIMEOUT)
    return [d.id for d in devices]


async def test_devices_carry_their_description() -> None:
    stream = handler.discover(handler.parse_details("descriptions: [foo0, foo1]", {}))
    devices = await asyncio.wait_for(anext(stream), NEXT_LIST_TIMEOUT)
    assert [(d.id, dict(d.properties)) for d in devices] == [
        ("foo0", {DESCRIPTION_PROPERTY: "foo0"}),
        ("foo1", {DESCRIPTION_PROPERTY: "foo1"}),
    ]
    await stream.aclose()  # type: ignore[attr-defined]


async def test_availability_file_takes_devices_offline_and_back(tmp_path: Path) -> None:
    availability = tmp_path / "offline"
    details = handler.parse_details(
        f"descriptions: [foo0, foo1]\navailabilityFile: {availability}", {}
    )
    stream = handler.discover(details)
    assert await _next(stream) == ["foo0", "foo1"]
    availability.write_text("foo1\n")
    assert await _next(stream) == ["foo0"]
    availability.write_text("OFFLINE\n")
    assert await _next(stream) == []
    availability.unlink()
    assert await _next(stream) == ["foo0", "foo1"]
    await stream.aclose()  # type: ignore[attr-defined]


async def test_a_replaced_availability_file_is_seen(tmp_path: Path) -> None:
    """Tools write a new file and rename it over the old one: the rename is a change too."""
    availability = tmp_path / "offline"
    details = handler.parse_details(f"descriptions: [a, b]\navailabilityFile: {availability}", {})
    stream = handler.discover(details)
    assert await _next(stream) == ["a", "b"]
    staged = tmp_path / "offline.new"
    staged.write_text("a\n")
    staged.rename(availability)
    assert await _next(stream) == ["b"]
    await stream.aclose()  # type: ignore[attr-defined]


async def test_a_rewrite_within_one_clock_tick_is_seen(tmp_path: Path) -> None:
    """Two writes within one tick of the kernel's coarse clock leave the file's inode, size and
    mtime as they were (set back here with utime, as such a tick leaves them): the notification
    still makes the handler read it."""
    availability = tmp_path / "offline"
    availability.write_text("a\n")
    details = handler.parse_details(f"descriptions: [a, b]\navailabilityFile: {availability}", {})
    stream = handler.discover(details)
    assert await _next(stream) == ["b"]
    before = availability.stat()
    with availability.open("r+") as same_inode:
        same_inode.write("b\n")
    os.utime(availability, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = availability.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    assert await _next(stream) == ["a"]
    await stream.aclose()  # type: ignore[attr-defined]


async def test_availability_file_in_a_directory_made_later(tmp_path: Path) -> None:
    """No directory to watch yet: the file is polled, and its later creation is seen."""
    availability = tmp_path / "later" / "offline"
    details = handler.parse_details(f"descriptions: [a, b]\navailabilityFile: {availability}", {})
    stream = handler.discover(details)
    assert await _next(stream) == ["a", "b"]
    availability.parent.mkdir()
    availability.write_text("b\n")
    assert await _next(stream) == ["a"]
    await stream.aclose()  # type: ignore[attr-defined]
