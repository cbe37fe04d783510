"""What a container gets from Ascend chips: device nodes, mounts, properties, the environment
for several chips, which chips go together, and how DCMI health reads."""

from __future__ import annotations

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.chips import Chip, chip_family, wanted
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.ascend.devices import compose, node_labels, rank, to_device
from discovery_handlers.contract import HEALTHY, Device, DeviceSpec, Mount

SHARED = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


def chip_device(phy: int, card: int | None, details: AscendDetails | None = None) -> Device:
    chip = Chip(phy_id=phy, card_id=card, device_index=0, chip_type="Ascend", chip_name="910B3",
                memory_mb=65536)
    return to_device(chip, details or AscendDetails(), shared_present=SHARED,
                     driver_present=True, health=HEALTHY)


def test_a_chip_gets_its_node_the_shared_nodes_and_the_driver_read_only() -> None:
    device = chip_device(5, 2)
    assert device.id == "davinci5"
    assert device.device_specs == tuple(DeviceSpec(p, p, "rwm") for p in
                                        ("/dev/davinci5", *SHARED))
    assert device.mounts == (Mount("/usr/local/Ascend/driver", "/usr/local/Ascend/driver",
                                   read_only=True),)
    assert device.properties["ASCEND_VISIBLE_DEVICES"] == "5"
    assert device.properties["ASCEND_CHIP_MODEL"] == "Ascend910B3"
    assert device.properties["ASCEND_MEMORY_MB"] == "65536"
    assert device.extra == {"phy_id": "5", "card_id": "2", "device_index": "0"}


def test_no_driver_mount_when_asked_not_to() -> None:
    assert chip_device(0, 0, AscendDetails(mount_driver=False)).mounts == ()


def test_compose_lists_physical_ids_in_allocation_order() -> None:
    devices = [chip_device(6, 3), chip_device(2, 1), chip_device(3, 1)]
    env = compose(AscendDetails(), devices)
    assert env["ASCEND_VISIBLE_DEVICES"] == "6,2,3"
    # What the chips agree on reaches the container; what differs (their cards) does not.
    assert env["ASCEND_CHIP_MODEL"] == "Ascend910B3"
    assert "ASCEND_CARD_ID" not in env
    # Present and empty, as Huawei's plugin sets it without virtual devices.
    assert env["ASCEND_RUNTIME_OPTIONS"] == ""
    one = handler.compose(AscendDetails(runtime_options=("NODRV",)), devices[:1])
    assert one == {**devices[0].properties, "ASCEND_RUNTIME_OPTIONS": "NODRV"}


@pytest.mark.parametrize("count", [1, 2, 8])
def test_ascend_device_id_is_never_set(count: int) -> None:
    # CANN reads ASCEND_DEVICE_ID as the logical index inside the container (from 0); the
    # second chip of a card (index 1 within it) must not tell a one-chip container "1".
    devices = [to_device(Chip(phy_id=p, card_id=p // 2, device_index=p % 2, logic_id=p),
                         AscendDetails(), shared_present=SHARED, driver_present=True,
                         health=HEALTHY) for p in range(1, count + 1)]
    env = compose(AscendDetails(), devices)
    assert "ASCEND_DEVICE_ID" not in env
    assert env["ASCEND_VISIBLE_DEVICES"] == ",".join(str(p) for p in range(1, count + 1))
    assert devices[0].properties["ASCEND_CHIP_INDEX"] == "1"


# Cards: 0 → chips 0,1; 1 → 2,3; 2 → 4,5,6,7 (chip 0 faulted and not available).
CARDS = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2}


@pytest.mark.parametrize(("available", "must", "size", "expected"), [
    ([1, 2, 3, 4, 5, 6, 7], [], 2, [2, 3]),  # a card with exactly two free, not 1+2
    ([1, 2, 3, 4, 5, 6, 7], [], 1, [1]),  # the single free chip of card 0 (best fit)
    ([1, 2, 3, 4, 5, 6, 7], [], 3, [4, 5, 6]),  # only card 2 fits three
    ([1, 2, 3, 4, 5, 6, 7], [], 6, [4, 5, 6, 7, 2, 3]),  # fullest cards first
    ([1, 2, 3, 4, 5, 6, 7], [5], 2, [5, 4]),  # the card of a must-include chip first
    ([1, 2, 3], [1], 3, [1, 2, 3]),
    ([2, 4], [], 5, [2, 4]),  # fewer available than asked: all of them
])
def test_rank_keeps_chips_on_one_card(available: list[int], must: list[int], size: int,
                                      expected: list[int]) -> None:
    devices = {p: chip_device(p, CARDS[p]) for p in CARDS}
    ranked = rank([devices[p] for p in available], [devices[p] for p in must], size)
    assert [int(d.extra["phy_id"]) for d in ranked] == expected


