"""Huawei's fault semantics for Ascend chips: DCMI error codes → handling level → health.

A chip is judged as Huawei's own device plugin judges it, so a pod moved from Huawei's plugin to
edgeplug sees the same chips pulled: each current error code's level from the fault table (the
default ``fault_table``, or a user's ``faultCode.json``), the chip's level the most serious of
them (unknown codes: ``SeparateNPU``), usable at ``NotHandleFault`` and ``SubHealthFault``.
``ACTIONS`` says what edgeplug does at each level; a chip's health carries its level and codes
(``ChipFaults``). docs/handlers/ascend.md, "Health" and "Faults by level".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from discovery_handlers.contract import HEALTHY, Health

SEPARATE_NPU = "SeparateNPU"
PRE_SEPARATE_NPU = "PreSeparateNPU"
RESTART_NPU = "RestartNPU"
FREE_RESTART_NPU = "FreeRestartNPU"
RESTART_BUSINESS = "RestartBusiness"
RESTART_REQUEST = "RestartRequest"
SUB_HEALTH_FAULT = "SubHealthFault"
NOT_HANDLE_FAULT = "NotHandleFault"
#: Most serious first: the order in which Huawei's plugin looks a chip's codes up.
LEVELS = (SEPARATE_NPU, PRE_SEPARATE_NPU, RESTART_NPU, FREE_RESTART_NPU, RESTART_BUSINESS,
          RESTART_REQUEST, SUB_HEALTH_FAULT, NOT_HANDLE_FAULT)
#: Levels at which a chip is still handed out.
USABLE_LEVELS = frozenset({NOT_HANDLE_FAULT, SUB_HEALTH_FAULT})
#: The level of codes the table does not hold.
UNKNOWN_LEVEL = SEPARATE_NPU
#: ``faultCode.json`` keys, by level.
JSON_KEYS = {
    NOT_HANDLE_FAULT: "NotHandleFaultCodes", RESTART_REQUEST: "RestartRequestCodes",
    RESTART_BUSINESS: "RestartBusinessCodes", FREE_RESTART_NPU: "FreeRestartNPUCodes",
    RESTART_NPU: "RestartNPUCodes", SEPARATE_NPU: "SeparateNPUCodes",
    PRE_SEPARATE_NPU: "PreSeparateNPUCodes", SUB_HEALTH_FAULT: "SubHealthFaultCodes",
}
#: What edgeplug does with a chip at each level (docs/handlers/ascend.md, "Faults by level").
KEEP_SERVING = "keep serving"
HOLD_BACK = "unhealthy: no new pod; the pods holding it keep it"
WAIT_FOR_RESET = "unhealthy until the chip is reset (its codes clear); the pods holding it keep it"
MOVE_PODS = "unhealthy, and the pods holding it are moved to another chip"
ACTIONS = {
    NOT_HANDLE_FAULT: KEEP_SERVING, SUB_HEALTH_FAULT: KEEP_SERVING,
    RESTART_REQUEST: HOLD_BACK, RESTART_BUSINESS: HOLD_BACK, PRE_SEPARATE_NPU: HOLD_BACK,
    FREE_RESTART_NPU: WAIT_FOR_RESET, RESTART_NPU: WAIT_FOR_RESET,
    SEPARATE_NPU: MOVE_PODS,
}
MAX_TABLE_BYTES = 1 << 20
_HEX_CODE = re.compile(r"^[0-9A-Fa-f]{1,16}$")
MAX_CODES_SHOWN = 8  # error codes named in one reason at most


class FaultTableError(ValueError):
    """A ``faultCode.json`` this handler cannot use; the message names the key."""


@dataclass(frozen=True)
class FaultTable:
    """Error codes by handling level; ``origin`` says where the table came from."""

    levels: tuple[tuple[str, frozenset[int]], ...]
    origin: str

    def level_of(self, codes: Iterable[int]) -> str | None:
        """The handling level of a chip with ``codes`` (None: no code, nothing wrong)."""
        present = frozenset(codes)
        if not present:
            return None
        table = dict(self.levels)
        for level in LEVELS:
            if present & table.get(level, frozenset()):
                return level
        return UNKNOWN_LEVEL

    def code_level(self, code: int) -> str:
        """The level the table gives one code (``unknown`` when it holds none)."""
        table = dict(self.levels)
        return next((level for level in LEVELS if code in table.get(level, frozenset())),
                    "unknown")


def table_from_levels(levels: Mapping[str, frozenset[int]], origin: str) -> FaultTable:
    return FaultTable(levels=tuple((level, frozenset(levels.get(level, frozenset())))
                                   for level in LEVELS), origin=origin)


def default_table() -> FaultTable:
    """Huawei's table as their plugin ships it."""
    from discovery_handlers.ascend.fault_table import DEFAULT_LEVELS

    return table_from_levels(DEFAULT_LEVELS, "Huawei's default faultCode.json")


