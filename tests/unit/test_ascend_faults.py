"""Huawei's fault semantics: error codes → handling level → health, and a user's faultCode.json.

The codes below are in Huawei's default table (their plugin's faultCode.json) at the level
named; the expected health restates their plugin's rule (usable at NotHandleFault and
SubHealthFault only, unknown codes at SeparateNPU, the most serious level holding any code).
"""

from __future__ import annotations

import json

import pytest

from discovery_handlers.ascend.details import parse_details
from discovery_handlers.ascend.faults import (
    FaultTableError,
    chip_health,
    default_table,
    parse_fault_table,
)
from discovery_handlers.contract import InvalidDetails
from tests.harness.ascend_node import LEVEL_CODES

CODES = LEVEL_CODES


@pytest.mark.parametrize(("level", "healthy"), [
    ("NotHandleFault", True), ("SubHealthFault", True), ("RestartRequest", False),
    ("RestartBusiness", False), ("FreeRestartNPU", False), ("RestartNPU", False),
    ("PreSeparateNPU", False), ("SeparateNPU", False),
])
def test_each_level_gives_huaweis_health(level: str, healthy: bool) -> None:
    table = default_table()
    code = CODES[level]
    assert table.level_of([code]) == level
    health = chip_health((code,), table)
    assert health.healthy is healthy
    if not healthy:
        assert health.reason == (f"fault level {level}: error codes 0x{code:08X} {level} "
                                 "(Huawei's default faultCode.json)")


def test_no_code_is_healthy_and_unread_codes_judge_nothing() -> None:
    assert chip_health((), default_table()).healthy
    assert chip_health(None, default_table()).healthy


def test_unknown_codes_are_separate_npu_unless_a_known_code_is_there() -> None:
    table = default_table()
    assert table.level_of([0x12345678]) == "SeparateNPU"
    reason = chip_health((0x12345678,), table).reason
    assert reason.startswith("fault level SeparateNPU: error codes 0x12345678 unknown")
    # Huawei's plugin looks for any code of each level in turn, so a known code decides.
    assert table.level_of([0x12345678, CODES["NotHandleFault"]]) == "NotHandleFault"


def test_the_most_serious_level_wins() -> None:
    table = default_table()
    codes = (CODES["NotHandleFault"], CODES["RestartNPU"], CODES["RestartBusiness"])
    assert table.level_of(codes) == "RestartNPU"
    assert chip_health(codes, table).reason == (
        "fault level RestartNPU: error codes 0x80E21007 NotHandleFault, 0x8C03A000 RestartNPU, "
        "0x80E01801 RestartBusiness (Huawei's default faultCode.json)")


def test_a_users_table_replaces_the_default() -> None:
    text = json.dumps({"NotHandleFaultCodes": ["80E01801"], "SeparateNPUCodes": ["80e21007"],
                       "SomethingElse": 3})
    parsed = parse_details("", {"FAULT_CODE_JSON": text})
    assert parsed.faults.level_of([0x80E01801]) == "NotHandleFault"
    assert parsed.faults.level_of([0x80E21007]) == "SeparateNPU"
    assert parsed.faults.level_of([0x8C03A000]) == "SeparateNPU"  # not in the user's: unknown
    assert "FAULT_CODE_JSON" in chip_health((0x80E21007,), parsed.faults).reason
    assert parse_details("", {}).faults.level_of([0x80E01801]) == "RestartBusiness"


@pytest.mark.parametrize(("text", "words"), [
    ("not json", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"Other": []}', "holds none of"),
    ('{"NotHandleFaultCodes": "80E01801"}', "NotHandleFaultCodes must be a list"),
    ('{"RestartNPUCodes": ["80E0180Z"]}', r"RestartNPUCodes\[0\]: '80E0180Z' is not a hex"),
    ('{"RestartNPUCodes": [12]}', r"RestartNPUCodes\[0\]: '12' is not a hex"),
])
def test_a_bad_table_is_refused_naming_the_key(text: str, words: str) -> None:
    with pytest.raises(FaultTableError, match=words):
        parse_fault_table(text, "test")
    with pytest.raises(InvalidDetails, match="FAULT_CODE_JSON"):
        parse_details("", {"FAULT_CODE_JSON": text})
