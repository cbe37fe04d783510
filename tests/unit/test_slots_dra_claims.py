"""The device plugins leave the slots that ResourceClaims hold (``status.claims``) alone.

A device served both ways (device plugins and DRA) is allocated by two allocators: the kubelets
through the agents' plugins and the kube-scheduler through ResourceSlices. These tests hold the
pure rules (``agent.deviceplugins.slots.rules``, "DRA claims") to what a user counts: how many slots
the kubelets are offered, which ones, and which claims a node may still write.
"""

from __future__ import annotations

from dataclasses import replace

from agent.deviceplugins.slots.rules import (
    Verdict,
    claims_withheld,
    configuration_devices,
    instance_devices,
    judge_claim,
    reservation_plan,
    split_wanted,
)
from crds.instance import Instance, SlotUsage
from tests.harness.slot_instances import NAME, slot_instance

S0, S1, S2, S3 = (f"{NAME}-{i}" for i in range(4))
MINE = SlotUsage.by_node("node-a")


def _healthy(instance: Instance, node: str) -> list[str]:
    return [d.id for d in instance_devices(instance, node, healthy=True) if d.healthy]


def _one_node(capacity: int, *, claims: int, usage: dict[str, str] | None = None) -> Instance:
    slots = [f"{NAME}-{i}" for i in range(capacity)]
    return replace(slot_instance(nodes=("node-a",), capacity=capacity, usage=usage,
                                 reservations=dict.fromkeys(slots, "node-a")), claims=claims)


def test_status_claims_is_read_from_the_instance() -> None:
    obj = {"metadata": {"name": NAME, "namespace": "ns"},
           "spec": {"configurationName": "cam", "capacity": 2},
           "status": {"claims": 2, "servedBy": "both"}}
    assert Instance.from_object(obj).claims == 2
    del obj["status"]
    assert Instance.from_object(obj).claims == 0


def test_a_capacity_one_device_a_claim_holds_is_advertised_unhealthy() -> None:
    free = _one_node(1, claims=0)
    assert _healthy(free, "node-a") == [S0]
    held = replace(free, claims=1)
    assert _healthy(held, "node-a") == []
    assert len(instance_devices(held, "node-a", healthy=True)) == 1  # capacity stays
    vdevs = configuration_devices("cam", [held], "node-a", healthy=[NAME])
    assert [d.healthy for d in vdevs] == [False]
    assert judge_claim(held, S0, MINE) is Verdict.HELD_BY_CLAIMS
    assert judge_claim(free, S0, MINE) is Verdict.CLAIM


def test_capacity_less_device_plugin_use_less_claims_is_offered() -> None:
    # Capacity 4, one slot held by a device-plugin pod of node-a, one claim: 4 - 1 - 1 = 2 free.
    instance = _one_node(4, claims=1, usage={S1: "node-a"})
    assert claims_withheld(instance) == {S3}  # the highest free slot
    assert _healthy(instance, "node-a") == [S0, S1, S2]  # S1 is the pod's, S0 and S2 free
    vdevs = configuration_devices("cam", [instance], "node-a", healthy=[NAME])
    assert sum(d.healthy for d in vdevs) == 2  # the two free ones; S1 is the Instance plugin's
    # Two claims: one free slot left. Claims beyond the free slots withhold them all, and
    # never a slot a pod holds.
    assert _healthy(replace(instance, claims=2), "node-a") == [S0, S1]
    assert _healthy(replace(instance, claims=9), "node-a") == [S1]
    assert judge_claim(replace(instance, claims=9), S1, MINE) is Verdict.HELD_ALREADY


def test_a_claim_of_a_withheld_slot_is_refused_and_of_another_allowed() -> None:
    instance = _one_node(3, claims=1)
    assert judge_claim(instance, S2, MINE) is Verdict.HELD_BY_CLAIMS
    assert judge_claim(instance, S0, MINE) is Verdict.CLAIM
    assert Verdict.HELD_BY_CLAIMS.refused
    assert not Verdict.CLAIM.refused
    # An unreserved withheld slot is refused too (not "reserve and claim").
    unreserved = replace(instance, reservations={})
    assert judge_claim(unreserved, S2, MINE) is Verdict.HELD_BY_CLAIMS
    assert judge_claim(unreserved, S0, MINE) is Verdict.RESERVE_AND_CLAIM
    # Reserved elsewhere still says so first.
    elsewhere = replace(slot_instance(capacity=3, reservations={S2: "node-b"}), claims=1)
    assert judge_claim(elsewhere, S2, MINE) is Verdict.RESERVED_ELSEWHERE


def test_two_nodes_together_are_offered_free_slots_less_claims() -> None:
    base = slot_instance(capacity=4, reservations={S0: "node-a", S1: "node-b", S2: "node-a",
                                                   S3: "node-b"})
    for claims in range(6):
        instance = replace(base, claims=claims)
        offered = set(_healthy(instance, "node-a")) | set(_healthy(instance, "node-b"))
        assert len(offered) == max(0, 4 - claims), claims
        assert not offered & claims_withheld(instance)


def test_withheld_slots_are_not_counted_as_movable_or_released_for_others() -> None:
    # One claim on a capacity-2 device, both slots reserved for node-b: node-a's pods asking
    # for the Configuration's resource can be served by one slot at most.
    instance = replace(slot_instance(capacity=2, reservations={S0: "node-b", S1: "node-b"}),
                       claims=1)
    assert split_wanted([instance], "node-a", by_instance={}, by_configuration=2) == {NAME: 1}
    # node-b keeps the withheld reservation (it is not spare), and gives the free one to
    # node-a's demand.
    demanded = replace(instance, demand={"node-a": 1})
    assert reservation_plan(demanded, "node-b").release == (S0,)


def test_no_claims_change_nothing() -> None:
    instance = slot_instance(capacity=2, reservations={S0: "node-a"}, usage={S1: "node-b"})
    assert claims_withheld(instance) == frozenset()
    assert _healthy(instance, "node-a") == [S0]
    assert judge_claim(instance, S0, MINE) is Verdict.CLAIM
