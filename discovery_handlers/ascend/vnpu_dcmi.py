"""A chip's vNPUs through DCMI's generic query, as Huawei's device plugin reads them::

    int dcmi_get_device_info(int card_id, int device_id, enum dcmi_main_cmd main_cmd,
                             unsigned int sub_cmd, void *buf, unsigned int *size);

``DCMI_MAIN_CMD_VDEV_MNG`` (52): sub-command 1 fills ``struct dcmi_soc_total_resource`` (the
vNPU ids), 0 fills ``struct dcmi_vdev_query_stru`` for the ``vdev_id`` given (template name,
vGroup, AI cores, memory in MB). The structs are laid out as ``dcmi_interface_api.h`` declares
them; ``DCMI_ERR_CODE_NOT_SUPPORT`` means the chip cannot be split (no vNPU).

Making and removing one (a partition the scheduler allocated, ``vnpu_claims``)::

    int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
                            struct dcmi_create_vdev_out *out);
    int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdevid);

asked as Huawei's plugin asks: the template's name, and ``0xFFFFFFFF`` for the vNPU id and the
vGroup (the driver chooses both); ``out`` gives the vNPU id made.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from discovery_handlers.ascend.vnpu import VNpu

DCMI_MAIN_CMD_VDEV_MNG = 52
SUB_CMD_GET_VDEV_RESOURCE = 0
SUB_CMD_GET_TOTAL_RESOURCE = 1
DCMI_VDEV_RES_NAME_LEN = 16
DCMI_VDEV_SIZE = 20
DCMI_VDEV_FOR_RESERVE = 32
DCMI_SOC_SPLIT_MAX = 32
NOT_SUPPORTED = -8255  # DCMI_ERR_CODE_NOT_SUPPORT
GONE = (-8007, -8008)  # DCMI_ERR_CODE_INVALID_DEVICE_ID, DCMI_ERR_CODE_DEVICE_NOT_EXIST
TEMPLATE_NAME_LEN = 32
ANY_ID = 0xFFFFFFFF  # a vNPU id or vGroup the driver chooses
#: ``dcmi_get_device_info``'s argument types (``enum dcmi_main_cmd`` is int-sized).
SIGNATURE: list[Any] = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]


class DcmiBaseResource(ctypes.Structure):
    _fields_ = [
        ("token", ctypes.c_ulonglong), ("token_max", ctypes.c_ulonglong),
        ("task_timeout", ctypes.c_ulonglong), ("vfg_id", ctypes.c_uint),
        ("vip_mode", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * (DCMI_VDEV_FOR_RESERVE - 1)),
    ]


class DcmiComputingResource(ctypes.Structure):
    _fields_ = [
        ("aic", ctypes.c_float), ("aiv", ctypes.c_float),
        *((name, ctypes.c_ushort) for name in (
            "dsa", "rtsq", "acsq", "cdqm", "c_core", "ffts", "sdma", "pcie_dma")),
        ("memory_size", ctypes.c_ulonglong),  # MB
        *((name, ctypes.c_uint) for name in ("event_id", "notify_id", "stream_id", "model_id")),
        *((name, ctypes.c_ushort) for name in (
            "topic_schedule_aicpu", "host_ctrl_cpu", "host_aicpu", "device_aicpu",
            "topic_ctrl_cpu_slot")),
        ("vdev_aicore_utilization", ctypes.c_uint),
        ("vdev_memory_total", ctypes.c_ulonglong), ("vdev_memory_free", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ubyte * (DCMI_VDEV_FOR_RESERVE - DCMI_VDEV_SIZE)),
    ]


class DcmiMediaResource(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_float) for name in ("jpegd", "jpege", "vpc", "vdec", "pngd", "venc")),
        ("reserved", ctypes.c_ubyte * DCMI_VDEV_FOR_RESERVE),
    ]


class DcmiVdevQueryInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * DCMI_VDEV_RES_NAME_LEN), ("status", ctypes.c_uint),
        ("is_container_used", ctypes.c_uint), ("vfid", ctypes.c_uint),
        ("vfg_id", ctypes.c_uint), ("container_id", ctypes.c_ulonglong),
        ("base", DcmiBaseResource), ("computing", DcmiComputingResource),
        ("media", DcmiMediaResource),
    ]


class DcmiVdevQueryStru(ctypes.Structure):
    _fields_ = [("vdev_id", ctypes.c_uint), ("query_info", DcmiVdevQueryInfo)]


class DcmiSocTotalResource(ctypes.Structure):
    _fields_ = [
        ("vdev_num", ctypes.c_uint), ("vdev_id", ctypes.c_uint * DCMI_SOC_SPLIT_MAX),
        ("vfg_num", ctypes.c_uint), ("vfg_bitmap", ctypes.c_uint),
        ("base", DcmiBaseResource), ("computing", DcmiComputingResource),
        ("media", DcmiMediaResource),
    ]


class DcmiCreateVdevResStru(ctypes.Structure):
    _fields_ = [
        ("vdev_id", ctypes.c_uint), ("vfg_id", ctypes.c_uint),
        ("template_name", ctypes.c_char * TEMPLATE_NAME_LEN),
        ("reserved", ctypes.c_ubyte * 64),
    ]


class DcmiCreateVdevOut(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_uint) for name in (
            "vdev_id", "pcie_bus", "pcie_device", "pcie_func", "vfg_id")),
        ("reserved", ctypes.c_ubyte * DCMI_VDEV_FOR_RESERVE),
    ]


CREATE_SIGNATURE: list[Any] = [ctypes.c_int, ctypes.c_int,
                               ctypes.POINTER(DcmiCreateVdevResStru),
                               ctypes.POINTER(DcmiCreateVdevOut)]
DESTROY_SIGNATURE: list[Any] = [ctypes.c_int, ctypes.c_int, ctypes.c_uint]

Call = Callable[..., int]  # Dcmi._call: (function name, *arguments) -> return code


def read_vnpus(call: Call, card: int, dev: int) -> tuple[tuple[VNpu, ...] | None, str]:
    """The chip's vNPUs and "" (none: ``()``), or None and what failed."""
    total = DcmiSocTotalResource()
    size = ctypes.c_uint(ctypes.sizeof(total))
    code = call("dcmi_get_device_info", card, dev, DCMI_MAIN_CMD_VDEV_MNG,
                SUB_CMD_GET_TOTAL_RESOURCE, ctypes.byref(total), ctypes.byref(size))
    if code == NOT_SUPPORTED:
        return (), ""
    if code != 0:
        return None, f"dcmi_get_device_info (total resource) returned {code}"
    if total.vdev_num > DCMI_SOC_SPLIT_MAX:
        return None, f"dcmi_get_device_info reported {total.vdev_num} vNPUs"
    found = []
    for vdev_id in total.vdev_id[:total.vdev_num]:
        query = DcmiVdevQueryStru(vdev_id=vdev_id)
        size = ctypes.c_uint(ctypes.sizeof(query))
        code = call("dcmi_get_device_info", card, dev, DCMI_MAIN_CMD_VDEV_MNG,
                    SUB_CMD_GET_VDEV_RESOURCE, ctypes.byref(query), ctypes.byref(size))
        if code != 0:
            return None, f"dcmi_get_device_info (vNPU {vdev_id}) returned {code}"
        info = query.query_info
        name = bytes(info.name).split(b"\0", 1)[0].decode("ascii", "replace")
        found.append(VNpu(
            vdev_id=int(vdev_id), template=name,
            aicore=int(info.computing.aic) if info.computing.aic > 0 else None,
            memory_mb=int(info.computing.memory_size) or None,
            vgroup=int(info.base.vfg_id), status=int(info.status),
            in_container=bool(info.is_container_used),
        ))
    return tuple(found), ""


def create_vnpu(call: Call, card: int, dev: int, template: str) -> tuple[int | None, str]:
    """The id of the vNPU made from ``template`` on the chip and "", or None and what failed."""
    name = template.encode("ascii")
    if len(name) >= TEMPLATE_NAME_LEN:
        return None, f"template name {template!r} too long"
    asked = DcmiCreateVdevResStru(vdev_id=ANY_ID, vfg_id=ANY_ID, template_name=name)
    out = DcmiCreateVdevOut(vdev_id=ANY_ID)
    code = call("dcmi_create_vdevice", card, dev, ctypes.byref(asked), ctypes.byref(out))
    if code != 0:
        return None, f"dcmi_create_vdevice returned {code}"
    return int(out.vdev_id), ""


def destroy_vnpu(call: Call, card: int, dev: int, vdev_id: int) -> str:
    """"" once the vNPU is destroyed or gone (DCMI knows no such chip or vNPU any more: it went
    with its chip, or was destroyed by hand), else what failed."""
    code = call("dcmi_set_destroy_vdevice", card, dev, vdev_id)
    return f"dcmi_set_destroy_vdevice returned {code}" if code not in (0, *GONE) else ""