def test_rank_treats_a_chip_without_card_as_its_own_card() -> None:
    devices = [chip_device(0, None), chip_device(1, None)]
    assert len(rank(devices, [], 2)) == 2


@pytest.mark.parametrize(("model", "family"), [
    ("Ascend910B3", "Ascend910"), ("Ascend910", "Ascend910"), ("Ascend910_9392", "Ascend910"),
    ("Ascend310P3", "Ascend310P"), ("Ascend310", "Ascend310"), ("Ascend310B1", "Ascend310B"),
    ("", ""), ("Tesla", ""),
])
def test_families_are_the_names_huawei_registers(model: str, family: str) -> None:
    assert chip_family(model) == family


def test_chip_names_keep_families_or_models_and_never_drop_unknown_chips() -> None:
    b3 = Chip(phy_id=0, chip_type="Ascend", chip_name="910B3")
    p3 = Chip(phy_id=1, chip_type="Ascend", chip_name="310P3")
    unknown = Chip(phy_id=2)
    assert [wanted(c, ("Ascend910",)) for c in (b3, p3, unknown)] == [True, False, True]
    assert [wanted(c, ("Ascend310P3",)) for c in (b3, p3)] == [False, True]
    assert wanted(p3, ())


def test_node_labels_say_which_chips_and_how_many() -> None:
    devices = [chip_device(p, 0) for p in range(4)]
    assert node_labels(devices) == {
        "edgeplug.io/npu.chip.name": "910B3", "edgeplug.io/npu.chip.count": "4",
        "edgeplug.io/accelerator": "huawei-Ascend910"}
    bare = to_device(Chip(phy_id=9), AscendDetails(), shared_present=SHARED,
                     driver_present=True, health=HEALTHY)
    assert node_labels([*devices, bare]) == {"edgeplug.io/npu.chip.count": "5"}
    assert node_labels([]) == {"edgeplug.io/npu.chip.count": "0"}


def test_node_labels_leave_out_what_a_label_cannot_carry() -> None:
    odd = to_device(Chip(phy_id=0, chip_type="Ascend", chip_name="910B3/x y"), AscendDetails(),
                    shared_present=SHARED, driver_present=True, health=HEALTHY)
    labels = node_labels([odd])
    assert "edgeplug.io/npu.chip.name" not in labels
    assert labels["edgeplug.io/npu.chip.count"] == "1"
    mixed = [chip_device(0, 0), to_device(Chip(phy_id=1, chip_type="Ascend", chip_name="910B4"),
                                          AscendDetails(), shared_present=SHARED,
                                          driver_present=True, health=HEALTHY)]
    assert node_labels(mixed)["edgeplug.io/npu.chip.name"] == "mixed"
    assert node_labels(mixed)["edgeplug.io/accelerator"] == "huawei-Ascend910"


def test_a_chip_name_field_of_garbage_gives_printable_text() -> None:
    import ctypes

    from discovery_handlers.ascend.dcmi import _text

    field = (ctypes.c_ubyte * 32)(*b"910B3\x1b[31m\xff\n" + b"A" * 20)  # no NUL at all
    assert _text(field) == "910B3[31m" + "A" * 20
    assert _text((ctypes.c_ubyte * 32)(*b"310P3\x00junk")) == "310P3"


@pytest.mark.parametrize(("result", "property_value"), [
    (0, "Healthy"),  # DCMI_RDFX_DETECT_OK
    (6, "Healthy"),  # DCMI_RDFX_DETECT_INIT: the check is starting; Huawei counts it healthy
    (1, "Unhealthy (DCMI_RDFX_DETECT_SOCK_FAIL)"),
    (3, "Unhealthy (DCMI_RDFX_DETECT_UNREACH)"),
    (8, "Unhealthy (DCMI_RDFX_DETECT_IP_SET)"),
    (200, "Unhealthy (result 200)"),
    (None, None),  # not read (no 910, or DCMI_ERR_CODE_NOT_SUPPORT): no property
])
def test_roce_network_health_is_a_property_never_a_reason_to_hold_the_chip_back(
        result: int | None, property_value: str | None) -> None:
    chip = Chip(phy_id=1, card_id=0, chip_type="Ascend", chip_name="910B3",
                network_result=result)
    device = to_device(chip, AscendDetails(), shared_present=SHARED, driver_present=True,
                       health=HEALTHY)
    assert device.properties.get("ASCEND_NETWORK_HEALTH") == property_value
    assert device.health.healthy
    if property_value is None or property_value == "Healthy":
        assert device.warning == ""
    else:
        assert device.warning.startswith(
            f"RoCE network unhealthy: dcmi_get_device_network_health gave {result} (")
