"""A chip offered to DRA as partitions: for each vNPU type asked for, every slice the chip could
be cut into is a device consuming the chip's counter set (AI cores, memory), so the scheduler
splits the chip per claim without overcommit. No I/O.

How the counts and figures are chosen: docs/handlers/ascend.md, "A chip split by the
scheduler"; the vNPU of an allocated partition is created at its claim's prepare
(``vnpu_claims``).
"""

from __future__ import annotations

from collections.abc import Sequence

from discovery_handlers.ascend.chips import Chip
from discovery_handlers.ascend.devices import (
    EXTRA_CARD,
    EXTRA_DEVICE_INDEX,
    EXTRA_PHY,
    PROP_AICORE,
    PROP_FAMILY,
    PROP_MEMORY,
    PROP_MODEL,
    PROP_PHYSICAL_ID,
    PROP_VNPU_TEMPLATE,
    PROP_VNPU_TYPE,
    device_id,
)
from discovery_handlers.ascend.vnpu import (
    TEMPLATE_TYPES,
    template_aicore,
    template_memory_mb,
    vnpu_type,
)
from discovery_handlers.contract import (
    PARTITION_CONSUMES,
    PARTITION_COUNTER_SET,
    PARTITION_SHARED,
    Device,
    Health,
)

#: ``extra`` key of a partition (its template), for ``prepare``.
EXTRA_PARTITION = "partition"
COUNTER_AICORE = "aicore"
COUNTER_MEMORY = "memory"
_BINARY = ("Mi", "Gi", "Ti", "Pi")


def quantity_mib(mib: int) -> str:
    """``mib`` MiB as the API server writes the quantity back (canonical: 4096 → ``4Gi``), so
    what is published reads back the same."""
    unit = 0
    while mib and mib % 1024 == 0 and unit < len(_BINARY) - 1:
        mib //= 1024
        unit += 1
    return f"{mib}{_BINARY[unit]}"


def partition_devices(chip: Chip, kinds: Sequence[str], *, health: Health,
                      problems: list[str]) -> list[Device]:
    """The partitions of ``chip`` for the vNPU types ``kinds`` (none when its AI cores or
    memory are unknown, said in ``problems``)."""
    if not chip.aicore_count or not chip.memory_mb:
        problems.append(f"{device_id(chip.phy_id)}: AI cores or memory unknown (DCMI gives "
                        "them): no partitions offered")
        return []
    shared = (f"{COUNTER_AICORE}={chip.aicore_count},"
              f"{COUNTER_MEMORY}={quantity_mib(chip.memory_mb)}")
    extra = {EXTRA_PHY: str(chip.phy_id)}
    if chip.card_id is not None and chip.device_index is not None:
        extra.update({EXTRA_CARD: str(chip.card_id), EXTRA_DEVICE_INDEX: str(chip.device_index)})
    out = []
    for template in TEMPLATE_TYPES:
        kind = vnpu_type(chip.family, template)
        cores = template_aicore(template)
        if kind not in kinds or not cores:
            continue
        memory = template_memory_mb(template) or chip.memory_mb * cores // chip.aicore_count
        count = min(chip.aicore_count // cores, chip.memory_mb // memory)
        for index in range(count):
            props = {
                PROP_VNPU_TYPE: kind, PROP_VNPU_TEMPLATE: template,
                PROP_PHYSICAL_ID: str(chip.phy_id), PROP_AICORE: str(cores),
                PROP_MEMORY: str(memory), PROP_MODEL: chip.model, PROP_FAMILY: chip.family,
                PARTITION_COUNTER_SET: device_id(chip.phy_id),
                PARTITION_CONSUMES: f"{COUNTER_AICORE}={cores},"
                                    f"{COUNTER_MEMORY}={quantity_mib(memory)}",
                PARTITION_SHARED: shared,
            }
            out.append(Device(
                id=f"{device_id(chip.phy_id)}-{template.replace('_', '-')}-{index}",
                properties={k: v for k, v in props.items() if v}, health=health,
                extra={**extra, EXTRA_PARTITION: template}))
    return out
