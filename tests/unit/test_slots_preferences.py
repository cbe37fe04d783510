"""The device-plugin backends' preferred orderings, over tables
(agent.deviceplugins.slots.preferences)."""

from __future__ import annotations

import pytest

from agent.deviceplugins.slots.preferences import configuration_preference, instance_preference
from agent.deviceplugins.slots.rules import SlotRef


@pytest.mark.parametrize(("available", "must", "size", "held", "expected"), [
    (["a", "b", "c"], [], 2, set(), ["a", "b"]),
    (["a", "b", "c"], [], 2, {"c"}, ["c", "a"]),
    (["a", "b", "c"], ["b"], 2, {"c"}, ["b", "c"]),
    (["a", "b", "c"], ["a", "b"], 1, set(), ["a", "b"]),
])
def test_an_instance_prefers_required_then_held_slots(
        available: list[str], must: list[str], size: int, held: set[str],
        expected: list[str]) -> None:
    assert instance_preference(available, must, size, held) == expected


def _ref(instance: str) -> SlotRef:
    return SlotRef("ns", instance, f"{instance}-0")


@pytest.mark.parametrize(("available", "must", "size", "held", "expected"), [
    (["v1", "v2", "v3"], [], 2, {}, ["v1", "v2"]),
    (["v1", "v2", "v3"], [], 2, {"v3": _ref("i1")}, ["v3", "v1"]),
    # Held ids on an Instance the required ones do not use come first.
    (["v1", "v2", "v3"], ["v1"], 2, {"v1": _ref("i1"), "v2": _ref("i1"), "v3": _ref("i2")},
     ["v1", "v3"]),
    (["v1", "v2", "v3"], ["v1"], 3, {"v1": _ref("i1"), "v2": _ref("i1"), "v3": _ref("i2")},
     ["v1", "v3", "v2"]),
])
def test_a_configuration_prefers_held_ids_on_distinct_instances(
        available: list[str], must: list[str], size: int, held: dict[str, SlotRef],
        expected: list[str]) -> None:
    assert configuration_preference(available, must, size, held) == expected
