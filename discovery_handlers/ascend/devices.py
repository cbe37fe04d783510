"""From chips to what a container gets: device ids, device nodes, the driver mount, properties,
the environment for several chips at once (``compose``), which chips go together (``rank``),
and the same for vNPUs (``vnpu_device``), as Huawei's plugin gives them, so a pod written for
it runs unchanged. No I/O. docs/handlers/ascend.md, "What a container gets".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from discovery_handlers.ascend.chips import (
    NETWORK_HEALTHY,
    NETWORK_RESULTS,
    Chip,
    network_health,
)
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.vnpu import VIRTUAL, VNpu, huawei_device_name
from discovery_handlers.contract import Device, DeviceSpec, Health, Mount

#: Without this node no chip can be used (Huawei's plugin refuses to start without it).
SHARED_NODES = ("/dev/davinci_manager",)
#: Given to the container when the host has them, as Huawei's plugin does.
OPTIONAL_SHARED_NODES = ("/dev/devmm_svm", "/dev/hisi_hdc", "/dev/dvpp_cmdlist")

VISIBLE_DEVICES = "ASCEND_VISIBLE_DEVICES"
RUNTIME_OPTIONS_ENV = "ASCEND_RUNTIME_OPTIONS"
PROP_MODEL = "ASCEND_CHIP_MODEL"
PROP_FAMILY = "ASCEND_CHIP_FAMILY"
PROP_MEMORY = "ASCEND_MEMORY_MB"
PROP_AICORE = "ASCEND_AICORE_COUNT"
PROP_CARD = "ASCEND_CARD_ID"
#: The chip's index within its card. Not ``ASCEND_DEVICE_ID``: CANN reads that name as the
#: logical device index inside the container.
PROP_DEVICE_INDEX = "ASCEND_CHIP_INDEX"
PROP_LOGIC = "ASCEND_LOGIC_ID"
PROP_BUS = "ASCEND_BUS_ID"
#: Where the chip's PCI bus id sits (``discovery_handlers.pci``, read by ``sources``): DRA
#: publishes these as the standard ``resource.kubernetes.io/pcieRoot`` and ``numaNode``.
PROP_PCIE_ROOT = "ASCEND_PCIE_ROOT"
PROP_NUMA_NODE = "ASCEND_NUMA_NODE"
#: A 910 chip's RoCE network health: ``Healthy`` or ``Unhealthy (<DCMI's result>)`` (absent
#: when DCMI cannot tell). The chip stays allocatable either way, as with Huawei's plugin.
PROP_NETWORK = "ASCEND_NETWORK_HEALTH"

#: A vNPU's template (``vir04``), type (``Ascend910-4c``, its resource name less
#: ``huawei.com/``), the name Huawei's plugin lists it under and its chip's physical id.
PROP_VNPU_TEMPLATE = "ASCEND_VNPU_TEMPLATE"
PROP_VNPU_TYPE = "ASCEND_VNPU_TYPE"
PROP_VNPU_NAME = "ASCEND_VNPU_NAME"
PROP_PHYSICAL_ID = "ASCEND_PHYSICAL_ID"

LABEL_CHIP_NAME = "edgeplug.io/npu.chip.name"  # Huawei: node.kubernetes.io/npu.chip.name
LABEL_CHIP_COUNT = "edgeplug.io/npu.chip.count"
LABEL_ACCELERATOR = "edgeplug.io/accelerator"  # Huawei's nodes: accelerator=huawei-Ascend910
MIXED = "mixed"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

EXTRA_PHY = "phy_id"
EXTRA_CARD = "card_id"
EXTRA_DEVICE_INDEX = "device_index"
EXTRA_LOGIC = "logic_id"
EXTRA_ROCE_IP = "roce_ip"
EXTRA_VNPU = "vnpu_id"


def device_id(phy_id: int) -> str:
    return f"davinci{phy_id}"


def chip_node(phy_id: int) -> str:
    return f"/dev/davinci{phy_id}"


def to_device(
    chip: Chip, details: AscendDetails, *, shared_present: Sequence[str],
    driver_present: bool, health: Health, pci: Mapping[str, str] | None = None,
) -> Device:
    """The ``Device`` for ``chip``; ``shared_present`` lists the shared nodes the host has,
    ``pci`` what sysfs says of its bus id (``discovery_handlers.pci.locate_bus_id``)."""
    props: dict[str, str] = {VISIBLE_DEVICES: str(chip.phy_id)}
    optional: Mapping[str, object] = {
        PROP_MODEL: chip.model, PROP_FAMILY: chip.family, PROP_MEMORY: chip.memory_mb,
        PROP_AICORE: chip.aicore_count, PROP_CARD: chip.card_id,
        PROP_DEVICE_INDEX: chip.device_index, PROP_LOGIC: chip.logic_id, PROP_BUS: chip.bus_id,
        PROP_NETWORK: (None if chip.network_result is None
                       else network_health(chip.network_result)),
        PROP_PCIE_ROOT: (pci or {}).get("pcie_root"),
        PROP_NUMA_NODE: (pci or {}).get("numa_node"),
    }
    props.update({name: str(value) for name, value in optional.items()
                  if value is not None and value != ""})
    nodes = (chip_node(chip.phy_id), *shared_present)
    mounts: tuple[Mount, ...] = ()
    if details.mount_driver and driver_present:
        mounts = (Mount(container_path=details.driver_path, host_path=details.driver_path,
                        read_only=True),)
    extra = {EXTRA_PHY: str(chip.phy_id)}
    for key, value in ((EXTRA_CARD, chip.card_id), (EXTRA_DEVICE_INDEX, chip.device_index),
                       (EXTRA_LOGIC, chip.logic_id), (EXTRA_ROCE_IP, chip.roce_ip or None)):
        if value is not None:
            extra[key] = str(value)
    return Device(
        id=device_id(chip.phy_id),
        properties=props,
        mounts=mounts,
        device_specs=tuple(DeviceSpec(container_path=n, host_path=n, permissions="rwm")
                           for n in nodes),
        health=health,
        warning=network_warning(chip),
        extra=extra,
    )


def vnpu_node(vdev_id: int) -> str:
    return f"/dev/vdavinci{vdev_id}"


def vnpu_device(
    chip: Chip, vnpu: VNpu, kind: str, details: AscendDetails, *,
    shared_present: Sequence[str], driver_present: bool, health: Health,
) -> Device:
    """The ``Device`` for ``vnpu`` of ``chip``, whose vNPU type is ``kind``."""
    props: dict[str, str] = {VISIBLE_DEVICES: str(vnpu.vdev_id)}
    optional: Mapping[str, object] = {
        PROP_VNPU_TYPE: kind, PROP_VNPU_TEMPLATE: vnpu.template,
        PROP_VNPU_NAME: huawei_device_name(kind, vnpu.vdev_id, chip.phy_id),
        PROP_PHYSICAL_ID: chip.phy_id, PROP_MODEL: chip.model, PROP_FAMILY: chip.family,
        PROP_AICORE: vnpu.aicore, PROP_MEMORY: vnpu.memory_mb, PROP_CARD: chip.card_id,
        PROP_DEVICE_INDEX: chip.device_index,
    }
    props.update({name: str(value) for name, value in optional.items()
                  if value is not None and value != ""})
    specs = (DeviceSpec(container_path=f"/dev/davinci{vnpu.vdev_id}",
                        host_path=vnpu_node(vnpu.vdev_id), permissions="rwm"),
             *(DeviceSpec(container_path=n, host_path=n, permissions="rwm")
               for n in shared_present))
    mounts: tuple[Mount, ...] = ()
    if details.mount_driver and driver_present:
        mounts = (Mount(container_path=details.driver_path, host_path=details.driver_path,
                        read_only=True),)
    extra = {EXTRA_PHY: str(chip.phy_id), EXTRA_VNPU: str(vnpu.vdev_id)}
    if chip.card_id is not None:
        extra[EXTRA_CARD] = str(chip.card_id)
    return Device(id=f"vdavinci{vnpu.vdev_id}", properties=props, mounts=mounts,
                  device_specs=specs, health=health, extra=extra)


def network_warning(chip: Chip) -> str:
    """The Instance's warning while the chip's RoCE network is down ("" otherwise)."""
    result = chip.network_result
    if result is None or network_health(result) == NETWORK_HEALTHY:
        return ""
    return (f"RoCE network unhealthy: dcmi_get_device_network_health gave {result} "
            f"({NETWORK_RESULTS.get(result, 'unknown result')}); the chip stays allocatable "
            "(collectives across nodes over its link fail until it is back)")


def compose(details: AscendDetails, devices: Sequence[Device]) -> dict[str, str]:
    """The environment of a container given ``devices`` (in allocation order): the properties
    all of them agree on (the model, say), then the composed ``ASCEND_VISIBLE_DEVICES``."""
    env = {name: value for name, value in (devices[0].properties.items() if devices else ())
           if all(d.properties.get(name) == value for d in devices[1:])}
    virtual = bool(devices) and all(EXTRA_VNPU in d.extra for d in devices)
    env[VISIBLE_DEVICES] = ",".join(d.extra[EXTRA_VNPU] if virtual else _phy(d)
                                    for d in devices)
    env[RUNTIME_OPTIONS_ENV] = ",".join(((VIRTUAL,) if virtual else ())
                                        + details.runtime_options)
    return env


def node_labels(devices: Sequence[Device]) -> dict[str, str]:
    """Labels for the Node that say what chips it has (under ``edgeplug.io/``, for the agent to
    set): the chip name as ``npu-smi`` shows it (``910B3``), how many chips, and the family as
    Huawei's ``accelerator`` label writes it (``huawei-Ascend910``); ``mixed`` when chips differ,
    and no name or family label when no source could tell the model."""
    labels = {LABEL_CHIP_COUNT: str(len(devices))}
    models = {d.properties.get(PROP_MODEL, "") for d in devices}
    families = {d.properties.get(PROP_FAMILY, "") for d in devices}
    if devices and "" not in models:
        labels[LABEL_CHIP_NAME] = (models.pop().removeprefix("Ascend") if len(models) == 1
                                   else MIXED)
    if devices and "" not in families:
        labels[LABEL_ACCELERATOR] = (f"huawei-{families.pop()}" if len(families) == 1
                                     else MIXED)
    # A name a label cannot carry (a library's odd chip name) is left out, never sent.
    return {key: value for key, value in labels.items() if _LABEL_VALUE.match(value)}


def rank(available: Sequence[Device], must_include: Sequence[Device], size: int
         ) -> list[Device]:
    """``size`` devices from ``available``, ``must_include`` first, keeping to as few cards as
    possible: the cards of ``must_include`` are filled first, then the card whose free chips fit
    what is left most tightly (keeping bigger cards whole), then the fullest cards."""
    chosen = list({d.id: d for d in must_include}.values())[:max(size, 0)]
    taken = {d.id for d in chosen}
    pool = [d for d in available if d.id not in taken]
    by_card: dict[str, list[Device]] = {}
    for device in sorted(pool, key=_phy_key):
        by_card.setdefault(_card(device), []).append(device)
    for card in dict.fromkeys(_card(d) for d in chosen):
        chosen.extend(by_card.pop(card, [])[:size - len(chosen)])
    while len(chosen) < size and by_card:
        need = size - len(chosen)
        fitting = [c for c, ds in by_card.items() if len(ds) >= need]
        card = (min(fitting, key=lambda c: (len(by_card[c]), _card_key(c))) if fitting
                else max(by_card, key=lambda c: (len(by_card[c]), -_card_key(c))))
        chosen.extend(by_card.pop(card)[:need])
    return chosen


def _phy(device: Device) -> str:
    return device.extra.get(EXTRA_PHY) or device.id.removeprefix("davinci")


def _phy_key(device: Device) -> tuple[int, str]:
    phy = _phy(device)
    return (int(phy), device.id) if phy.isdigit() else (1 << 30, device.id)


def _card(device: Device) -> str:
    # A chip whose card is unknown is a card of its own.
    return device.extra.get(EXTRA_CARD) or f"?{device.id}"


def _card_key(card: str) -> int:
    return int(card) if card.isdigit() else 1 << 30
