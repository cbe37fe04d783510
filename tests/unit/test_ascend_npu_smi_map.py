"""Which /dev/davinci<N> an ``npu-smi info`` row is: the tool's own mapping tables.

NPU ids are card numbers: real nodes show them starting at 1 and skipping (an Atlas 300I Duo
node with cards in slots 1, 2 and 7; a 910B1 node whose first chip is NPU 1). The tables below
have the layout ``npu-smi info -m`` prints (tab-indented columns 31 wide, the chip name with a
space, one ``Mcu`` row per card with logic id ``-``; on A3 a ``Chip Phy-ID`` column) and the
``key : value`` lines of ``npu-smi info -t phyid-remap -p <phy>``, with values of our own.
"""

from __future__ import annotations

import pytest

from discovery_handlers.ascend.npu_smi import (
    NpuSmiError,
    assign_ids,
    parse_npu_smi_info,
    parse_npu_smi_map,
    parse_phyid_remap,
)


def map_row(*cells: object) -> str:
    return "\t" + "".join(f"{c!s:<31}" for c in cells) + "\n"


#: Three Atlas 300I Duo cards in NPU slots 1, 2 and 7, two chips each.
MAP_DUO = "".join([
    map_row("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name"),
    map_row(1, 0, 0, "Ascend 310P3"), map_row(1, 1, 1, "Ascend 310P3"), map_row(1, 2, "-", "Mcu"),
    map_row(2, 0, 2, "Ascend 310P3"), map_row(2, 1, 3, "Ascend 310P3"), map_row(2, 2, "-", "Mcu"),
    map_row(7, 0, 4, "Ascend 310P3"), map_row(7, 1, 5, "Ascend 310P3"), map_row(7, 2, "-", "Mcu"),
])

#: The same node's ``npu-smi info`` (Duo layout: a ``Chip Device`` column holding the logic id).
RULE = "+-------------------------------+-----------------+" + "-" * 54 + "+\n"
INFO_DUO = "".join([
    RULE, "| npu-smi 23.0.0" + " " * 34 + "Version: 23.0.0" + " " * 40 + "|\n", RULE,
    "| NPU     Name                  | Health          | Power(W)     Temp(C)           "
    "Hugepages-Usage(page) |\n",
    "| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)  "
    "                      |\n",
    *(f"| {npu:<7} 310P3                 | OK              | NA           50                "
      f"0     / 0             |\n"
      f"| {chip:<7} {logic:<21} | 0000:{bus:02X}:00.0    | 0            1700 / 44280      "
      f"                      |\n" + RULE
      for npu, chip, logic, bus in ((1, 0, 0, 0x01), (1, 1, 1, 0x01), (2, 0, 2, 0x41),
                                    (2, 1, 3, 0x41), (7, 0, 4, 0x81), (7, 1, 5, 0x81))),
])

#: An A3 node: two dies per NPU, the physical id in a column of its own.
MAP_A3 = "".join([
    map_row("NPU ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name"),
    map_row(0, 0, 0, 0, "Ascend910"), map_row(0, 1, 1, 1, "Ascend910"),
    map_row(0, 2, "-", "-", "Mcu"),
    map_row(1, 0, 2, 4, "Ascend910"), map_row(1, 1, 3, 5, "Ascend910"),
    map_row(1, 2, "-", "-", "Mcu"),
])


def remap(phy: int, npu: int, chip: int) -> str:
    return "".join(f"\t{key:<30}:{value}\n" for key, value in (
        ("Chip Phy-ID", phy), ("NPU ID", npu), ("Slot ID", npu), ("Chip ID", chip)))


def test_the_map_skips_mcus_and_keeps_names_with_spaces() -> None:
    rows = parse_npu_smi_map(MAP_DUO)
    assert sorted(rows) == [(1, 0), (1, 1), (2, 0), (2, 1), (7, 0), (7, 1)]
    assert rows[(7, 1)].logic_id == 5
    assert rows[(7, 1)].phy_id is None
    assert rows[(7, 1)].name == "Ascend 310P3"


