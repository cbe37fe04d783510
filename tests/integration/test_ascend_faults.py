"""Huawei's fault semantics through the DCMI stand-in: each chip raises an error code of one
handling level and the handler judges it as Huawei's plugin does.

Stands in for a real node: tests/harness/ascend_dcmi/fake_dcmi.c reports the error codes through
``dcmi_get_device_errorcode_v2`` (Huawei's signature), as a driver reports a chip's faults.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.contract import Device
from tests.harness.ascend_node import LEVEL_CODES as CODES
from tests.harness.ascend_node import AscendNode, SimChip, dcmi_library

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
DEADLINE_S = 10.0
#: (DCMI health level, error codes, healthy): one chip each; the level is what Huawei ignores.
CHIPS = [
    (0, (), True),
    (3, (), True),  # a critical level with no error code: Huawei's plugin keeps the chip
    (0, (CODES["NotHandleFault"],), True),
    (1, (CODES["SubHealthFault"],), True),
    (0, (CODES["RestartRequest"],), False),
    (2, (CODES["RestartBusiness"],), False),
    (0, (CODES["FreeRestartNPU"],), False),
    (3, (CODES["RestartNPU"],), False),
    (0, (CODES["PreSeparateNPU"],), False),
    (3, (CODES["SeparateNPU"],), False),
    (0, (0x0BADC0DE,), False),  # not in the table: SeparateNPU
]


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    chips = [SimChip(card=i, dev=0, logic=i, phy=i, health=level, errors=errors)
             for i, (level, errors, _) in enumerate(CHIPS)]
    emulated = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    for name, value in emulated.env.items():
        monkeypatch.setenv(name, value)
    return emulated


async def first_list(details: str, properties: dict[str, str]) -> list[Device]:
    stream = handler.discover(handler.parse_details(details, properties))
    try:
        return list(await asyncio.wait_for(anext(stream), DEADLINE_S))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_fault_codes_of_each_level_give_huaweis_health(node: AscendNode) -> None:
    devices = await first_list(node.details(), {})
    assert [d.health.healthy for d in devices] == [healthy for _, _, healthy in CHIPS]
    assert devices[7].health.reason == (
        "fault level RestartNPU: error codes 0x8C03A000 RestartNPU "
        "(Huawei's default faultCode.json)")
    assert devices[10].health.reason.startswith(
        "fault level SeparateNPU: error codes 0x0BADC0DE unknown")


async def test_a_users_fault_table_from_a_configmap_key(node: AscendNode) -> None:
    # What the agent hands the handler for a discoveryProperty read from a ConfigMap key.
    table = json.dumps({"NotHandleFaultCodes": ["8C03A000", "0BADC0DE"],
                        "RestartBusinessCodes": ["80E21007"]})
    devices = await first_list(node.details(), {"FAULT_CODE_JSON": table})
    healthy = [d.health.healthy for d in devices]
    assert healthy[2] is False  # NotHandleFault by default, RestartBusiness in the user's
    assert healthy[7] is True
    assert healthy[10] is True
    assert healthy[4] is False  # not in the user's table at all: unknown, SeparateNPU


async def test_npu_smi_maps_npu_ids_from_1_with_gaps_to_the_device_nodes(
        tmp_path: Path, dcmi_library: Path) -> None:
    # NPU (card) ids 1, 2 and 7, two chips each; physical ids are not the logic ids. Without
    # DCMI, npu-smi's own mapping (info -m, info -t phyid-remap) names the device nodes.
    layout = [(1, 0, 0, 0), (1, 1, 1, 1), (2, 0, 2, 4), (2, 1, 3, 5), (7, 0, 4, 8), (7, 1, 5, 9)]
    chips = [SimChip(card=card, dev=dev, logic=logic, phy=phy)
             for card, dev, logic, phy in layout]
    emulated = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    devices = await first_list(emulated.details(sources=["npu-smi"]), {})
    assert [d.id for d in devices] == ["davinci0", "davinci1", "davinci4", "davinci5",
                                       "davinci8", "davinci9"]
    assert all(d.health.healthy for d in devices)
    assert [d.properties["ASCEND_LOGIC_ID"] for d in devices] == ["0", "1", "2", "3", "4", "5"]
    assert [d.properties["ASCEND_CARD_ID"] for d in devices] == ["1", "1", "2", "2", "7", "7"]
