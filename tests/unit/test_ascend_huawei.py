"""The Node labels and pod annotations Huawei's Ascend plugin writes, computed from our chips:
the keys and values Volcano and MindCluster read (discovery_handlers/ascend/huawei.py)."""

from __future__ import annotations

import json

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.chips import Chip
from discovery_handlers.ascend.details import AscendDetails, parse_details
from discovery_handlers.ascend.devices import to_device
from discovery_handlers.ascend.huawei import node_labels, pod_annotations
from discovery_handlers.contract import HEALTHY, Device, InvalidDetails, PodFacts

POD = PodFacts(name="train-0", uid="6f1c0a52-1b1e-4c1e-9a43-3d3f0c0b5e11", host_ip="10.0.3.7")


def chip(phy: int, name: str = "910B3", *, aicore: int | None = 20,
         memory_mb: int | None = 65536) -> Device:
    return to_device(Chip(phy_id=phy, card_id=phy // 2, chip_type="Ascend", chip_name=name,
                          aicore_count=aicore, memory_mb=memory_mb),
                     AscendDetails(), shared_present=(), driver_present=False, health=HEALTHY)


@pytest.mark.parametrize(("name", "aicore", "memory", "expected"), [
    ("910B3", 20, 65536, {"accelerator": "huawei-Ascend910",
                          "node.kubernetes.io/npu.chip.name": "910B3",
                          "servertype": "Ascend910B-20", "mind-cluster/npu-chip-memory": "64G"}),
    ("910B4", 20, 32768, {"accelerator": "huawei-Ascend910",
                          "node.kubernetes.io/npu.chip.name": "910B4",
                          "servertype": "Ascend910B-20", "mind-cluster/npu-chip-memory": "32G"}),
    ("910A", 32, 32768, {"accelerator": "huawei-Ascend910",
                         "node.kubernetes.io/npu.chip.name": "910A",
                         "servertype": "Ascend910-32", "mind-cluster/npu-chip-memory": "32G"}),
    ("910_9391", 24, 65536, {"accelerator": "huawei-Ascend910",
                             "node.kubernetes.io/npu.chip.name": "910_9391",
                             "servertype": "Ascend910A3-24",
                             "mind-cluster/npu-chip-memory": "64G"}),
    # 310P: no on-chip memory label (Huawei's plugin writes it for 910 families only).
    ("310P3", 8, 21527, {"accelerator": "huawei-Ascend310P",
                         "node.kubernetes.io/npu.chip.name": "310P3",
                         "servertype": "Ascend310P-8"}),
    # npu-smi tells no AI core count: no servertype rather than a wrong one.
    ("310", None, 8192, {"accelerator": "huawei-Ascend310",
                         "node.kubernetes.io/npu.chip.name": "310"}),
])
def test_node_labels_are_huaweis_keys_and_values(name: str, aicore: int | None, memory: int,
                                                 expected: dict[str, str]) -> None:
    assert node_labels([chip(0, name, aicore=aicore, memory_mb=memory),
                        chip(1, name, aicore=aicore, memory_mb=memory)]) == expected


def test_a_value_the_chips_disagree_on_or_nobody_read_is_not_written() -> None:
    assert node_labels([chip(0, "910B3"), chip(1, "910B4")]) == {
        "accelerator": "huawei-Ascend910", "mind-cluster/npu-chip-memory": "64G"}
    bare = to_device(Chip(phy_id=3), AscendDetails(), shared_present=(), driver_present=False,
                     health=HEALTHY)
    assert node_labels([bare]) == {}
    assert node_labels([]) == {}


def test_a_pod_on_910_chips_gets_the_chip_names_and_the_rank_table_configuration() -> None:
    # Allocation order 10, 3: names sort as strings (Huawei's sort), devices by physical id.
    annotations = pod_annotations([chip(10), chip(3)], POD)
    assert annotations["huawei.com/Ascend910"] == "Ascend910-10,Ascend910-3"
    assert annotations["huawei.com/AscendReal"] == "Ascend910-10,Ascend910-3"
    configuration = json.loads(annotations["ascend.kubectl.kubernetes.io/ascend-910-configuration"])
    assert configuration == {
        "pod_name": "train-0", "server_id": POD.uid, "host_ip": "10.0.3.7",
        "server_ip": "10.0.3.7", "super_pod_id": -2, "rack_id": -2, "server_index": "-2",
        "devices": [{"device_id": "3", "device_ip": "-1"}, {"device_id": "10", "device_ip": "-1"}],
    }
    assert set(annotations) == {"huawei.com/Ascend910", "huawei.com/AscendReal",
                                "ascend.kubectl.kubernetes.io/ascend-910-configuration"}


def test_a_pod_on_310p_chips_gets_the_chip_names_only() -> None:
    assert pod_annotations([chip(1, "310P3")], POD) == {
        "huawei.com/Ascend310P": "Ascend310P-1", "huawei.com/AscendReal": "Ascend310P-1"}


def test_chips_of_no_known_family_get_no_annotations() -> None:
    bare = to_device(Chip(phy_id=3), AscendDetails(), shared_present=(), driver_present=False,
                     health=HEALTHY)
    assert pod_annotations([bare], POD) == {}


def test_huawei_metadata_false_turns_both_off() -> None:
    details = parse_details("huaweiMetadata: false", {})
    devices = [chip(0)]
    assert not any(k in handler.node_labels(details, devices)
                   for k in ("accelerator", "servertype"))
    assert handler.node_labels(details, devices)["edgeplug.io/accelerator"] == "huawei-Ascend910"
    assert handler.pod_annotations(details, devices, POD) == {}
    on = parse_details("", {})
    assert handler.node_labels(on, devices)["accelerator"] == "huawei-Ascend910"
    assert handler.pod_annotations(on, devices, POD)["huawei.com/Ascend910"] == "Ascend910-0"
    with pytest.raises(InvalidDetails, match="huaweiMetadata"):
        parse_details("huaweiMetadata: sometimes", {})