def test_the_phy_id_column_is_read() -> None:
    rows = parse_npu_smi_map(MAP_A3)
    assert [(k, r.logic_id, r.phy_id) for k, r in sorted(rows.items())] == [
        ((0, 0), 0, 0), ((0, 1), 1, 1), ((1, 0), 2, 4), ((1, 1), 3, 5)]


@pytest.mark.parametrize(("text", "words"), [
    ("", "no 'NPU ID  Chip ID  Chip Logic ID  Chip Name' header"),
    ("Error: the device is busy\n", "no 'NPU ID"),
    (map_row("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name") + map_row(0, 1, "-", "Mcu"),
     "lists no chip"),
])
def test_output_that_is_not_the_map_is_refused(text: str, words: str) -> None:
    with pytest.raises(NpuSmiError, match=words):
        parse_npu_smi_map(text)


def test_npu_ids_from_1_with_gaps_map_to_the_remapped_physical_ids() -> None:
    chips = parse_npu_smi_info(INFO_DUO).chips
    assert [(c.card_id, c.device_index) for c in chips] == [
        (1, 0), (1, 1), (2, 0), (2, 1), (7, 0), (7, 1)]
    # Physical ids as the driver numbers the device nodes: here not the logic ids.
    answers = [parse_phyid_remap(remap(phy, npu, chip)) for phy, npu, chip in (
        (0, 1, 0), (1, 1, 1), (4, 2, 0), (5, 2, 1), (8, 7, 0), (9, 7, 1))]
    table = {(npu, chip): phy for phy, npu, chip in filter(None, answers)}
    problems: list[str] = []
    mapped = assign_ids(chips, parse_npu_smi_map(MAP_DUO), table, problems)
    assert [(c.phy_id, c.logic_id) for c in mapped] == [
        (0, 0), (1, 1), (4, 2), (5, 3), (8, 4), (9, 5)]
    assert problems == []


def test_without_remap_answers_the_logic_id_is_assumed_and_said() -> None:
    problems: list[str] = []
    mapped = assign_ids(parse_npu_smi_info(INFO_DUO).chips, parse_npu_smi_map(MAP_DUO), {},
                        problems)
    assert [c.phy_id for c in mapped] == [0, 1, 2, 3, 4, 5]  # never the NPU ids 1, 2, 7
    assert problems == ["physical ids assumed (no mapping from npu-smi): NPU 1 chip 0 -> 0 "
                        "(its logic id), NPU 1 chip 1 -> 1 (its logic id), NPU 2 chip 0 -> 2 "
                        "(its logic id), NPU 2 chip 1 -> 3 (its logic id), NPU 7 chip 0 -> 4 "
                        "(its logic id), NPU 7 chip 1 -> 5 (its logic id)"]


def test_a_row_the_map_does_not_list_is_left_out() -> None:
    problems: list[str] = []
    partial = MAP_DUO.replace(map_row(7, 1, 5, "Ascend 310P3"), "")
    mapped = assign_ids(parse_npu_smi_info(INFO_DUO).chips, parse_npu_smi_map(partial),
                        {(n, c): p for p, (n, c) in enumerate(
                            [(1, 0), (1, 1), (2, 0), (2, 1), (7, 0)])}, problems)
    assert [c.phy_id for c in mapped] == [0, 1, 2, 3, 4]
    assert problems == ["NPU 7 chip 1: not in npu-smi info -m, left out"]


@pytest.mark.parametrize(("text", "expected"), [
    (remap(3, 1, 1), (3, 1, 1)),
    ("\tChip Physical ID              :6\n\tNPU ID                        :7\n"
     "\tChip ID                       :0\n", (6, 7, 0)),
    ("Error: phy id 9 does not exist\n", None),
    ("\tChip Phy-ID                   :0\n\tNPU ID                        :0\n", None),
])
def test_phyid_remap(text: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_phyid_remap(text) == expected
