"""The ascend handler on an emulated Ascend node: the DCMI library through ctypes, `npu-smi info`,
the device nodes, faults that come and go, and every way the node's software can be broken.

Stands in for a real node: the DCMI library is tests/harness/ascend_dcmi/fake_dcmi.c compiled
here (Huawei's C signatures and return codes), `npu-smi` prints Huawei's table, the device
nodes are files in a tree of the test's own (see tests/harness/ascend_node.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.handler import NO_DRIVER_WARNING, ChipsUnhealthy
from discovery_handlers.contract import Device, PodFacts, warnings_of
from tests.harness.ascend_node import (
    FAULT_CODE,
    AscendNode,
    chips_910b,
    dcmi_library,
)

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
NEXT_LIST_DEADLINE_S = 10.0  # a poll is 1 s here; far more than one poll is a failure


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    emulated = AscendNode(tmp_path / "host", chips_910b(8), library=dcmi_library)
    for name, value in emulated.env.items():
        monkeypatch.setenv(name, value)
    return emulated


def details(node: AscendNode, **fields: object) -> AscendDetails:
    return handler.parse_details(node.details(**fields), {})


async def next_list(stream: AsyncIterator[Sequence[Device]]) -> Sequence[Device]:
    """The next list as the handler yielded it (a DeviceList keeps its warnings)."""
    return await asyncio.wait_for(anext(stream), NEXT_LIST_DEADLINE_S)


async def first_list(parsed: AscendDetails) -> Sequence[Device]:
    stream = handler.discover(parsed)
    try:
        return await next_list(stream)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_eight_910b_chips_found_through_dcmi(node: AscendNode) -> None:
    parsed = details(node)
    devices = await first_list(parsed)
    assert [d.id for d in devices] == [f"davinci{i}" for i in range(8)]
    for index, device in enumerate(devices):
        assert device.health.healthy
        assert device.properties["ASCEND_CHIP_MODEL"] == "Ascend910B3"
        assert device.properties["ASCEND_MEMORY_MB"] == "65536"
        assert device.properties["ASCEND_VISIBLE_DEVICES"] == str(index)
        assert device.properties["ASCEND_AICORE_COUNT"] == "20"
        assert device.properties["ASCEND_BUS_ID"] == f"0000:{0xC1 + index:02X}:00.0"
    status = handler.status(parsed)
    assert (status.source, status.problems) == ("dcmi", ())


async def test_a_faulted_chip_turns_unhealthy_within_a_poll_and_comes_back(
        node: AscendNode) -> None:
    stream = handler.discover(details(node))
    try:
        assert all(d.health.healthy for d in await next_list(stream))
        node.fault(3)
        faulted = {d.id: d for d in await next_list(stream)}
        assert not faulted["davinci3"].health.healthy
        assert faulted["davinci3"].health.reason == (
            f"fault level RestartBusiness: error codes 0x{FAULT_CODE:08X} RestartBusiness "
            "(Huawei's default faultCode.json)")
        assert [d for d in faulted if not faulted[d].health.healthy] == ["davinci3"]
        node.clear(3)
        assert all(d.health.healthy for d in await next_list(stream))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_without_the_library_npu_smi_tells_the_same(node: AscendNode) -> None:
    parsed = details(node, libraryPath="/usr/lib/missing/libdcmi.so")
    node.fault(5, level=2)
    devices = await first_list(parsed)
    assert [d.properties["ASCEND_CHIP_MODEL"] for d in devices] == ["Ascend910B3"] * 8
    assert [d.health.healthy for d in devices] == [True] * 5 + [False] + [True] * 2
    assert devices[5].health.reason == "npu-smi health 'Alarm'"
    status = handler.status(parsed)
    assert status.source == "npu-smi"
    assert "cannot load" in status.problems[0]
    assert "/usr/lib/missing/libdcmi.so" in status.problems[0]


async def test_the_loader_search_path_is_the_default(node: AscendNode) -> None:
    parsed = handler.parse_details(f"hostRoot: {node.root}\n", {})
    assert len(await first_list(parsed)) == 8
    status = handler.status(parsed)
    assert status.source == "npu-smi"  # no libdcmi.so on this machine's loader path
    assert "cannot load libdcmi.so" in status.problems[0]


async def test_library_calls_returning_errors_degrade_to_npu_smi(node: AscendNode) -> None:
    node.fail("dcmi_get_card_list", -8005)
    parsed = details(node)
    assert len(await first_list(parsed)) == 8
    status = handler.status(parsed)
    assert status.source == "npu-smi"
    assert "dcmi_get_card_list returned -8005 (DCMI_ERR_CODE_INNER_ERR)" in str(status)


async def test_unreadable_health_holds_chips_back(node: AscendNode) -> None:
    node.fail("dcmi_get_device_health", -8006)
    parsed = details(node)
    devices = await first_list(parsed)
    assert len(devices) == 8
    assert not any(d.health.healthy for d in devices)
    assert "DCMI_ERR_CODE_TIME_OUT" in devices[0].health.reason
    assert handler.status(parsed).source == "dcmi"


async def test_a_library_that_fails_to_initialise(node: AscendNode) -> None:
    library = node.library_copy("libdcmi-broken.so")  # its own dlopen handle and state
    node.fail("dcmi_init", -8012)
    parsed = details(node, libraryPath=library)
    assert len(await first_list(parsed)) == 8
    assert "dcmi_init returned -8012" in str(handler.status(parsed))


async def test_garbage_npu_smi_falls_back_to_the_device_nodes(node: AscendNode) -> None:
    node.npu_smi_override = "\x1b[31mdcmi module initialize failed. ret is -8005\n| x | y |\n"
    node.write()
    parsed = details(node, libraryPath="/nowhere/libdcmi.so")
    devices = await first_list(parsed)
    assert [d.id for d in devices] == [f"davinci{i}" for i in range(8)]
    assert "ASCEND_CHIP_MODEL" not in devices[0].properties
    # Each chip carries the warning the agent posts as a Warning Event on its Instance.
    assert devices[0].warning == ("no DCMI or npu-smi: health unknown (advertised healthy "
                                  "while /dev/davinci0 exists)")
    # And the list carries the Configuration's warning (a DiscoveryWarning Event on it).
    assert warnings_of(devices) == (NO_DRIVER_WARNING,)
    assert NO_DRIVER_WARNING.startswith("no DCMI or npu-smi: health unknown")
    status = str(handler.status(parsed))
    assert "source devices" in status
    assert "no DCMI or npu-smi: health unknown" in status
    assert "no 'NPU Name | Health' table header" in status


async def test_a_tree_without_shared_nodes_holds_every_chip_back(node: AscendNode) -> None:
    node.remove_shared_nodes()
    parsed = details(node)
    devices = await first_list(parsed)
    assert len(devices) == 8
    assert {d.health.reason for d in devices} == {
        "shared device nodes missing: /dev/davinci_manager"}
    assert [s.host_path for s in devices[0].device_specs] == ["/dev/davinci0"]
    assert "shared device nodes missing" in str(handler.status(parsed))


async def test_only_davinci_manager_is_required(node: AscendNode) -> None:
    # Huawei's plugin needs /dev/davinci_manager and adds hisi_hdc and devmm_svm where present.
    for name in ("devmm_svm", "hisi_hdc"):
        (node.root / "dev" / name).unlink()
    devices = await first_list(details(node))
    assert all(d.health.healthy for d in devices)
    assert [s.host_path for s in devices[2].device_specs] == [
        "/dev/davinci2", "/dev/davinci_manager"]


async def test_an_empty_host_lists_nothing_and_says_why(tmp_path: Path) -> None:
    parsed = handler.parse_details(f"hostRoot: {tmp_path}\nlibraryPath: /x/libdcmi.so\n", {})
    assert list(await first_list(parsed)) == []
    status = handler.status(parsed)
    assert status.source == "none"
    assert ("npu-smi: /usr/local/bin/npu-smi or /usr/local/sbin/npu-smi not found or not "
            "executable") in status.problems
    assert any(p.startswith("devices: cannot list /dev") for p in status.problems)


async def test_roce_addresses_from_dcmi_reach_the_rank_table_annotation(
        tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dcmi_get_device_ip (RoCE port 0, IPv4 then IPv6): each chip's address in the 910
    annotation; a link-local address or none is Huawei's "-1"; without DCMI, all "-1"."""
    addresses = ("192.168.100.10", "fd00::7", "fe80::1", "")
    chips = [replace(c, roce_ip=ip) for c, ip in zip(chips_910b(4), addresses, strict=True)]
    host = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    for name, value in host.env.items():
        monkeypatch.setenv(name, value)
    key = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
    pod = PodFacts(name="train", uid="u-1", host_ip="10.0.0.1")

    async def device_ips(**fields: object) -> list[str]:
        parsed = details(host, **fields)
        annotations = handler.pod_annotations(parsed, await first_list(parsed), pod)
        return [d["device_ip"] for d in json.loads(annotations[key])["devices"]]

    assert await device_ips() == ["192.168.100.10", "fd00::7", "-1", "-1"]
    assert await device_ips(sources=["npu-smi"]) == ["-1"] * 4


async def test_chip_names_filter_by_family(node: AscendNode) -> None:
    assert len(await first_list(details(node, chipNames=["Ascend910"]))) == 8
    assert list(await first_list(details(node, chipNames=["Ascend310P"]))) == []


async def test_prepare_refuses_a_chip_that_went_unhealthy(node: AscendNode) -> None:
    parsed = details(node)
    devices = await first_list(parsed)
    await handler.prepare(parsed, devices[:2])  # healthy: no error
    node.fault(1)
    with pytest.raises(ChipsUnhealthy, match=r"davinci1 is unhealthy: fault level RestartBusiness"):
        await handler.prepare(parsed, devices[:2])
    (node.root / "dev" / "davinci0").unlink()
    with pytest.raises(ChipsUnhealthy, match=r"davinci0 is unhealthy: device node /dev/davinci0"):
        await handler.prepare(parsed, devices[:1])
