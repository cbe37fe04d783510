"""Parsing `npu-smi info` tables as npu-smi 23.x to 25.x print them, and refusing what is not one.

The tables below have the layout of Huawei's tool (910B servers: one chip per NPU with an
HBM column; Atlas 300I Duo cards: a `Chip Device` column), with values of our own.
"""

from __future__ import annotations

import pytest

from discovery_handlers.ascend.npu_smi import NpuSmiError, parse_npu_smi_info

TABLE_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc2                 Version: 24.1.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 90.1        35                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3100 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Warning       | 91.7        36                0    / 0             |
| 0                         | 0000:C2:00.0  | 4           0    / 0          61000/ 65536         |
+===========================+===============+====================================================+
| 2     910B3               | Critical      | 88.0        34                0    / 0             |
| 0                         | 0000:81:00.0  | 0           0    / 0          3100 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 1       0                 | 4242          | python3                  | 57600                   |
+===========================+===============+====================================================+
"""

TABLE_310P_DUO = "".join([
    "+-----------------------------------------------------------"
    "---------------------------------------------+\n",
    "| npu-smi 23.0.0                                   Version: "
    "23.0.0                                       |\n",
    "+-------------------------------+-----------------+---------"
    "---------------------------------------------+\n",
    "| NPU     Name                  | Health          | Power(W)"
    "     Temp(C)           Hugepages-Usage(page) |\n",
    "| Chip    Device                | Bus-Id          | AICore(%"
    ")    Memory-Usage(MB)                        |\n",
    "+===============================+=================+========="
    "=============================================+\n",
    "| 1       310P3                 | OK              | NA      "
    "     50                0     / 0             |\n",
    "| 0       0                     | 0000:01:00.0    | 0       "
    "     1700 / 44280                            |\n",
    "+-------------------------------+-----------------+---------"
    "---------------------------------------------+\n",
    "| 1       310P3                 | OK              | NA      "
    "     48                0     / 0             |\n",
    "| 1       1                     | 0000:01:00.0    | 0       "
    "     1500 / 43693                            |\n",
    "+===============================+=================+========="
    "=============================================+\n",
])


def test_910b_table_gives_model_memory_bus_and_health() -> None:
    table = parse_npu_smi_info(TABLE_910B)
    assert table.problems == ()
    assert [(c.phy_id, c.card_id, c.device_index, c.model, c.memory_mb, c.bus_id)
            for c in table.chips] == [
        (0, 0, 0, "Ascend910B3", 65536, "0000:C1:00.0"),
        (1, 1, 0, "Ascend910B3", 65536, "0000:C2:00.0"),
        (2, 2, 0, "Ascend910B3", 65536, "0000:81:00.0"),
    ]
    assert [c.family for c in table.chips] == ["Ascend910"] * 3
    assert [c.health.healthy for c in table.chips] == [True, True, False]
    assert table.chips[2].health.reason == "npu-smi health 'Critical'"


def test_duo_table_reads_the_device_column_and_memory_without_hbm() -> None:
    table = parse_npu_smi_info(TABLE_310P_DUO)
    assert [(c.phy_id, c.logic_id, c.card_id, c.device_index, c.memory_mb, c.family)
            for c in table.chips] == [
        (0, 0, 1, 0, 44280, "Ascend310P"),
        (1, 1, 1, 1, 43693, "Ascend310P"),
    ]


def test_phy_id_column_wins() -> None:
    text = TABLE_910B.replace("| Chip                      |", "| Chip  Phy-ID              |")
    text = text.replace("| 0                         | 0000:C2",
                        "| 0     9                   | 0000:C2")
    chips = parse_npu_smi_info(text).chips
    assert [c.phy_id for c in chips][1] == 9


def test_a_bad_row_is_skipped_and_named() -> None:
    text = TABLE_910B.replace("| 1     910B3               | Warning ",
                              "| one   910B3               | Warning ")
    table = parse_npu_smi_info(text)
    assert [c.phy_id for c in table.chips] == [0, 2]
    assert len(table.problems) == 1
    assert "expected '<NPU id> <name>'" in table.problems[0]


@pytest.mark.parametrize(("text", "words"), [
    ("", "no 'NPU Name | Health' table header"),
    ("dcmi model initialized failed, because the device is used. ret is -8020\n",
     "no 'NPU Name | Health' table header"),
    ("\x00\xff| garbage |\n" * 10, "no 'NPU Name | Health' table header"),
    ("| NPU   Name | Health | x |\n| Chip | Bus-Id | y |\n", "lists no chips"),
    ("| x |\n" * 5000, "table rows: not npu-smi info output"),
])
def test_output_that_is_not_the_table_is_refused(text: str, words: str) -> None:
    with pytest.raises(NpuSmiError, match=words.replace("|", r"\|")):
        parse_npu_smi_info(text)
