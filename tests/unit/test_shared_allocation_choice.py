"""The controller's choice of allocator for a Configuration's shared devices
(``controller.dra.shared_allocation``): what it writes to the status, and when it writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.dra import shared_allocation as sa
from crds.configuration import Allocator, allocator_of

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
LATER = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
MISSING = sa.NO_EXTENDED_RESOURCES


def test_the_cluster_decides_where_the_spec_does_not() -> None:
    assert sa.decide(None, missing=None).mode == Allocator.DRA
    fallback = sa.decide(None, missing=MISSING)
    assert (fallback.mode, fallback.ok, fallback.reason) == (
        Allocator.DEVICE_PLUGIN, True, sa.REASON_UNAVAILABLE)
    assert MISSING[1] in fallback.message


def test_a_pin_to_device_plugins_holds_on_any_cluster() -> None:
    for missing in (None, MISSING):
        chosen = sa.decide(Allocator.DEVICE_PLUGIN, missing=missing)
        assert (chosen.mode, chosen.ok, chosen.reason) == (
            Allocator.DEVICE_PLUGIN, True, sa.REASON_CHOSEN)


def test_asking_for_dra_without_it_is_a_false_condition_and_the_compatible_way() -> None:
    asked = sa.decide(Allocator.DRA, missing=MISSING)
    assert (asked.mode, asked.ok) == (Allocator.DEVICE_PLUGIN, False)
    assert asked.message.startswith("spec.allocator is dra, but ")
    no_api = sa.decide(Allocator.DRA, missing=sa.NO_RESOURCE_API)
    assert no_api.reason == sa.REASON_NO_API
    off = sa.decide(None, missing=sa.CONTROLLER_WITHOUT_DRA)
    assert (off.mode, off.ok, off.reason) == (
        Allocator.DEVICE_PLUGIN, True, sa.REASON_CONTROLLER_WITHOUT_DRA)


def test_an_unchanged_choice_keeps_its_transition_time_and_is_not_written_again() -> None:
    decision = sa.decide(None, missing=None)
    first = sa.status_patch("ns", "cams", decision, generation=3, current=None, now=NOW)
    status = first["status"]
    assert status["allocator"] == status["sharedDeviceAllocation"] == "dra"
    assert sa.is_current(status, decision)
    again = sa.status_patch("ns", "cams", decision, generation=4, current=status, now=LATER)
    assert (again["status"]["conditions"][0]["lastTransitionTime"]
            == status["conditions"][0]["lastTransitionTime"])
    other = sa.decide(None, missing=MISSING)
    assert not sa.is_current(status, other)
    moved = sa.status_patch("ns", "cams", other, generation=4, current=status, now=LATER)
    assert moved["status"]["allocator"] == "devicePlugin"


def test_the_agents_read_the_spec_first_then_the_status() -> None:
    assert allocator_of({}) is None
    assert allocator_of({"status": {"sharedDeviceAllocation": "dra"}}) == (
        Allocator.DRA)
    assert allocator_of({"spec": {"sharedDeviceAllocation": "devicePlugin"},
                                     "status": {"sharedDeviceAllocation": "dra"}}) == (
        Allocator.DEVICE_PLUGIN)
    assert allocator_of({"status": {"sharedDeviceAllocation": "bogus"}}) is None
    assert allocator_of({"spec": {"allocator": "dra"},
                         "status": {"allocator": "devicePlugin"}}) == Allocator.DRA
    assert allocator_of({"status": {"allocator": "devicePlugin",
                                    "sharedDeviceAllocation": "dra"}}) == (
        Allocator.DEVICE_PLUGIN)