def parse_fault_table(text: str, origin: str) -> FaultTable:
    """A ``faultCode.json`` (Huawei's format: an object of ``<Level>Codes`` lists of hex
    strings). Keys it does not know are ignored, as Huawei's plugin ignores them; the table
    replaces the default one whole, as Huawei's does."""
    if len(text) > MAX_TABLE_BYTES:
        raise FaultTableError(f"more than {MAX_TABLE_BYTES} bytes")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise FaultTableError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise FaultTableError("must be a JSON object of <Level>Codes lists")
    if not any(key in raw for key in JSON_KEYS.values()):
        raise FaultTableError(f"holds none of {sorted(JSON_KEYS.values())}")
    levels: dict[str, frozenset[int]] = {}
    for level, key in JSON_KEYS.items():
        value = raw.get(key, [])
        if not isinstance(value, list):
            raise FaultTableError(f"{key} must be a list of hex strings")
        codes = set()
        for index, item in enumerate(value):
            if not isinstance(item, str) or not _HEX_CODE.match(item):
                raise FaultTableError(f"{key}[{index}]: {str(item)[:40]!r} is not a hex "
                                      "fault code such as \"80E01801\"")
            codes.add(int(item, 16))
        levels[level] = frozenset(codes)
    return table_from_levels(levels, origin)


@dataclass(frozen=True)
class ChipFaults(Health):
    """A chip's health judged from its current error codes: their level (the chip's) and each
    code with its own level, in the order DCMI gave them."""

    level: str = NOT_HANDLE_FAULT
    codes: tuple[tuple[int, str], ...] = ()

    @property
    def action(self) -> str:
        return ACTIONS.get(self.level, MOVE_PODS)

    @property
    def moves_pods(self) -> bool:
        """The chip is separated: the pods holding it are to run elsewhere."""
        return self.action == MOVE_PODS


def faults_of(health: Health) -> ChipFaults | None:
    """The level and codes behind a chip's health (None: not judged from error codes)."""
    return health if isinstance(health, ChipFaults) else None


def chip_health(codes: tuple[int, ...] | None, table: FaultTable) -> Health:
    """The health of a chip whose current error codes are ``codes`` (None: not read, so
    nothing to judge: the caller's own health stands). A chip with codes gets ``ChipFaults``,
    usable or not."""
    level = table.level_of(codes or ())
    if level is None:
        return HEALTHY
    assert codes is not None
    levels = tuple((code, table.code_level(code)) for code in codes)
    if level in USABLE_LEVELS:
        return ChipFaults(level=level, codes=levels)
    shown = ", ".join(f"0x{code:08X} {table.code_level(code)}"
                      for code in codes[:MAX_CODES_SHOWN])
    more = f" and {len(codes) - MAX_CODES_SHOWN} more" if len(codes) > MAX_CODES_SHOWN else ""
    return ChipFaults(healthy=False, reason=f"fault level {level}: error codes {shown}{more} "
                      f"({table.origin})", level=level, codes=levels)
