"""Static vNPUs on an emulated Ascend node: found through DCMI's vdevice query (ctypes, Huawei's
structs) and through ``npu-smi info -t info-vnpu``, served by type, healthy as their chip.

Stands in for a real node: the DCMI library is tests/harness/ascend_dcmi/fake_dcmi.c compiled
here (Huawei's signatures and struct layouts), ``npu-smi`` prints Huawei's tables, the device
nodes are files in a tree of the test's own (tests/harness/ascend_node.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from discovery_handlers.ascend import handler, sources, vnpu_claims, vnpu_dcmi
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.handler import ChipsUnhealthy
from discovery_handlers.ascend.sources import scan
from discovery_handlers.contract import DeviceSpec
from tests.harness import agent_process as harness
from tests.harness.ascend_node import (
    STATE_ENV,
    AscendNode,
    SimVnpu,
    chips_910b,
    dcmi_library,
)

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
#: Chip 0 split in two (10 AI cores and 16 GB, 5 and 8 GB), chip 1 into a 5c, chip 2 whole.
SPLIT = (SimVnpu(0, 0, 100, "vir10_3c_16g", 10, 16384),
         SimVnpu(0, 0, 101, "vir05_1c_8g", 5, 8192, vgroup=1),
         SimVnpu(1, 0, 116, "vir05_1c_8g", 5, 8192))


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    emulated = AscendNode(tmp_path / "host", chips_910b(3), library=dcmi_library, vnpus=SPLIT)
    for name, value in emulated.env.items():
        monkeypatch.setenv(name, value)
    return emulated


def details(node: AscendNode, **fields: object) -> AscendDetails:
    return handler.parse_details(node.details(**fields), {})


@pytest.mark.parametrize("source", ["dcmi", "npu-smi"])
def test_split_chips_are_served_as_their_vnpus_and_only_so(node: AscendNode,
                                                           source: str) -> None:
    whole = scan(details(node, sources=[source]))
    assert [d.id for d in whole.devices] == ["davinci2"], "a split chip is never whole too"
    assert (whole.status.source, whole.status.problems) == (source, ())
    assert "split into vNPUs" in str(whole.status)
    assert "/dev/davinci0 (vir10_3c_16g, " \
        "vir05_1c_8g)" in str(whole.status)

    five = scan(details(node, sources=[source], vnpuType="Ascend910-5c.1cpu.8g"))
    assert [d.id for d in five.devices] == ["vdavinci101", "vdavinci116"]
    first = five.devices[0]
    assert first.health.healthy
    assert {k: first.properties[k] for k in (
        "ASCEND_VISIBLE_DEVICES", "ASCEND_VNPU_TYPE", "ASCEND_VNPU_TEMPLATE", "ASCEND_VNPU_NAME",
        "ASCEND_PHYSICAL_ID", "ASCEND_AICORE_COUNT", "ASCEND_MEMORY_MB")} == {
        "ASCEND_VISIBLE_DEVICES": "101", "ASCEND_VNPU_TYPE": "Ascend910-5c.1cpu.8g",
        "ASCEND_VNPU_TEMPLATE": "vir05_1c_8g", "ASCEND_VNPU_NAME": "Ascend910-5c.1cpu.8g-101-0",
        "ASCEND_PHYSICAL_ID": "0", "ASCEND_AICORE_COUNT": "5", "ASCEND_MEMORY_MB": "8192"}
    assert next((s.host_path, s.container_path) for s in first.device_specs) == (
        "/dev/vdavinci101", "/dev/davinci101")
    env = handler.compose(details(node, vnpuType="Ascend910-5c.1cpu.8g"), [first])
    assert (env["ASCEND_VISIBLE_DEVICES"], env["ASCEND_RUNTIME_OPTIONS"]) == ("101", "VIRTUAL")

    ten = scan(details(node, sources=[source], vnpuType="Ascend910-10c.3cpu.16g"))
    assert [d.id for d in ten.devices] == ["vdavinci100"]
    assert scan(details(node, sources=[source], vnpuType="Ascend910-4c")).devices == ()


def test_a_vnpu_is_as_healthy_as_its_chip_and_needs_its_own_node(node: AscendNode) -> None:
    parsed = details(node, vnpuType="Ascend910-5c.1cpu.8g")
    node.fault(0)
    by_id = {d.id: d for d in scan(parsed).devices}
    assert not by_id["vdavinci101"].health.healthy
    assert "fault level" in by_id["vdavinci101"].health.reason
    assert by_id["vdavinci116"].health.healthy, "a fault on chip 0 leaves chip 1's vNPU"
    node.clear(0)
    (node.root / "dev" / "vdavinci116").unlink()
    by_id = {d.id: d for d in scan(parsed).devices}
    assert by_id["vdavinci101"].health.healthy
    assert by_id["vdavinci116"].health.reason == "device node /dev/vdavinci116 missing"


def test_a_vnpu_query_that_fails_is_named_and_the_chip_is_served_whole(
        node: AscendNode) -> None:
    node.fail("dcmi_get_device_info", -8005)
    result = scan(details(node, sources=["dcmi"]))
    assert [d.id for d in result.devices] == ["davinci0", "davinci1", "davinci2"]
    assert any("vNPUs unreadable: dcmi_get_device_info (total resource) returned -8005" in p
               for p in result.status.problems)
    node.fail("dcmi_get_device_info", -8255)  # DCMI_ERR_CODE_NOT_SUPPORT: cannot be split
    result = scan(details(node, sources=["dcmi"]))
    assert len(result.devices) == 3
    assert result.status.problems == ()


def test_the_ctypes_structs_have_the_sizes_of_huaweis_header(node: AscendNode,
                                                            dcmi_library: Path) -> None:
    """The stand-in declares the structs as dcmi_interface_api.h does and reports their size
    through ``size``; ctypes must lay them out the same, or every field after a gap is wrong."""
    assert STATE_ENV in node.env
    lib = ctypes.CDLL(str(node.root / "usr/local/dcmi/libdcmi.so"))
    assert lib.dcmi_init() == 0
    call = lib.dcmi_get_device_info
    call.argtypes = vnpu_dcmi.SIGNATURE
    for struct, sub in ((vnpu_dcmi.DcmiSocTotalResource, vnpu_dcmi.SUB_CMD_GET_TOTAL_RESOURCE),
                        (vnpu_dcmi.DcmiVdevQueryStru, vnpu_dcmi.SUB_CMD_GET_VDEV_RESOURCE)):
        buf = struct(vdev_id=100) if struct is vnpu_dcmi.DcmiVdevQueryStru else struct()
        size = ctypes.c_uint(ctypes.sizeof(buf) + 64)
        assert call(0, 0, vnpu_dcmi.DCMI_MAIN_CMD_VDEV_MNG, sub, ctypes.byref(buf),
                    ctypes.byref(size)) == 0
        assert size.value == ctypes.sizeof(struct), struct.__name__
    total = vnpu_dcmi.DcmiSocTotalResource()
    size = ctypes.c_uint(ctypes.sizeof(total))
    call(0, 0, vnpu_dcmi.DCMI_MAIN_CMD_VDEV_MNG, 1, ctypes.byref(total), ctypes.byref(size))
    assert (total.vdev_num, list(total.vdev_id[:2]), total.computing.aic,
            total.computing.memory_size) == (2, [100, 101], 20.0, 65536)


def test_an_npu_smi_that_cannot_list_vnpus_leaves_the_chips_whole(node: AscendNode) -> None:
    """An npu-smi or a product without the query (usage text and an error, or Huawei's "does
    not support" line): the chips are served whole and nothing is reported; a table whose rows
    do not add up is reported."""
    files = sorted(node.vnpu_dir.iterdir())
    for path in files:
        path.unlink()  # the stand-in then answers "unsupported: ..." and exits 2
    result = scan(details(node, sources=["npu-smi"]))
    assert [d.id for d in result.devices] == ["davinci0", "davinci1", "davinci2"]
    assert result.status.problems == ()
    node.vnpu_dir.joinpath("0-0").write_text("This device does not support querying "
                                             "info-vnpu.\n")
    node.vnpu_dir.joinpath("1-0").write_text("| Total number of vnpu: 2 |\n")
    node.vnpu_dir.joinpath("2-0").write_text("| Total number of vnpu: 0 |\n")
    sources._vnpu_answers.clear()  # asked again at once, not after VNPU_REREAD_S
    result = scan(details(node, sources=["npu-smi"]))
    assert [d.id for d in result.devices] == ["davinci0", "davinci1", "davinci2"]
    assert result.status.problems == (
        "NPU 1 chip 0: vNPUs unreadable: npu-smi: npu-smi info -t info-vnpu lists 0 vNPU rows "
        "but says 'Total number of vnpu: 2'",)


async def test_a_partition_gets_its_vnpu_made_at_prepare_and_destroyed_at_unprepare(
        node: AscendNode) -> None:
    parsed = details(node, vnpuPartitions=["Ascend910-5c.1cpu.8g"])
    offered = scan(parsed).devices
    assert [d.id for d in offered] == [f"davinci2-vir05-1c-8g-{k}" for k in range(4)], \
        "only the chip not split statically, 20 cores / 5 per slice"
    await handler.prepare(parsed, [offered[0]])  # its chip is there and healthy
    made = await handler.prepare_claim_device(parsed, offered[0])
    assert made is not None
    ((card, dev, vdev, template),) = node.created_vnpus()
    assert (card, dev, template, made.record["vnpu"]) == (2, 0, "vir05_1c_8g", str(vdev))
    assert made.device.properties["ASCEND_VISIBLE_DEVICES"] == str(vdev)
    assert made.device.device_specs[0] == DeviceSpec(container_path=f"/dev/davinci{vdev}",
                                                     host_path=f"/dev/vdavinci{vdev}")
    assert handler.compose(parsed, [made.device])["ASCEND_RUNTIME_OPTIONS"] == "VIRTUAL"
    assert (node.root / "dev" / f"vdavinci{vdev}").exists()
    assert [d.id for d in scan(parsed).devices] == [d.id for d in offered], \
        "the chip stays offered as partitions: the vNPU is one of them"
    five = scan(details(node, vnpuType="Ascend910-5c.1cpu.8g")).devices
    assert [d.id for d in five] == ["vdavinci101", "vdavinci116"], "never an admin's vNPU"

    await handler.unprepare_claim_device(made.record)
    assert node.created_vnpus() == []
    assert not (node.root / "dev" / f"vdavinci{vdev}").exists()

    node.fail("dcmi_create_vdevice", -8005)
    with pytest.raises(vnpu_claims.VnpuNotMade, match="chip davinci2, template vir05_1c_8g "
                                                      "failed: dcmi_create_vdevice returned"):
        await handler.prepare_claim_device(parsed, offered[1])
    assert node.created_vnpus() == []

    node.fails.clear()
    node.write()
    held = await handler.prepare_claim_device(parsed, offered[1])
    assert held is not None
    node.chips = [c for c in node.chips if c.phy != 2]  # the chip drops off the bus
    node.write()
    await handler.unprepare_claim_device(held.record)  # its vNPU went with it: nothing to undo
    left = node.created_vnpus()  # (the stand-in keeps a gone chip's vNPU lines)
    with pytest.raises(ChipsUnhealthy, match="davinci2-vir05-1c-8g-1 is gone"):
        await handler.prepare(parsed, [offered[1]])
    with pytest.raises(vnpu_claims.VnpuNotMade, match="chip davinci2, template vir05_1c_8g "
                                                      "failed: dcmi_create_vdevice returned -8007"):
        await handler.prepare_claim_device(parsed, offered[1])
    assert node.created_vnpus() == left, "no vNPU made"


async def test_a_vnpu_whose_creation_answers_after_its_claim_was_refused_is_destroyed(
        node: AscendNode, caplog: pytest.LogCaptureFixture) -> None:
    parsed = details(node, vnpuPartitions=["Ascend910-5c.1cpu.8g"], dcmiTimeoutSeconds=0.5)
    (partition, *_) = scan(parsed).devices
    node.hang("dcmi_create_vdevice", 2)  # chip 2's card stops answering, as after a drop
    with pytest.raises(vnpu_claims.VnpuNotMade, match=r"cannot create a vNPU on chip davinci2, "
                                                      r"template vir05_1c_8g: card 2: DCMI "
                                                      r"dcmi_create_vdevice .* did not answer"):
        await handler.prepare_claim_device(parsed, partition)
    node.unhang()  # the stuck call now makes the vNPU, for a claim already refused

    async def undone() -> bool | None:
        said = any("its creation answered after its claim was refused" in r.getMessage()
                   for r in caplog.records)
        return (said and node.created_vnpus() == []) or None

    await harness.eventually(undone, what="the late vNPU destroyed")
    assert next(d.id for d in scan(parsed).devices) == partition.id, "the chip offered again"
