"""Reading Huawei's ``npu-smi`` tool, the ``ascend`` handler's second source where DCMI cannot be
loaded: ``npu-smi info`` as ``Chip`` records, its mapping tables (``info -m``, ``info -t
phyid-remap``) for each chip's physical id, and ``info -t info-vnpu`` for a chip's vNPUs. The
tables are for people, so they are read defensively: a row that does not read is skipped and
named; output without the table is an error. docs/handlers/ascend.md, "Sources, and the status".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from discovery_handlers.ascend.chips import Chip, npu_smi_health
from discovery_handlers.ascend.vnpu import VNpu, template_aicore, template_memory_mb

_FIRST = re.compile(r"^(\d+)\s+(\S+)$")  # "0     910B3"
_SECOND = re.compile(r"^(\d+)(?:\s+(\d+))?$")  # "0" or "0     1"
_FRACTION = re.compile(r"(\d+)\s*/\s*(\d+)")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
MAX_ROWS = 4096  # more rows than any node has chips: the output is not npu-smi's


_MAP_HEADER = re.compile(r"NPU ID\s+Chip ID\s+Chip Logic ID\s+(Chip Phy-ID\s+)?Chip Name")
_MAP_ROW = re.compile(r"^(\d+)\s+(\d+)\s+(\d+|-)\s+(.*)$")
_MAP_ROW_PHY = re.compile(r"^(\d+)\s+(\d+)\s+(\d+|-)\s+(\d+|-)\s+(.*)$")
_REMAP_LINE = re.compile(r"^\s*(Chip Phy-ID|Chip Physical ID|NPU ID|Chip ID)\s*:\s*(\d+)\s*$")


#: What every ``info -t info-vnpu`` table prints, with the count of vNPUs.
VNPU_TOTAL = "Total number of vnpu"
_VNPU_TOTAL = re.compile(VNPU_TOTAL + r"\s*:\s*(\d+)")
_VNPU_ROW = re.compile(r"^\|?\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([0-9A-Fa-f]+)\s*\|\s*(\d+)\s*\|"
                       r"\s*(vir[0-9A-Za-z_]+)\s*\|?\s*$")
_VNPU_UNSUPPORTED = "does not support"


class NpuSmiError(ValueError):
    """The output is not an ``npu-smi info`` table."""


@dataclass(frozen=True)
class MapRow:
    """One compute chip of ``npu-smi info -m``."""

    npu: int
    chip: int
    logic_id: int
    phy_id: int | None  # only where the table has a Chip Phy-ID column
    name: str


def parse_npu_smi_map(text: str) -> dict[tuple[int, int], MapRow]:
    """``npu-smi info -m`` as (NPU id, chip id) → row; MCU rows (logic id ``-``) are left out.
    Raise ``NpuSmiError`` when the output has no mapping table.

    One row per chip, ``NPU ID  Chip ID  Chip Logic ID  Chip Name``, on some products with
    ``Chip Phy-ID`` before the name; a card's MCU is listed with logic id ``-``. NPU ids are
    card numbers, not chip ids: they need not start at 0 and may skip (an Atlas 300I Duo node
    shows NPU 1, 2 and 7)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_ROWS:
        raise NpuSmiError(f"{len(lines)} lines: not npu-smi info -m output")
    header = next(((i, m) for i, line in enumerate(lines)
                   if (m := _MAP_HEADER.search(line))), None)
    if header is None:
        raise NpuSmiError("no 'NPU ID  Chip ID  Chip Logic ID  Chip Name' header in "
                          "npu-smi info -m output")
    start, found = header
    with_phy = found.group(1) is not None
    rows: dict[tuple[int, int], MapRow] = {}
    for line in lines[start + 1:]:
        match = (_MAP_ROW_PHY if with_phy else _MAP_ROW).match(line)
        if match is None or match.group(3) == "-":
            continue  # an MCU, or a line that is not a row
        npu, chip, logic = int(match.group(1)), int(match.group(2)), int(match.group(3))
        phy = match.group(4) if with_phy else None
        rows[(npu, chip)] = MapRow(
            npu=npu, chip=chip, logic_id=logic,
            phy_id=int(phy) if phy is not None and phy != "-" else None,
            name=match.group(5 if with_phy else 4).strip(),
        )
    if not rows:
        raise NpuSmiError("npu-smi info -m lists no chip")
    return rows


