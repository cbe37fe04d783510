"""What the ``ascend`` handler knows of one NPU chip, whichever source told it (DCMI, ``npu-smi
info``, the device nodes alone), and what it means: the rules that turn a ``Chip`` record into
a model name, a resource family, ``npu-smi``'s health word and a 910 chip's RoCE network health,
with no I/O. Fault codes are judged in ``faults``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from discovery_handlers.ascend.vnpu import VNpu
from discovery_handlers.contract import HEALTHY, Health

#: ``npu-smi info`` health words at which a chip is handed out.
USABLE_NPU_SMI_HEALTH = frozenset({"OK", "Warning"})

#: Names Huawei's device plugin registers, by chip family (910, 910B and 910A3 share one).
FAMILY_910 = "Ascend910"
FAMILY_310P = "Ascend310P"
FAMILY_310 = "Ascend310"


@dataclass(frozen=True)
class Chip:
    """One chip as a source saw it; ``None`` or empty means the source could not tell."""

    phy_id: int
    card_id: int | None = None
    device_index: int | None = None  # the chip's index within its card
    logic_id: int | None = None
    chip_type: str = ""  # "Ascend"
    chip_name: str = ""  # "910B3"
    chip_version: str = ""
    aicore_count: int | None = None
    memory_mb: int | None = None
    bus_id: str = ""
    roce_ip: str = ""  # the RoCE port's address (910 chips, DCMI only)
    network_result: int | None = None  # the RoCE link check's result (910, DCMI); None: unread
    health: Health = HEALTHY  # unhealthy when the source could not read the health
    health_level: int | None = None  # DCMI's 0..3, informational (Huawei's plugin ignores it)
    error_codes: tuple[int, ...] | None = None  # DCMI's current error codes; None: not read
    problems: tuple[str, ...] = field(default=())  # what could not be read about this chip
    #: the vNPUs an admin split the chip into (``vnpu``); () none; None: the source cannot tell
    vnpus: tuple[VNpu, ...] | None = None

    @property
    def model(self) -> str:
        """``Ascend910B3``: the chip type and name as DCMI gives them ("" when unknown)."""
        if not self.chip_name:
            return ""
        name = self.chip_name
        return name if name.startswith("Ascend") else f"{self.chip_type or 'Ascend'}{name}"

    @property
    def family(self) -> str:
        """The family Huawei's plugin registers the chip under (``Ascend910``), "" if unknown."""
        return chip_family(self.model)


def chip_family(model: str) -> str:
    """``Ascend910B3`` → ``Ascend910``; ``Ascend310P3`` → ``Ascend310P``; "" when unknown."""
    if not model.startswith("Ascend"):
        return ""
    rest = model[len("Ascend"):]
    if rest.startswith("910"):
        return FAMILY_910
    if rest.startswith("310P"):
        return FAMILY_310P
    if rest.startswith("310B"):
        return "Ascend310B"  # Atlas 200I A2: Huawei's plugin names it apart
    if rest.startswith("310"):
        return FAMILY_310
    return model


def wanted(chip: Chip, chip_names: tuple[str, ...]) -> bool:
    """Whether ``chipNames`` keeps the chip: a family or an exact model; unknown models stay."""
    if not chip_names or not chip.model:
        return True
    return chip.family in chip_names or chip.model in chip_names


#: ``enum dcmi_rdfx_detect_result`` (``dcmi_interface_api.h``): the RoCE link check's results.
NETWORK_RESULTS = {
    0: "DCMI_RDFX_DETECT_OK", 1: "DCMI_RDFX_DETECT_SOCK_FAIL",
    2: "DCMI_RDFX_DETECT_RECV_TIMEOUT", 3: "DCMI_RDFX_DETECT_UNREACH",
    4: "DCMI_RDFX_DETECT_TIME_EXCEEDED", 5: "DCMI_RDFX_DETECT_FAULT",
    6: "DCMI_RDFX_DETECT_INIT", 7: "DCMI_RDFX_DETECT_THREAD_ERR", 8: "DCMI_RDFX_DETECT_IP_SET",
}
#: Results at which Huawei's plugin counts the network healthy.
NETWORK_HEALTHY_RESULTS = frozenset({0, 6})
NETWORK_HEALTHY = "Healthy"
NETWORK_UNHEALTHY = "Unhealthy"


def network_health(result: int) -> str:
    """``Healthy``, or ``Unhealthy (<result's name>)``, for a RoCE link check's ``result``."""
    if result in NETWORK_HEALTHY_RESULTS:
        return NETWORK_HEALTHY
    return f"{NETWORK_UNHEALTHY} ({NETWORK_RESULTS.get(result, f'result {result}')})"


def npu_smi_health(word: str) -> Health:
    """The health of a chip ``npu-smi info`` shows as ``word``."""
    if word in USABLE_NPU_SMI_HEALTH:
        return HEALTHY
    return Health.unhealthy(f"npu-smi health {word!r}")
