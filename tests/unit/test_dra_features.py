"""crds.dra_features: which feature a dropped field stands for, reported once per feature."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from crds import dra_features as f


def _slice(**device: Any) -> dict[str, Any]:
    return {"spec": {"devices": [{"name": "d0", **device}]}}


@pytest.mark.parametrize(("sent", "stored", "dropped"), [
    (_slice(allowMultipleAllocations=True), _slice(allowMultipleAllocations=True), []),
    (_slice(allowMultipleAllocations=True), _slice(), [f.CONSUMABLE_CAPACITY]),
    (_slice(taints=[{"key": "k", "effect": "NoSchedule"}]), _slice(), [f.DEVICE_TAINTS]),
    (_slice(allowMultipleAllocations=True, taints=[{"key": "k"}]), _slice(),
     [f.CONSUMABLE_CAPACITY, f.DEVICE_TAINTS]),
    (_slice(), _slice(), []),
    (_slice(allowMultipleAllocations=True), {"spec": {"devices": []}}, [f.CONSUMABLE_CAPACITY]),
])
def test_a_slice_field_the_api_server_dropped_names_its_gate(
    sent: dict[str, Any], stored: dict[str, Any], dropped: list[str]
) -> None:
    assert f.dropped_by_slice(sent, stored) == dropped


def test_a_device_class_without_its_extended_resource_names_the_gate() -> None:
    sent = {"spec": {"extendedResourceName": "edgeplug.io/cam"}}
    assert f.dropped_by_device_class(sent, {"spec": {}}) == [f.EXTENDED_RESOURCE]
    assert f.dropped_by_device_class(sent, sent) == []
    assert f.dropped_by_device_class({"spec": {}}, {"spec": {}}) == []


def test_each_missing_feature_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    report = f.FeatureReport(logging.getLogger("test.features"))
    for _ in range(3):
        report.note([f.EXTENDED_RESOURCE], what="DeviceClass cam.default.edgeplug.io")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "the API server does not serve DRAExtendedResource (it dropped the field from DeviceClass "
        "cam.default.edgeplug.io): pods asking for an edgeplug.io/ extended resource are served "
        "by device plugins only, never from ResourceSlices"]
    assert report.missing == {f.EXTENDED_RESOURCE}
