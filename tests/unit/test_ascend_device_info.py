"""The device-info ConfigMap's bytes, pinned to what Huawei's own code accepted.

The data below (five chips: free, held, separated with an unknown code, network-down with a
NotHandleFault code, unhealthy without codes) was checked with Huawei's device plugin's package
(tests/harness/huawei_device_info: its ``NodeDeviceInfoCache`` and ``DeviceFault`` decode it
with no unknown field, its ``MakeDataHash`` gives the ``CheckCode`` written, and its
``json.Marshal`` gives back the very bytes; which version: docs/handlers/ascend.md, "Volcano's
view of the chips"); the Node annotation's bytes decode into its ``NpuBaseInfo`` map and
re-encode the same. The digests and strings pin those bytes.
"""

from __future__ import annotations

import hashlib
import json

from discovery_handlers.ascend.device_info import (
    ChipView,
    check_code,
    configmap_data,
    device_list,
    go_json,
    node_annotation,
)
from discovery_handlers.ascend.faults import chip_health, default_table, faults_of

#: What Huawei's code accepted: the CheckCode, and the SHA-256 of the whole DeviceInfoCfg.
CHECK_CODE = "67af550c65dfaa80b4d1fd13669040ab5a77444de36138e7bbc25d33a7dd4c4d"
DEVICE_INFO_CFG_SHA256 = "0bbbddfc5d9ec3fbaa5519c5404af93b5339cfa01b0789c022ea202b1eafa43f"


def _sample() -> dict[str, str]:
    table = default_table()
    chips = [
        ChipView(0, True),
        ChipView(1, True, held=True),
        ChipView(2, False,
                 faults=faults_of(chip_health((0x80E3A201, 0x80E21007, 0x12345678), table))),
        ChipView(3, True, network_healthy=False,
                 faults=faults_of(chip_health((0x80E21007,), table))),
        ChipView(10, False),
    ]
    lists = device_list("Ascend910", chips, {(2, 0x80E3A201): 1765000000123})
    return configmap_data(lists, 1765000000)


def test_the_bytes_huaweis_code_accepted() -> None:
    data = _sample()
    cache = json.loads(data["DeviceInfoCfg"])
    assert cache["CheckCode"] == CHECK_CODE
    assert hashlib.sha256(data["DeviceInfoCfg"].encode()).hexdigest() == DEVICE_INFO_CFG_SHA256
    assert data["ManuallySeparateNPU"] == ""
    assert data["UpgradeFaultReason"] == "{}"


def test_lists_sort_chip_names_as_strings_and_keep_held_chips_out() -> None:
    lists = device_list("Ascend910", [ChipView(10, True), ChipView(2, True),
                                      ChipView(3, True, held=True)], {})
    assert lists["huawei.com/Ascend910"] == "Ascend910-10,Ascend910-2"
    assert lists["huawei.com/Ascend910-Fault"] == "[]"


def test_310_faults_go_under_huaweis_310p_key() -> None:
    lists = device_list("Ascend310", [ChipView(0, False)], {})
    assert set(lists) == {"huawei.com/Ascend310", "huawei.com/Ascend310-Unhealthy",
                          "huawei.com/Ascend310P-Fault"}


def test_go_escapes_html_characters_as_go_does() -> None:
    assert go_json({"a": "<&>"}) == '{"a":"\\u003c\\u0026\\u003e"}'
    assert check_code({"DeviceList": {}, "UpdateTime": 1}) == hashlib.sha256(
        b'{"DeviceList":{},"UpdateTime":1}').hexdigest()


def test_the_node_annotation_huaweis_code_accepted() -> None:
    chips = [("Ascend910", ChipView(0, True, ip="192.168.100.10")),
             ("Ascend910", ChipView(1, False)),
             ("Ascend910", ChipView(10, True, ip="fe80::1<&>"))]
    assert node_annotation(chips) == (
        '{"Ascend910-0":{"IP":"192.168.100.10","SuperDeviceID":0},'
        '"Ascend910-1":{"IP":"","SuperDeviceID":0},'
        '"Ascend910-10":{"IP":"fe80::1\\u003c\\u0026\\u003e","SuperDeviceID":0}}')
