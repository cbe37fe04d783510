"""What a pass writes of this node's reservations, and when the loop runs: pure decisions,
over tables (agent.deviceplugins.slots.reservations, agent.deviceplugins.slots.schedule,
agent.deviceplugins.slots.rules)."""

from __future__ import annotations

import pytest

from agent.deviceplugins.slots import schedule
from agent.deviceplugins.slots.reservations import held_here, move_for, without_release
from agent.deviceplugins.slots.rules import ReservationPlan, served_by_plugins
from agent.settings import SlotSettings
from crds.configuration import Allocator
from crds.instance import SlotUsage
from tests.harness.slot_instances import NAME, slot_instance

A, B = "node-a", "node-b"
S0, S1 = f"{NAME}-0", f"{NAME}-1"

#: The slot timings the loop uses by default.
SLOTS = SlotSettings()


@pytest.mark.parametrize(("what", "instance", "wanted", "reserve_only", "expected"), [
    ("a fresh device: each node reserves its fair share",
     slot_instance(), 0, False, ReservationPlan(reserve=(S0,))),
    ("already reserved, no demand: nothing to write",
     slot_instance(reservations={S0: A}), 0, False, None),
    ("a pinned pod wants a slot the other node has: demand published",
     slot_instance(reservations={S0: A, S1: B}, usage={S1: B}), 2, False,
     ReservationPlan(demand=1)),
    ("the demand already published: nothing to write",
     slot_instance(reservations={S0: A, S1: B}, usage={S1: B}, demand={A: 1}), 2, False, None),
    ("before its plugin starts: reservations only, the published demand kept",
     slot_instance(demand={A: 3}), 0, True, ReservationPlan(reserve=(S0,), demand=3)),
    ("before its plugin starts, nothing to reserve: nothing",
     slot_instance(reservations={S0: A}), 0, True, None),
    ("before its plugin starts, a pinned pod wants both: both reserved",
     slot_instance(reservations={S0: A}), 2, True, ReservationPlan(reserve=(S1,))),
    ("another node waits: a free fair-share slot of the other node is released",
     slot_instance(reservations={S0: A, S1: A}, demand={B: 1}), 0, False,
     ReservationPlan(release=(S1,))),
    ("a node not listed moves nothing",
     slot_instance(nodes=(B,)), 0, False, None),
])
def test_what_a_pass_writes(what: str, instance: object, wanted: int, reserve_only: bool,
                            expected: ReservationPlan | None) -> None:
    assert move_for(instance, A, wanted=wanted, hold=False,  # type: ignore[arg-type]
                    reserve_only=reserve_only) == expected, what


def test_a_release_refused_leaves_the_rest_or_nothing() -> None:
    instance = slot_instance(reservations={S0: A, S1: A}, demand={B: 1})
    assert without_release(ReservationPlan(release=(S1,)), instance, A) is None
    assert without_release(ReservationPlan(reserve=(S0,), release=(S1,)), instance, A) == (
        ReservationPlan(reserve=(S0,)))
    assert without_release(ReservationPlan(release=(S1,), demand=1), instance, A) == (
        ReservationPlan(demand=1))


def test_the_slots_a_node_holds() -> None:
    instance = slot_instance(usage={S0: A, S1: B})
    assert held_here(instance, A) == {S0: SlotUsage.by_node(A)}
    assert held_here(slot_instance(), A) == {}


@pytest.mark.parametrize(("nodes", "present", "allocator", "dra", "expected"), [
    ((A,), True, Allocator.DEVICE_PLUGIN, False, True),
    ((A,), True, Allocator.DEVICE_PLUGIN, True, True),
    ((A,), True, Allocator.DRA, True, False),
    ((A,), True, Allocator.DRA, False, False),  # served to nobody (logged)
    ((A,), True, None, True, False),  # undecided: a DRA agent waits
    ((A,), True, None, False, True),  # undecided: served the only way it can
    ((A,), False, Allocator.DEVICE_PLUGIN, False, False),  # not found here
    ((B,), True, Allocator.DEVICE_PLUGIN, False, False),  # not listing this node
])
def test_which_instances_device_plugins_serve(nodes: tuple[str, ...], present: bool,
                                              allocator: Allocator | None, dra: bool,
                                              expected: bool) -> None:
    assert served_by_plugins(slot_instance(nodes=nodes), A, present=present,
                             allocator=allocator, dra=dra) is expected


@pytest.mark.parametrize(("state", "awaited", "expected"), [
    (schedule.PassSchedule(), False, 300.0),  # at rest: the resync only
    (schedule.PassSchedule(retry=True, holding=True), False, SLOTS.retry_s),
    (schedule.PassSchedule(holding=True), False, SLOTS.sweep_s),
    (schedule.PassSchedule(holding=True), True, SLOTS.sweep_awaited_s),
    (schedule.PassSchedule(sweep_owed=True, last_sweep=99.9), False,
     pytest.approx(SLOTS.sweep_awaited_s - 0.1)),
    (schedule.PassSchedule(sweep_owed=True, last_sweep=0.0), False, 0.0),
])
def test_how_long_the_loop_sleeps(state: schedule.PassSchedule, awaited: bool,
                                  expected: float) -> None:
    assert state.idle_seconds(100.0, 300.0, awaited=awaited) == expected


def test_a_pass_right_after_a_sweep_leaves_its_own_to_the_loop() -> None:
    plan = schedule.PassSchedule()
    plan.swept(10.0, holding=True)
    assert not plan.sweep_after_pass(10.0 + SLOTS.sweep_awaited_s / 2, can_sweep=True)
    assert plan.sweep_owed
    assert plan.sweep_after_pass(10.0 + SLOTS.sweep_awaited_s, can_sweep=True)
    without_pod_resources = schedule.PassSchedule(last_sweep=10.0)
    assert not without_pod_resources.sweep_after_pass(10.0, can_sweep=False)
    assert not without_pod_resources.sweep_owed
