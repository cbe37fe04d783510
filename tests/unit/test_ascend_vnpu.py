"""Static vNPUs without I/O: ``npu-smi info -t info-vnpu`` as real machines print it, Huawei's
template names and vNPU types, a vNPU's device (nodes, env) and the ``vnpuType`` detail."""

from __future__ import annotations

import pytest

from discovery_handlers.ascend.chips import Chip
from discovery_handlers.ascend.details import parse_details
from discovery_handlers.ascend.devices import compose, vnpu_device
from discovery_handlers.ascend.npu_smi import NpuSmiError, parse_info_vnpu
from discovery_handlers.ascend.vnpu import (
    VNpu,
    template_aicore,
    template_memory_mb,
    vnpu_type,
)
from discovery_handlers.contract import HEALTHY, InvalidDetails

#: npu-smi on an Atlas 300I A2 (910B4, 20 AI cores, 32 GB) after two create-vnpu calls, the
#: first vNPU in a container (its box as npu-smi prints it).
TWO_VNPUS = """\
+-------------------------------------------------------------------------------+
| NPU resource static info as follow:                                           |
| Format:Free/Total                   NA: Currently, query is not supported.    |
| AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD    |
|            GB                                                                 |
|===============================================================================|
| 0/20      0/32      1/7      1/9    0/0     0/2     0/24     0/4      NA/NA   |
+-------------------------------------------------------------------------------+
| Total number of vnpu: 2                                                       |
+-------------------------------------------------------------------------------+
|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
+-------------------------------------------------------------------------------+
|  116      |  0             |  ffffffffffff  |  1       |  vir10_3c_16g        |
+-------------------------------------------------------------------------------+
|  117      |  1             |  000000000000  |  0       |  vir10_3c_16g        |
+-------------------------------------------------------------------------------+
"""
#: The same chip before any vNPU.
NO_VNPU = TWO_VNPUS.split("| Total")[0].replace("0/20      0/32      1/7 ",
                                                 "20/20     28/32     6/6 ") + """\
| Total number of vnpu: 0                                                       |
+-------------------------------------------------------------------------------+
|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
+-------------------------------------------------------------------------------+
"""
#: What npu-smi prints on chips that cannot be split (Atlas 200I A2).
UNSUPPORTED = "This device does not support querying info-vnpu.\n"


def test_info_vnpu_rows_are_the_chips_vnpus_with_their_templates_figures() -> None:
    assert parse_info_vnpu(TWO_VNPUS) == (
        VNpu(vdev_id=116, template="vir10_3c_16g", aicore=10, memory_mb=16384, vgroup=0,
             status=1, in_container=True),
        VNpu(vdev_id=117, template="vir10_3c_16g", aicore=10, memory_mb=16384, vgroup=1,
             status=0, in_container=False),
    )
    assert parse_info_vnpu(NO_VNPU) == ()
    assert parse_info_vnpu(UNSUPPORTED) == ()


@pytest.mark.parametrize(("text", "says"), [
    ("", "no 'Total number of vnpu'"),
    ("command not found\n", "no 'Total number of vnpu'"),
    (TWO_VNPUS.replace("vnpu: 2", "vnpu: 3"), "lists 2 vNPU rows but says"),
    (TWO_VNPUS.replace("|  117      |", "|  x117     |"), "lists 1 vNPU rows but says"),
])
def test_info_vnpu_output_that_does_not_add_up_is_refused(text: str, says: str) -> None:
    with pytest.raises(NpuSmiError, match=says):
        parse_info_vnpu(text)


@pytest.mark.parametrize(("family", "template", "kind"), [
    ("Ascend910", "vir04", "Ascend910-4c"),
    ("Ascend910", "vir16", "Ascend910-16c"),
    ("Ascend910", "vir10_3c_16g", "Ascend910-10c.3cpu.16g"),
    ("Ascend910", "vir10_3c_16g_nm", "Ascend910-10c.3cpu.16g.ndvpp"),
    ("Ascend910", "vir10_4c_16g_m", "Ascend910-10c.4cpu.16g.dvpp"),
    ("Ascend310P", "vir02_1c", "Ascend310P-2c.1cpu"),
    ("Ascend310P", "vir04_4c_dvpp", "Ascend310P-4c.4cpu.dvpp"),
    ("Ascend310P", "vir16", ""),  # not a 310P template
    ("Ascend910", "vir01", ""),  # Huawei's plugin registers no Ascend910-1c
    ("Ascend910", "vir99", ""),
    ("", "vir04", ""),
])
def test_vnpu_types_are_huaweis_resource_names(family: str, template: str, kind: str) -> None:
    assert vnpu_type(family, template) == kind


def test_a_template_name_says_its_ai_cores_and_memory() -> None:
    assert (template_aicore("vir12_3c_32g"), template_memory_mb("vir12_3c_32g")) == (12, 32768)
    assert (template_aicore("vir04"), template_memory_mb("vir04")) == (4, None)
    assert template_memory_mb("vir10_3c_16g_nm") == 16384


def test_a_vnpu_gets_its_vdavinci_node_as_davinci_and_the_virtual_runtime_option() -> None:
    details = parse_details("runtimeOptions: [NODRV]\nvnpuType: Ascend910-4c\n", {})
    chip = Chip(phy_id=2, card_id=2, device_index=0, chip_type="Ascend", chip_name="910B3")
    vnpu = VNpu(vdev_id=132, template="vir04", aicore=4)
    device = vnpu_device(chip, vnpu, "Ascend910-4c", details,
                         shared_present=("/dev/davinci_manager", "/dev/hisi_hdc"),
                         driver_present=True, health=HEALTHY)
    assert device.id == "vdavinci132"
    assert [(s.host_path, s.container_path) for s in device.device_specs] == [
        ("/dev/vdavinci132", "/dev/davinci132"),
        ("/dev/davinci_manager", "/dev/davinci_manager"), ("/dev/hisi_hdc", "/dev/hisi_hdc")]
    assert device.properties["ASCEND_VNPU_NAME"] == "Ascend910-4c-132-2"
    env = compose(details, [device])
    assert env["ASCEND_VISIBLE_DEVICES"] == "132"
    assert env["ASCEND_RUNTIME_OPTIONS"] == "VIRTUAL,NODRV"
    assert "ASCEND_DEVICE_ID" not in env


def test_vnpu_type_must_be_one_huaweis_plugin_registers() -> None:
    assert parse_details("vnpuType: Ascend310P-2c.1cpu\n", {}).vnpu_type == "Ascend310P-2c.1cpu"
    assert parse_details("", {}).vnpu_type is None
    for bad in ("Ascend910-3c", "huawei.com/Ascend910-4c", "4", "[Ascend910-4c]"):
        with pytest.raises(InvalidDetails, match="vnpuType"):
            parse_details(f"vnpuType: {bad}\n", {})
