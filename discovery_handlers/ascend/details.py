"""The ``ascend`` handler's ``discoveryDetails`` and its one discovery property
(``FAULT_CODE_JSON``), parsed and checked without the vendor library: the admission webhook and
``edgeplug discover`` parse them on machines with no Ascend driver, so nothing of DCMI is
imported. A bad value is refused with ``InvalidDetails`` naming the field.
docs/handlers/ascend.md, "``discoveryDetails``", lists the fields.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from discovery_handlers.ascend.faults import (
    FaultTable,
    FaultTableError,
    default_table,
    parse_fault_table,
)
from discovery_handlers.ascend.vnpu import ALL_VNPU_TYPES
from discovery_handlers.contract import InvalidDetails, PropertyValue, property_text
from discovery_handlers.yaml_details import load_mapping, refuse_unknown

DEFAULT_HOST_ROOT = "/"
#: Where Huawei's driver package installs npu-smi: servers, then the Atlas 200/500 products.
DEFAULT_NPU_SMI_PATHS = ("/usr/local/bin/npu-smi", "/usr/local/sbin/npu-smi")
DEFAULT_DRIVER_PATH = "/usr/local/Ascend/driver"
DEFAULT_HEALTH_POLL_S = 5.0  # Huawei's device plugin checks health every 5 s
MIN_HEALTH_POLL_S = 1.0
MAX_HEALTH_POLL_S = 1800.0
DEFAULT_DCMI_TIMEOUT_S = 3.0  # a healthy card answers a whole chip read in milliseconds
MIN_DCMI_TIMEOUT_S = 0.1
MAX_DCMI_TIMEOUT_S = 60.0
#: The discovery property that carries a user's fault table.
FAULT_TABLE_PROPERTY = "FAULT_CODE_JSON"

SOURCE_DCMI = "dcmi"
SOURCE_NPU_SMI = "npu-smi"
SOURCE_DEVICES = "devices"
ALL_SOURCES = (SOURCE_DCMI, SOURCE_NPU_SMI, SOURCE_DEVICES)

#: Options Ascend's container runtime (ascend-docker-runtime) understands in
#: ASCEND_RUNTIME_OPTIONS; VIRTUAL, for vNPUs, the handler sets itself (``vnpuType``).
RUNTIME_OPTIONS = ("NODRV", "VERBOSE")

_CHIP_NAME = re.compile(r"^Ascend[0-9][0-9A-Za-z_]*$")
_KNOWN_FIELDS = frozenset({
    "hostRoot", "libraryPath", "npuSmiPath", "driverPath", "mountDriver", "sources",
    "chipNames", "healthPollSeconds", "dcmiTimeoutSeconds", "runtimeOptions", "huaweiMetadata",
    "vnpuType", "vnpuPartitions",
})


@dataclass(frozen=True)
class AscendDetails:
    """Parsed ``discoveryDetails`` of an ``ascend`` Configuration (paths are host paths)."""

    host_root: str = DEFAULT_HOST_ROOT
    library_path: str | None = None
    npu_smi_path: str | None = None  # None: the first of DEFAULT_NPU_SMI_PATHS that is there
    driver_path: str = DEFAULT_DRIVER_PATH
    mount_driver: bool = True
    sources: tuple[str, ...] = ALL_SOURCES
    chip_names: tuple[str, ...] = ()
    health_poll_seconds: float = DEFAULT_HEALTH_POLL_S
    dcmi_timeout_seconds: float = DEFAULT_DCMI_TIMEOUT_S
    runtime_options: tuple[str, ...] = ()
    huawei_metadata: bool = True
    fault_table: FaultTable | None = None  # None: Huawei's default table
    vnpu_type: str | None = None  # None: whole chips (those not split into vNPUs)
    vnpu_partitions: tuple[str, ...] = ()  # vNPU types each chip is offered as partitions of

    @property
    def faults(self) -> FaultTable:
        return self.fault_table or _default_table()

    @property
    def npu_smi_paths(self) -> tuple[str, ...]:
        return (self.npu_smi_path,) if self.npu_smi_path else DEFAULT_NPU_SMI_PATHS

    def on_host(self, path: str) -> str:
        """Where this process finds host path ``path`` (``hostRoot`` prepended)."""
        return str(PurePosixPath(self.host_root) / path.lstrip("/"))


def parse_details(details: str, properties: Mapping[str, PropertyValue]) -> AscendDetails:
    """Parse ``discoveryDetails`` YAML and the ``FAULT_CODE_JSON`` property."""
    raw = load_mapping(details, expected="must be a mapping of fields", empty_is_empty=True)
    refuse_unknown(raw, _KNOWN_FIELDS)
    if "vnpuType" in raw and "vnpuPartitions" in raw:
        raise InvalidDetails("vnpuPartitions", "cannot be set with vnpuType: a Configuration "
                                               "serves static vNPUs or partitions, not both")
    library = raw.get("libraryPath")
    return AscendDetails(
        host_root=_path(raw, "hostRoot", DEFAULT_HOST_ROOT),
        library_path=None if library is None else _path(raw, "libraryPath", ""),
        npu_smi_path=None if "npuSmiPath" not in raw else _path(raw, "npuSmiPath", ""),
        driver_path=_path(raw, "driverPath", DEFAULT_DRIVER_PATH),
        mount_driver=_bool(raw, "mountDriver", True),
        sources=_choices(raw, "sources", ALL_SOURCES, default=ALL_SOURCES, empty_ok=False),
        chip_names=_chip_names(raw.get("chipNames")),
        health_poll_seconds=_seconds(raw, "healthPollSeconds", DEFAULT_HEALTH_POLL_S,
                                     MIN_HEALTH_POLL_S, MAX_HEALTH_POLL_S),
        dcmi_timeout_seconds=_seconds(raw, "dcmiTimeoutSeconds", DEFAULT_DCMI_TIMEOUT_S,
                                      MIN_DCMI_TIMEOUT_S, MAX_DCMI_TIMEOUT_S),
        fault_table=_fault_table(properties),
        runtime_options=_choices(raw, "runtimeOptions", RUNTIME_OPTIONS, default=(),
                                 empty_ok=True),
        huawei_metadata=_bool(raw, "huaweiMetadata", True),
        vnpu_type=_vnpu_type(raw.get("vnpuType")),
        vnpu_partitions=_choices(raw, "vnpuPartitions", ALL_VNPU_TYPES, default=(),
                                 empty_ok=False),
    )


def _vnpu_type(value: Any) -> str | None:
    if value is None:
        return None
    if value not in ALL_VNPU_TYPES:
        raise InvalidDetails("vnpuType", f"{value!r} is not a vNPU type of Huawei's plugin "
                                         f"(one of {', '.join(ALL_VNPU_TYPES)})")
    return str(value)


def _path(raw: Mapping[str, Any], name: str, default: str) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidDetails(name, "must be an absolute path")
    if "\x00" in value or ".." in PurePosixPath(value).parts:
        raise InvalidDetails(name, "must be a plain absolute path (no NUL, no '..')")
    return value


def _bool(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise InvalidDetails(name, "must be true or false")
    return value


def _choices(
    raw: Mapping[str, Any], name: str, allowed: tuple[str, ...], *,
    default: tuple[str, ...], empty_ok: bool,
) -> tuple[str, ...]:
    value = raw.get(name)
    if value is None:
        return default
    if not isinstance(value, list) or (not value and not empty_ok):
        raise InvalidDetails(name, f"must be a {'' if empty_ok else 'non-empty '}list of "
                                   f"{list(allowed)}")
    seen: list[str] = []
    for index, item in enumerate(value):
        if item not in allowed:
            raise InvalidDetails(f"{name}[{index}]", f"{item!r} is not one of {list(allowed)}")
        if item in seen:
            raise InvalidDetails(f"{name}[{index}]", f"{item!r} is listed twice")
        seen.append(item)
    return tuple(seen)


def _chip_names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise InvalidDetails("chipNames", "must be a non-empty list such as [Ascend910]")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not _CHIP_NAME.match(item):
            raise InvalidDetails(f"chipNames[{index}]",
                                 f"{item!r} is not a chip name such as Ascend910 or Ascend910B3")
    return tuple(value)


def _seconds(raw: Mapping[str, Any], name: str, default: float, low: float,
             high: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDetails(name, "must be a number of seconds")
    if not low <= value <= high:
        raise InvalidDetails(name, f"{value} is outside {low:g}..{high:g}")
    return float(value)


def _fault_table(properties: Mapping[str, PropertyValue]) -> FaultTable | None:
    text = property_text(properties, FAULT_TABLE_PROPERTY)
    if text is None:
        return None
    try:
        return parse_fault_table(text, f"the fault table of property {FAULT_TABLE_PROPERTY}")
    except FaultTableError as exc:
        raise InvalidDetails(FAULT_TABLE_PROPERTY, str(exc)) from None


_default: list[FaultTable] = []


def _default_table() -> FaultTable:
    if not _default:
        _default.append(default_table())
    return _default[0]
