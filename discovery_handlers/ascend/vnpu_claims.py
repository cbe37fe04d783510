"""A partition the scheduler allocated, made real: when its claim is prepared, the vNPU of its
template is created on its chip through DCMI (``vnpu_dcmi``), and the claim's containers get
that vNPU as Huawei's plugin gives one (``/dev/vdavinci<id>`` as ``/dev/davinci<id>``, the
shared nodes, ``ASCEND_VISIBLE_DEVICES=<id>``, ``ASCEND_RUNTIME_OPTIONS=VIRTUAL``); when it is
unprepared the vNPU is destroyed (as is one whose creation answers only after its claim was
refused for the wait). The vNPUs made here are remembered per host root, so
discovery keeps offering their chip's partitions and never serves them as an admin's vNPUs.
Blocking (DCMI): run on the handlers' pool. Why, and what is not done: docs/handlers/ascend.md,
"A chip split by the scheduler".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

from discovery_handlers.ascend import dcmi, dcmi_lanes, vnpu_dcmi
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.devices import (
    EXTRA_CARD,
    EXTRA_DEVICE_INDEX,
    EXTRA_PHY,
    EXTRA_VNPU,
    OPTIONAL_SHARED_NODES,
    PROP_CARD,
    PROP_VNPU_NAME,
    PROP_VNPU_TYPE,
    SHARED_NODES,
    VISIBLE_DEVICES,
    device_id,
    vnpu_node,
)
from discovery_handlers.ascend.vnpu import huawei_device_name
from discovery_handlers.ascend.vnpu_partitions import EXTRA_PARTITION
from discovery_handlers.contract import (
    PARTITION_CONSUMES,
    PARTITION_COUNTER_SET,
    PARTITION_SHARED,
    ClaimDevice,
    Device,
    DeviceSpec,
    Mount,
)

#: The record's keys (what destroying the vNPU needs, without the details).
HOST_ROOT, LIBRARY, CARD, DEVICE, PHY, VNPU, TEMPLATE, TIMEOUT = (
    "host_root", "library", "card", "device", "phy", "vnpu", "template", "timeout")
_PARTITION_ONLY = (PARTITION_COUNTER_SET, PARTITION_CONSUMES, PARTITION_SHARED)

_T = TypeVar("_T")
log = logging.getLogger(__name__)
_made: set[tuple[str, int, int]] = set()  # (host root, chip's physical id, vNPU id)
_made_lock = threading.Lock()


class VnpuNotMade(RuntimeError):
    """The vNPU of a partition could not be created (or removed); the message names the chip
    and template."""


def made_on(host_root: str) -> frozenset[tuple[int, int]]:
    """(physical id, vNPU id) of the vNPUs made here under ``host_root`` and not destroyed."""
    with _made_lock:
        return frozenset((phy, vnpu) for root, phy, vnpu in _made if root == host_root)


def kept(record: Mapping[str, str]) -> None:
    """A vNPU made before the agent restarted (its claim's record)."""
    with _made_lock:
        _made.add((record[HOST_ROOT], int(record[PHY]), int(record[VNPU])))


def make(details: AscendDetails, device: Device) -> ClaimDevice | None:
    """The vNPU for partition ``device`` created, and what the claim's containers get; None
    for a device that is not a partition (a whole chip, an admin's vNPU)."""
    template = device.extra.get(EXTRA_PARTITION)
    if template is None:
        return None
    phy = int(device.extra[EXTRA_PHY])
    where = f"chip {device_id(phy)}, template {template}"
    if EXTRA_CARD not in device.extra or EXTRA_DEVICE_INDEX not in device.extra:
        raise VnpuNotMade(f"cannot create a vNPU on {where}: its card and chip index are "
                          "unknown (DCMI lists them)")
    card, dev = int(device.extra[EXTRA_CARD]), int(device.extra[EXTRA_DEVICE_INDEX])
    library = details.on_host(details.library_path) if details.library_path else ""
    timeout = details.dcmi_timeout_seconds

    def record_of(vdev: int) -> dict[str, str]:
        return {HOST_ROOT: details.host_root, LIBRARY: library, CARD: str(card),
                DEVICE: str(dev), PHY: str(phy), VNPU: str(vdev), TEMPLATE: template,
                TIMEOUT: str(timeout)}

    def made_too_late(answer: tuple[int | None, str]) -> None:
        if answer[0] is not None:  # the claim was refused meanwhile: nobody holds it
            _destroy_unheld(record_of(answer[0]))

    try:
        vdev, problem = dcmi_lanes.library(library or None).on_card(
            card, lambda lib: vnpu_dcmi.create_vnpu(lib.call, card, dev, template), timeout,
            answered_late=made_too_late)
    except dcmi.DcmiError as error:
        raise VnpuNotMade(f"cannot create a vNPU on {where}: {error}") from error
    if vdev is None:
        raise VnpuNotMade(f"creating a vNPU on {where} failed: {problem}")
    record = record_of(vdev)
    if not os.path.exists(details.on_host(vnpu_node(vdev))):
        undone = "destroyed again"
        try:
            destroy(record)
        except VnpuNotMade as error:
            undone = str(error)
        raise VnpuNotMade(f"the vNPU {vdev} created on {where} has no device node "
                          f"{vnpu_node(vdev)}: {undone}")
    kept(record)
    return ClaimDevice(device=_as_vnpu(details, device, vdev, card), record=record)


def destroy(record: Mapping[str, str]) -> None:
    """Destroy the vNPU ``record`` names; one DCMI no longer knows (its chip gone) is done."""
    card, dev, vdev = int(record[CARD]), int(record[DEVICE]), int(record[VNPU])
    where = (f"vNPU {vdev} on chip {device_id(int(record[PHY]))}, template "
             f"{record[TEMPLATE]}")
    try:
        problem = _bounded(record[LIBRARY], card, float(record[TIMEOUT]),
                           lambda lib: vnpu_dcmi.destroy_vnpu(lib.call, card, dev, vdev))
    except dcmi.DcmiError as error:
        raise VnpuNotMade(f"cannot destroy {where}: {error}") from error
    if problem:
        raise VnpuNotMade(f"destroying {where} failed: {problem}")
    with _made_lock:
        _made.discard((record[HOST_ROOT], int(record[PHY]), vdev))


def _bounded(library: str, card: int, timeout: float, call: Callable[[dcmi.Dcmi], _T]) -> _T:
    return dcmi_lanes.library(library or None).on_card(card, call, timeout)


def _destroy_unheld(record: Mapping[str, str]) -> None:
    """A vNPU whose creation answered after its claim was refused, destroyed (or logged)."""
    try:
        destroy(record)
    except VnpuNotMade as error:
        log.error("a vNPU created after its claim was refused could not be destroyed: %s "
                  "(npu-smi set -t destroy-vnpu removes it)", error)
        return
    log.warning("destroyed vNPU %s of chip %s (%s): its creation answered after its claim "
                "was refused", record[VNPU], device_id(int(record[PHY])), record[TEMPLATE])


def _as_vnpu(details: AscendDetails, partition: Device, vdev: int, card: int) -> Device:
    props = {k: v for k, v in partition.properties.items() if k not in _PARTITION_ONLY}
    props[VISIBLE_DEVICES] = str(vdev)
    props[PROP_CARD] = str(card)
    props[PROP_VNPU_NAME] = huawei_device_name(props.get(PROP_VNPU_TYPE, ""), vdev,
                                               int(partition.extra[EXTRA_PHY]))
    shared = [n for n in (*SHARED_NODES, *OPTIONAL_SHARED_NODES)
              if os.path.exists(details.on_host(n))]
    specs = (DeviceSpec(container_path=f"/dev/davinci{vdev}", host_path=vnpu_node(vdev)),
             *(DeviceSpec(container_path=n, host_path=n) for n in shared))
    mounts: tuple[Mount, ...] = ()
    if details.mount_driver and os.path.isdir(details.on_host(details.driver_path)):
        mounts = (Mount(container_path=details.driver_path, host_path=details.driver_path,
                        read_only=True),)
    return Device(id=partition.id, properties=props, mounts=mounts, device_specs=specs,
                  health=partition.health,
                  extra={**partition.extra, EXTRA_VNPU: str(vdev)})
