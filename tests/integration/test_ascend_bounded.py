"""Every DCMI call bounded: a DCMI call that never returns, as after a card drops off the bus.

Stands in for a real node: the DCMI library is tests/harness/ascend_dcmi/fake_dcmi.c compiled
here (Huawei's C signatures); a ``hang`` line in its state makes one function block for one
card, through ctypes, exactly as a hung driver call blocks the calling thread. The handler must
mark that card's chips unhealthy within a poll and the timeout, keep the other cards as they
are, keep polling, and keep answering ``prepare`` (the kubelet's ``PreStartContainer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.handler import ChipsUnhealthy
from discovery_handlers.contract import Device
from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
#: Far more than a poll (1 s) and the timeout (0.5 s): reaching it is a failure.
DEADLINE_S = 10.0
TIMEOUT_S = 0.5


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[AscendNode]:
    # Four cards of two chips: card 1 holds physical ids 2 and 3.
    emulated = AscendNode(tmp_path / "host", chips_910b(8, per_card=2), library=dcmi_library)
    for name, value in emulated.env.items():
        monkeypatch.setenv(name, value)
    yield emulated
    emulated.unhang()  # lets a hung call of the stand-in return


def details(node: AscendNode, **fields: object) -> AscendDetails:
    return handler.parse_details(node.details(dcmiTimeoutSeconds=TIMEOUT_S, **fields), {})


async def next_list(stream: AsyncIterator[Sequence[Device]]) -> dict[str, Device]:
    return {d.id: d for d in await asyncio.wait_for(anext(stream), DEADLINE_S)}


def unhealthy(devices: dict[str, Device]) -> list[str]:
    return sorted(d for d, device in devices.items() if not device.health.healthy)


async def test_a_hung_call_marks_its_card_unhealthy_and_nothing_else(node: AscendNode) -> None:
    parsed = details(node)
    stream = handler.discover(parsed)
    try:
        assert unhealthy(await next_list(stream)) == []
        node.hang("dcmi_get_device_health", 1)
        hung = await next_list(stream)
        assert unhealthy(hung) == ["davinci2", "davinci3"]
        reason = hung["davinci2"].health.reason
        assert reason.startswith("card 1: DCMI dcmi_get_device_health (card 1) did not answer "
                                 "within 0.5 s (stuck since ")
        assert hung["davinci3"].health.reason == reason
        # The chips keep what DCMI told of them before.
        assert hung["davinci2"].properties["ASCEND_CHIP_MODEL"] == "Ascend910B3"

        # Later polls go on (a fault on another card is seen) and answer for the stuck card
        # at once, with the same reason.
        node.fault(6)
        later = await next_list(stream)
        assert unhealthy(later) == ["davinci2", "davinci3", "davinci6"]
        assert later["davinci2"].health.reason == reason

        # PreStartContainer: other cards' chips are prepared, the stuck card's are refused.
        await asyncio.wait_for(handler.prepare(parsed, [later["davinci0"], later["davinci5"]]),
                               DEADLINE_S)
        with pytest.raises(ChipsUnhealthy, match=r"davinci3 is unhealthy: card 1: DCMI "
                                                 r"dcmi_get_device_health"):
            await asyncio.wait_for(handler.prepare(parsed, [later["davinci3"]]), DEADLINE_S)

        # The call returns (the card came back): the card is read again.
        node.clear(6)
        node.unhang()
        assert unhealthy(await next_list(stream)) == []
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_a_hung_card_list_keeps_the_cards_listed_before(node: AscendNode) -> None:
    parsed = details(node)
    stream = handler.discover(parsed)
    try:
        assert len(await next_list(stream)) == 8
        node.hang("dcmi_get_card_list", -1)
        node.fault(0)  # the cards themselves still answer
        devices = await next_list(stream)
        assert unhealthy(devices) == ["davinci0"]
        status = str(handler.status(parsed))
        assert "DCMI dcmi_get_card_list (library) did not answer within 0.5 s" in status
        assert "using the cards listed before" in status
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_a_hung_init_fails_over_to_npu_smi(node: AscendNode) -> None:
    library = node.library_copy("libdcmi-hung.so")  # its own dlopen handle and state
    node.hang("dcmi_init", -1)
    parsed = details(node, libraryPath=library)
    stream = handler.discover(parsed)
    try:
        devices = await next_list(stream)
        assert len(devices) == 8
        assert unhealthy(devices) == []
        status = handler.status(parsed)
        assert status.source == "npu-smi"
        assert "DCMI dcmi_init (library) did not answer within 0.5 s" in str(status)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
