"""The Node labels and pod annotations Huawei's Ascend device plugin writes, from our chips.

Volcano's Ascend scheduling and MindCluster read those keys, not our ``edgeplug.io/`` copies.
This computes the same keys and values from the handler's devices, with no I/O; the agent
writes them (``agent.discovery.node_labels``, ``agent.deviceplugins.pod_annotations``), and its
admission policies let through exactly the keys named here (``LABEL_KEYS``,
``ANNOTATION_KEYS``). docs/handlers/ascend.md, "Volcano and MindCluster", lists them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from discovery_handlers.ascend.chips import FAMILY_910
from discovery_handlers.ascend.devices import (
    EXTRA_PHY,
    EXTRA_ROCE_IP,
    PROP_AICORE,
    PROP_FAMILY,
    PROP_MEMORY,
    PROP_MODEL,
)
from discovery_handlers.contract import Device, PodFacts

LABEL_ACCELERATOR = "accelerator"
LABEL_CHIP_NAME = "node.kubernetes.io/npu.chip.name"
LABEL_SERVER_TYPE = "servertype"
LABEL_CHIP_MEMORY = "mind-cluster/npu-chip-memory"
#: Every Node label key this module may give (the agent's node policy allows exactly these).
LABEL_KEYS = (LABEL_ACCELERATOR, LABEL_CHIP_NAME, LABEL_SERVER_TYPE, LABEL_CHIP_MEMORY)

ANNOTATION_REAL = "huawei.com/AscendReal"
ANNOTATION_CONFIGURATION = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
#: ``huawei.com/<family>`` keys by family, as Huawei's resource names.
ANNOTATION_FAMILY = {family: f"huawei.com/{family}"
                     for family in (FAMILY_910, "Ascend310P", "Ascend310")}
#: Every pod annotation key this module may give (the agent's pod policy allows exactly these).
ANNOTATION_KEYS = (ANNOTATION_REAL, ANNOTATION_CONFIGURATION, *ANNOTATION_FAMILY.values())

#: Huawei's "not told" values for super-pod fields and a chip's unread RoCE address.
NOT_A_SUPER_POD = -2
NO_DEVICE_IP = "-1"
_MIB_PER_GIB = 1024

_CARD_TYPES = (  # (chip name pattern, Huawei's card type), first match wins
    (re.compile(r"^(910B\d|A2G\d)"), "Ascend910B"),
    (re.compile(r"^910_93"), "Ascend910A3"),
    (re.compile(r"^910"), "Ascend910"),
    (re.compile(r"^(310P\d?|I2\d?)"), "Ascend310P"),
    (re.compile(r"^310B"), "Ascend310B"),
    (re.compile(r"^310"), "Ascend310"),
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def node_labels(devices: Sequence[Device]) -> dict[str, str]:
    """Huawei's Node labels for the chips (empty when there are none)."""
    name = _agreed(devices, PROP_MODEL).removeprefix("Ascend")
    family = _agreed(devices, PROP_FAMILY)
    aicore = _agreed(devices, PROP_AICORE)
    memory = _agreed(devices, PROP_MEMORY)
    labels: dict[str, str] = {}
    if family in ANNOTATION_FAMILY:
        labels[LABEL_ACCELERATOR] = f"huawei-{family}"
    if name:
        labels[LABEL_CHIP_NAME] = name
        card_type = next((kind for pattern, kind in _CARD_TYPES if pattern.match(name)), "")
        if card_type and aicore:
            labels[LABEL_SERVER_TYPE] = f"{card_type}-{aicore}"
    if family == FAMILY_910 and memory.isdigit():
        labels[LABEL_CHIP_MEMORY] = f"{int(memory) // _MIB_PER_GIB}G"
    return {key: value for key, value in labels.items() if _LABEL_VALUE.match(value)}


def pod_annotations(devices: Sequence[Device], pod: PodFacts) -> dict[str, str]:
    """Huawei's annotations for a pod holding ``devices`` (empty for chips of no known family)."""
    family = _agreed(devices, PROP_FAMILY)
    if family not in ANNOTATION_FAMILY:
        return {}
    ips = {_phy(d): d.extra.get(EXTRA_ROCE_IP) or NO_DEVICE_IP for d in devices}
    phys = sorted(ips)
    names = ",".join(sorted(f"{family}-{phy}" for phy in phys))
    annotations = {ANNOTATION_REAL: names, ANNOTATION_FAMILY[family]: names}
    if family == FAMILY_910:
        annotations[ANNOTATION_CONFIGURATION] = json.dumps({
            "pod_name": pod.name,
            "server_id": pod.uid,
            "host_ip": pod.host_ip,
            "super_pod_id": NOT_A_SUPER_POD,
            "devices": [{"device_id": str(phy), "device_ip": ips[phy]} for phy in phys],
            "rack_id": NOT_A_SUPER_POD,
            "server_index": str(NOT_A_SUPER_POD),
            "server_ip": pod.host_ip,
        }, separators=(",", ":"))
    return annotations


def _agreed(devices: Sequence[Device], prop: str) -> str:
    """The property's value if every device has the same one, else ""."""
    values = {d.properties.get(prop, "") for d in devices}
    return values.pop() if len(values) == 1 else ""


def _phy(device: Device) -> int:
    return int(device.extra.get(EXTRA_PHY) or device.id.removeprefix("davinci"))