def parse_info_vnpu(text: str) -> tuple[VNpu, ...]:
    """``npu-smi info -t info-vnpu -i <npu> -c <chip>`` as the chip's vNPUs (() when the chip
    cannot be split). Raise ``NpuSmiError`` when the output is neither, or its rows do not add
    up to the total it prints.

    The output is a box with the chip's free/total resources, ``Total number of vnpu: <n>`` and
    a row per vNPU, each vNPU's AI cores and memory taken from its template name::

        |  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
        |  100      |  0             |  000000000000  |  0       |  vir10_3c_16g        |

    or ``This device does not support querying info-vnpu.`` on chips that cannot be split."""
    lines = text.splitlines()[:MAX_ROWS]
    total = next((m for line in lines if (m := _VNPU_TOTAL.search(line))), None)
    if total is None:
        if any(_VNPU_UNSUPPORTED in line for line in lines):
            return ()
        raise NpuSmiError("no 'Total number of vnpu' in npu-smi info -t info-vnpu output")
    found = []
    for line in lines:
        match = _VNPU_ROW.match(line.strip())
        if match is None:
            continue
        template = match.group(5)
        found.append(VNpu(
            vdev_id=int(match.group(1)), template=template, aicore=template_aicore(template),
            memory_mb=template_memory_mb(template), vgroup=int(match.group(2)),
            status=int(match.group(4)), in_container=int(match.group(3), 16) != 0,
        ))
    if len(found) != int(total.group(1)):
        raise NpuSmiError(f"npu-smi info -t info-vnpu lists {len(found)} vNPU rows but says "
                          f"'Total number of vnpu: {total.group(1)}'")
    return tuple(found)


def parse_phyid_remap(text: str) -> tuple[int, int, int] | None:
    """``npu-smi info -t phyid-remap -p <phy>`` as (phy id, NPU id, chip id); None when the
    output does not say all three (``Chip Phy-ID : 0``, ``NPU ID : 0``, ``Chip ID : 0``)."""
    fields: dict[str, int] = {}
    for line in text.splitlines()[:64]:
        match = _REMAP_LINE.match(line)
        if match is not None:
            key = "Chip Phy-ID" if match.group(1) == "Chip Physical ID" else match.group(1)
            fields.setdefault(key, int(match.group(2)))
    if set(fields) != {"Chip Phy-ID", "NPU ID", "Chip ID"}:
        return None
    return fields["Chip Phy-ID"], fields["NPU ID"], fields["Chip ID"]


def assign_ids(
    chips: tuple[Chip, ...], mapping: dict[tuple[int, int], MapRow] | None,
    remap: dict[tuple[int, int], int], problems: list[str],
) -> tuple[Chip, ...]:
    """The chips of ``npu-smi info`` with their physical and logic ids from the mapping tables,
    joined on (NPU id, chip id): the ``Phy-ID`` column, else the remap answers, else the logic
    id, else, with no mapping at all, the table's own id column or the NPU id. ``problems``
    gets a line for every id that was assumed."""
    out = []
    assumed: list[str] = []
    for chip in chips:
        key = (chip.card_id if chip.card_id is not None else -1, chip.device_index or 0)
        row = mapping.get(key) if mapping is not None else None
        if mapping is not None and row is None:
            problems.append(f"NPU {key[0]} chip {key[1]}: not in npu-smi info -m, left out")
            continue
        if row is None:
            out.append(chip)
            assumed.append(f"NPU {key[0]} chip {key[1]} -> {chip.phy_id}")
            continue
        if row.phy_id is not None:
            phy = row.phy_id
        elif key in remap:
            phy = remap[key]
        else:
            phy = row.logic_id
            assumed.append(f"NPU {key[0]} chip {key[1]} -> {phy} (its logic id)")
        out.append(replace(chip, phy_id=phy, logic_id=row.logic_id))
    if assumed:
        problems.append("physical ids assumed (no mapping from npu-smi): " + ", ".join(assumed))
    return tuple(out)


@dataclass(frozen=True)
class NpuSmiTable:
    chips: tuple[Chip, ...]
    problems: tuple[str, ...]  # rows skipped, and why


@dataclass(frozen=True)
class _Row:
    npu: int
    name: str
    health: str
    chip: int
    extra_id: int | None
    bus_id: str
    memory_mb: int | None


