"""Huawei's device-info ConfigMap for Volcano, ``mindx-dl-deviceinfo-<node>``, and the Node
annotation ``baseDeviceInfos``, from our chips.

Volcano's Ascend plugin places NPU jobs by chip from what Huawei's device plugin keeps there;
this computes the same data, byte for byte as Go encodes it, from the handler's devices, with
no I/O (the agent writes it: ``agent.discovery.volcano_device_info``). docs/handlers/ascend.md,
"Volcano's view of the chips", gives the format.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from discovery_handlers.ascend.chips import FAMILY_910
from discovery_handlers.ascend.devices import (
    EXTRA_PHY,
    EXTRA_ROCE_IP,
    PROP_FAMILY,
    PROP_NETWORK,
    PROP_VNPU_TYPE,
)
from discovery_handlers.ascend.faults import UNKNOWN_LEVEL, ChipFaults, faults_of
from discovery_handlers.contract import Device

NAMESPACE = "kube-system"
NODE_ANNOTATION = "baseDeviceInfos"
NAME_PREFIX = "mindx-dl-deviceinfo-"
LABELS = {"mx-consumer-cim": "true"}
KEY_DEVICE_INFO = "DeviceInfoCfg"
KEY_MANUALLY_SEPARATED = "ManuallySeparateNPU"
KEY_UPGRADE_REASONS = "UpgradeFaultReason"
KEY_DESCRIPTION = "Description"
DESCRIPTION = ("Written by edgeplug's agent in the format of Huawei's Ascend device plugin, "
               "for Volcano's Ascend scheduling (docs/handlers/ascend.md).")
#: Huawei's values for a node that is no super pod.
NO_SUPER_POD = -1
FAULT_CHIP = "CardUnhealthy"
FAULT_NETWORK = "CardNetworkUnhealthy"
NETWORK_NORMAL = "NormalNetwork"
#: The level Huawei's plugin gives an unhealthy chip without error codes.
CHIP_NORMAL = "NormalNPU"
#: The families whose ConfigMap layout is known, with the key their fault list goes under.
FAULT_KEYS = {FAMILY_910: "huawei.com/Ascend910-Fault",
              "Ascend310P": "huawei.com/Ascend310P-Fault",
              "Ascend310": "huawei.com/Ascend310P-Fault"}


def configmap_name(node: str) -> str:
    return NAME_PREFIX + node


@dataclass(frozen=True)
class ChipView:
    """One chip as the ConfigMap shows it."""

    phy: int
    healthy: bool
    network_healthy: bool = True
    held: bool = False
    faults: ChipFaults | None = None
    ip: str = ""


def chip_view(device: Device, *, held: bool) -> tuple[str, ChipView] | None:
    """A whole chip's family and view (None for a vNPU or a chip of unknown family)."""
    family = device.properties.get(PROP_FAMILY, "")
    if family not in FAULT_KEYS or PROP_VNPU_TYPE in device.properties:
        return None
    phy = device.extra.get(EXTRA_PHY) or device.id.removeprefix("davinci")
    if not phy.isdigit():
        return None
    network = device.properties.get(PROP_NETWORK, "Healthy")
    return family, ChipView(phy=int(phy), healthy=device.health.healthy,
                            network_healthy=not network.startswith("Unhealthy"), held=held,
                            faults=faults_of(device.health),
                            ip=device.extra.get(EXTRA_ROCE_IP, ""))


def node_lists(chips: Iterable[tuple[str, ChipView]],
               first_seen: Mapping[tuple[int, int], int]) -> dict[str, str]:
    """The whole ``DeviceList`` of a node's chips (several families: each its own keys)."""
    by_family: dict[str, list[ChipView]] = {}
    for family, chip in chips:
        by_family.setdefault(family, []).append(chip)
    lists: dict[str, str] = {}
    for family, views in sorted(by_family.items()):
        lists.update(device_list(family, views, first_seen))
    return lists


def node_annotation(chips: Iterable[tuple[str, ChipView]]) -> str:
    """The Node's ``baseDeviceInfos``: every chip's name, RoCE address and super-device id."""
    infos = {f"{family}-{chip.phy}": {"IP": chip.ip, "SuperDeviceID": 0}
             for family, chip in chips}
    return go_json(dict(sorted(infos.items())))


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it (dicts keep the order given; a caller
    sorts the ones Go holds in maps)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def check_code(device_info: Mapping[str, Any]) -> str:
    """Huawei's ``CheckCode``: SHA-256 hex of the Go encoding of ``DeviceInfo``."""
    return hashlib.sha256(go_json(device_info).encode()).hexdigest()


def device_list(family: str, chips: Iterable[ChipView],
                first_seen: Mapping[tuple[int, int], int]) -> dict[str, str]:
    """The ``DeviceList`` entries of one family's chips; ``first_seen[(phy, code)]`` is when
    the code was first seen, in Unix milliseconds."""
    resource = f"huawei.com/{family}"
    chips = sorted(chips, key=lambda c: c.phy)

    def names(selected: Iterable[ChipView]) -> str:
        return ",".join(sorted(f"{family}-{c.phy}" for c in selected))

    entries = {
        resource: names(c for c in chips if c.healthy and not c.held),
        f"{resource}-Unhealthy": names(c for c in chips if not c.healthy),
    }
    if family == FAMILY_910:
        entries[f"{resource}-NetworkUnhealthy"] = names(c for c in chips
                                                        if not c.network_healthy)
        entries[f"{resource}-Recovering"] = ""
    entries[FAULT_KEYS.get(family, f"{resource}-Fault")] = go_json(
        [fault for chip in chips for fault in _faults(family, chip, first_seen)])
    return entries


def _faults(family: str, chip: ChipView, first_seen: Mapping[tuple[int, int], int]
            ) -> list[dict[str, Any]]:
    name = f"{family}-{chip.phy}"
    found = []
    if not chip.network_healthy and family == FAMILY_910:
        found.append(_fault(FAULT_NETWORK, name, NETWORK_NORMAL, (), chip.phy, first_seen))
    codes = chip.faults.codes if chip.faults else ()
    if codes or not chip.healthy:
        level = chip.faults.level if chip.faults else CHIP_NORMAL
        found.append(_fault(FAULT_CHIP, name, level, codes, chip.phy, first_seen))
    return found


def _fault(kind: str, name: str, level: str, codes: tuple[tuple[int, str], ...], phy: int,
           first_seen: Mapping[tuple[int, int], int]) -> dict[str, Any]:
    times = {f"{code:X}": {"fault_time": first_seen.get((phy, code), 0),
                           "fault_level": UNKNOWN_LEVEL if own == "unknown" else own}
             for code, own in codes}
    return {
        "fault_type": kind, "npu_name": name, "large_model_fault_level": level,
        "fault_level": level, "fault_handling": level,
        "fault_code": ",".join(f"{code:X}" for code, _ in codes),
        "fault_time_and_level_map": dict(sorted(times.items())),
    }


def configmap_data(lists: Mapping[str, str], update_time: int) -> dict[str, str]:
    """The ConfigMap's data for these ``DeviceList`` entries, stamped ``update_time`` (Unix s)."""
    info = {"DeviceList": dict(sorted(lists.items())), "UpdateTime": update_time}
    cache = {"DeviceInfo": info, "SuperPodID": NO_SUPER_POD, "ServerIndex": NO_SUPER_POD,
             "CheckCode": check_code(info)}
    return {
        KEY_DEVICE_INFO: go_json(cache),
        KEY_MANUALLY_SEPARATED: "",
        KEY_UPGRADE_REASONS: "{}",
        KEY_DESCRIPTION: DESCRIPTION,
    }
