"""Static vNPUs: what the sources read of a chip's vNPUs, Huawei's template names and the vNPU
types (resource names) they become, and the AI cores and memory a template's name says. No I/O.

Facts restated from Huawei's device plugin and docs (Ascend/mind-cluster); the rules (a split
chip is served as its vNPUs only, unknown templates are not served) are in
docs/handlers/ascend.md, "Virtual NPUs".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Huawei's template names and the vNPU type suffix each becomes.
TEMPLATE_TYPES = {
    "vir01": "1c", "vir02": "2c", "vir04": "4c", "vir08": "8c", "vir16": "16c",
    "vir02_1c": "2c.1cpu", "vir04_3c": "4c.3cpu", "vir04_3c_ndvpp": "4c.3cpu.ndvpp",
    "vir04_4c_dvpp": "4c.4cpu.dvpp", "vir03_1c_8g": "3c.1cpu.8g", "vir05_1c_8g": "5c.1cpu.8g",
    "vir05_1c_16g": "5c.1cpu.16g", "vir06_1c_16g": "6c.1cpu.16g",
    "vir10_3c_16g": "10c.3cpu.16g", "vir10_3c_16g_nm": "10c.3cpu.16g.ndvpp",
    "vir10_3c_32g": "10c.3cpu.32g", "vir10_4c_16g_m": "10c.4cpu.16g.dvpp",
    "vir12_3c_32g": "12c.3cpu.32g",
}
#: The vNPU types Huawei's plugin registers, by chip family (its resource names less
#: ``huawei.com/``).
VNPU_TYPES = {
    "Ascend910": tuple(f"Ascend910-{TEMPLATE_TYPES[t]}" for t in (
        "vir02", "vir04", "vir08", "vir16", "vir03_1c_8g", "vir05_1c_8g", "vir05_1c_16g",
        "vir06_1c_16g", "vir10_3c_16g", "vir10_3c_16g_nm", "vir10_3c_32g", "vir10_4c_16g_m",
        "vir12_3c_32g")),
    "Ascend310P": tuple(f"Ascend310P-{TEMPLATE_TYPES[t]}" for t in (
        "vir01", "vir02", "vir04", "vir02_1c", "vir04_3c", "vir04_3c_ndvpp", "vir04_4c_dvpp")),
}
ALL_VNPU_TYPES = tuple(name for names in VNPU_TYPES.values() for name in names)
#: The runtime option Huawei's plugin sets for a vNPU (Ascend's container runtime reads it).
VIRTUAL = "VIRTUAL"

_CORES = re.compile(r"^vir(\d+)")
_MEMORY_GB = re.compile(r"_(\d+)g(?:_|$)")
_MIB_PER_GIB = 1024


@dataclass(frozen=True)
class VNpu:
    """One vNPU of a chip as a source saw it; ``None`` where the source could not tell."""

    vdev_id: int
    template: str  # "vir04"
    aicore: int | None = None
    memory_mb: int | None = None
    vgroup: int | None = None
    status: int | None = None
    in_container: bool | None = None


def vnpu_type(family: str, template: str) -> str:
    """``Ascend910`` + ``vir04`` → ``Ascend910-4c``; "" when Huawei's plugin would not serve
    it (an unknown template, or one not of the chip's family)."""
    suffix = TEMPLATE_TYPES.get(template)
    if suffix is None:
        return ""
    name = f"{family}-{suffix}"
    return name if name in VNPU_TYPES.get(family, ()) else ""


def huawei_device_name(kind: str, vdev_id: int, phy_id: int) -> str:
    """The name Huawei's plugin lists the vNPU under: ``Ascend910-4c-100-0``."""
    return f"{kind}-{vdev_id}-{phy_id}"


def template_aicore(template: str) -> int | None:
    """The AI cores a template name says (``vir10_3c_16g`` → 10)."""
    match = _CORES.match(template)
    return int(match.group(1)) if match else None


def template_memory_mb(template: str) -> int | None:
    """The memory a template name says, in MiB (``vir10_3c_16g`` → 16384); None when the name
    does not say (``vir04``: the chip's memory is shared out by the driver)."""
    match = _MEMORY_GB.search(template)
    return int(match.group(1)) * _MIB_PER_GIB if match else None