def parse_npu_smi_info(text: str) -> NpuSmiTable:
    """Parse the output of ``npu-smi info``; raise ``NpuSmiError`` when there is no table.

    The table (npu-smi 23.x to 25.x) has two header rows and two rows per chip (shown with the
    right-hand cell cut short)::

        | NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-...
        | Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)
        +===========================+===============+=============================================
        | 0     910B3               | OK            | 96.8        32                0    / 0
        | 0                         | 0000:C1:00.0  | 0           0    / 0          3372 / 65536

    followed by a process table (``| NPU  Chip | Process id | ...``), which is not read. Some
    products add a column to the second header row: ``Chip  Device`` (the logic id, Atlas 300I
    Duo) or ``Chip  Phy-ID``."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    if len(rows) > MAX_ROWS:
        raise NpuSmiError(f"{len(rows)} table rows: not npu-smi info output")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    header = next((i for i, c in enumerate(cells)
                   if c and c[0].startswith("NPU") and "Name" in c[0] and len(c) >= 3), None)
    if header is None or header + 1 >= len(cells) or not cells[header + 1][0].startswith("Chip"):
        raise NpuSmiError("no 'NPU Name | Health' table header in npu-smi info output")
    second = cells[header + 1][0].split()
    id_kind = second[1] if len(second) > 1 else ""
    has_hbm = "HBM-Usage" in " ".join(cells[header + 1])
    body = []
    for row in cells[header + 2:]:
        if any("Process id" in c for c in row):
            break  # the process table follows the chips
        body.append(row)
    parsed: list[_Row] = []
    problems: list[str] = []
    index = 0
    while index < len(body):
        first = body[index]
        second_row = body[index + 1] if index + 1 < len(body) else None
        pair, problem = _pair(first, second_row, has_hbm=has_hbm)
        if pair is None:
            problems.append(f"table row {index + 1}: {problem}")
            # Skip the chip row of the NPU row that did not read, so it is not read as an NPU row.
            chip_row = second_row is not None and bool(second_row) and bool(
                _SECOND.match(second_row[0]))
            index += 2 if chip_row else 1
            continue
        parsed.append(pair)
        index += 2
    if not parsed and not problems:
        raise NpuSmiError("npu-smi info table lists no chips")
    return NpuSmiTable(chips=_chips(parsed, id_kind), problems=tuple(problems))


def _pair(first: list[str], second: list[str] | None, *, has_hbm: bool
          ) -> tuple[_Row | None, str]:
    if len(first) < 3:
        return None, f"expected 3 cells, got {len(first)}"
    head = _FIRST.match(first[0])
    if head is None:
        return None, f"expected '<NPU id> <name>', got {first[0][:40]!r}"
    if second is None or len(second) < 3:
        return None, "chip row missing after the NPU row"
    chip = _SECOND.match(second[0])
    if chip is None:
        return None, f"expected '<chip> [<id>]', got {second[0][:40]!r}"
    health = first[1].split()[0] if first[1].split() else ""
    bus_id = second[1] if _BUS_ID.match(second[1]) else ""
    fractions = _FRACTION.findall(second[2])
    memory: int | None = None
    if fractions:
        total = int(fractions[-1][1]) if has_hbm else int(fractions[0][1])
        if has_hbm and total == 0:
            total = int(fractions[0][1])
        memory = total or None
    return _Row(
        npu=int(head.group(1)), name=head.group(2), health=health, chip=int(chip.group(1)),
        extra_id=int(chip.group(2)) if chip.group(2) is not None else None,
        bus_id=bus_id, memory_mb=memory,
    ), ""


def _chips(rows: list[_Row], id_kind: str) -> tuple[Chip, ...]:
    per_npu: dict[int, int] = {}
    for row in rows:
        per_npu[row.npu] = per_npu.get(row.npu, 0) + 1
    one_per_npu = all(count == 1 for count in per_npu.values())
    chips = []
    for position, row in enumerate(rows):
        logic: int | None = None
        if id_kind == "Phy-ID" and row.extra_id is not None:
            phy = row.extra_id
        elif id_kind == "Device" and row.extra_id is not None:
            phy = logic = row.extra_id  # DCMI would map logic → phy; npu-smi does not say
        else:
            phy = row.npu if one_per_npu else position
        chips.append(Chip(
            phy_id=phy, card_id=row.npu, device_index=row.chip, logic_id=logic,
            chip_type="Ascend", chip_name=row.name, memory_mb=row.memory_mb,
            bus_id=row.bus_id, health=npu_smi_health(row.health),
        ))
    return tuple(chips)
