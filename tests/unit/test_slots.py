"""The slot rules: what a node advertises, reserves, releases and may claim.

These are pure functions over ``Instance`` views; the last test plays two agents against one
object (applying each one's plan to the other's result, as resourceVersion-serialised writes
would) to show they converge without ever reserving or holding a slot twice.
"""

from __future__ import annotations

from dataclasses import replace

from agent.deviceplugins.slots.rules import (
    Verdict,
    available_slots,
    configuration_devices,
    instance_devices,
    judge_claim,
    preferred_node,
    reservation_plan,
)
from agent.discovery.container_devices import broker_envs
from crds.instance import Instance, SlotUsage
from tests.harness.slot_instances import NAME, slot_instance


def _healthy(devices: list) -> list[str]:  # type: ignore[type-arg]
    return [d.id for d in devices if d.healthy]


def test_fair_share_gives_each_listed_node_its_slots_whatever_the_order() -> None:
    assert [preferred_node(i, ["b", "a"]) for i in range(4)] == ["a", "b", "a", "b"]
    assert preferred_node(0, []) is None


def test_a_node_advertises_only_slots_reserved_for_it_or_held_by_it() -> None:
    instance = slot_instance(
        capacity=4,
        reservations={f"{NAME}-0": "node-a", f"{NAME}-1": "node-b", f"{NAME}-2": "node-a"},
        usage={f"{NAME}-2": "node-a", f"{NAME}-3": "node-b"},
    )
    assert _healthy(instance_devices(instance, "node-a", healthy=True)) == [
        f"{NAME}-0",
        f"{NAME}-2",
    ]
    assert _healthy(instance_devices(instance, "node-b", healthy=True)) == [
        f"{NAME}-1",
        f"{NAME}-3",
    ]
    assert len(instance_devices(instance, "node-a", healthy=True)) == 4  # capacity stays
    assert _healthy(instance_devices(instance, "node-a", healthy=False)) == []


def test_reservations_of_nodes_no_longer_listed_are_ignored() -> None:
    instance = slot_instance(
        nodes=("node-a",), reservations={f"{NAME}-0": "gone", f"{NAME}-1": "gone"}
    )
    assert reservation_plan(instance, "node-a").reserve == (f"{NAME}-0", f"{NAME}-1")


def test_a_node_releases_free_slots_the_rule_gives_to_another_node_but_never_used_ones() -> None:
    instance = slot_instance(
        capacity=3,
        reservations={f"{NAME}-0": "node-a", f"{NAME}-1": "node-a", f"{NAME}-2": "node-a"},
        usage={f"{NAME}-1": "node-a"},
    )
    plan = reservation_plan(instance, "node-a")
    assert plan.release == ()  # slot 1 is node-b's by the rule, but node-a uses it
    assert plan.reserve == ()
    freed = replace(instance, spec=replace(instance.spec, device_usage={}))
    assert reservation_plan(freed, "node-a").release == (f"{NAME}-1",)


def test_claim_verdicts() -> None:
    instance = slot_instance(
        capacity=4,
        reservations={f"{NAME}-0": "node-a", f"{NAME}-1": "node-b"},
        usage={f"{NAME}-2": "C:cam-v0:node-b"},
    )
    mine = SlotUsage.by_node("node-a")
    assert judge_claim(instance, f"{NAME}-0", mine) is Verdict.CLAIM
    assert judge_claim(instance, f"{NAME}-1", mine) is Verdict.RESERVED_ELSEWHERE
    assert judge_claim(instance, f"{NAME}-2", mine) is Verdict.HELD_ELSEWHERE
    assert judge_claim(instance, f"{NAME}-3", mine) is Verdict.RESERVE_AND_CLAIM
    assert judge_claim(instance, f"{NAME}-4", mine) is Verdict.UNKNOWN
    assert judge_claim(instance, "other-0", mine) is Verdict.UNKNOWN
    vdev = SlotUsage.by_configuration("cam-v0", "node-b")
    assert judge_claim(instance, f"{NAME}-2", vdev) is Verdict.HELD_ALREADY


def test_envs_carry_each_property_plain_and_with_the_instance_hash() -> None:
    assert broker_envs(NAME, {"UDEV_DEVNODE": "/dev/video0"}) == {
        "UDEV_DEVNODE": "/dev/video0",
        "UDEV_DEVNODE_1A2B3C": "/dev/video0",
    }
    # A fallback name (crds.naming.fallback_instance_name) keeps the device's digest.
    for name in ("cam-1a2b3c.node-b", "ca-9f9f--1a2b3c.node-b.example"):
        assert broker_envs(name, {"P": "v"}) == {"P": "v", "P_1A2B3C": "v"}


def test_configuration_devices_follow_available_and_held_slots_with_stable_ids() -> None:
    one = slot_instance(
        name="cam-aaaaaa",
        nodes=("node-a",),
        reservations={"cam-aaaaaa-0": "node-a", "cam-aaaaaa-1": "node-a"},
        usage={"cam-aaaaaa-1": "C:cam-v1:node-a"},
    )
    two = slot_instance(
        name="cam-bbbbbb", nodes=("node-a",), reservations={"cam-bbbbbb-0": "node-a"}
    )
    devices = configuration_devices(
        "cam", [one, two], "node-a", healthy=["cam-aaaaaa", "cam-bbbbbb"]
    )
    assert [d.id for d in devices] == ["cam-v0", "cam-v1", "cam-v2", "cam-v3"]
    # v1 is held; two more slots (aaaaaa-0, bbbbbb-0) are available: v0 and v2.
    assert _healthy(devices) == ["cam-v0", "cam-v1", "cam-v2"]
    # An unhealthy Instance contributes no available slots.
    assert _healthy(configuration_devices("cam", [one, two], "node-a", healthy=["cam-aaaaaa"])) == [
        "cam-v0",
        "cam-v1",
    ]
    # Available slots alternate between Instances, so multi-device requests spread out.
    assert [r.instance for r in available_slots([one, two], "node-a")] == [
        "cam-aaaaaa",
        "cam-bbbbbb",
    ]


def _apply(instance: Instance, node: str) -> Instance:
    plan = reservation_plan(instance, node)
    reservations = dict(instance.reservations)
    for slot in plan.reserve:
        reservations[slot] = node
    for slot in plan.release:
        reservations.pop(slot)
    return replace(instance, reservations=reservations)


def test_two_agents_converge_to_disjoint_fair_shares() -> None:
    # node-b first grabbed everything while alone; then node-a joined the Instance.
    instance = slot_instance(nodes=("node-b",), capacity=3, usage={f"{NAME}-0": "node-b"})
    for _ in range(2):
        instance = _apply(instance, "node-b")
    instance = replace(instance, spec=replace(instance.spec, nodes=("node-a", "node-b")))
    for _ in range(4):
        instance = _apply(_apply(instance, "node-a"), "node-b")
    assert reservation_plan(instance, "node-a") == reservation_plan(instance, "node-b")  # empty
    a = set(_healthy(instance_devices(instance, "node-a", healthy=True)))
    b = set(_healthy(instance_devices(instance, "node-b", healthy=True)))
    assert not a & b, "a slot advertised by both nodes"
    # Slot 0 stays with its user node-b although the rule gives it to node-a; slot 2 is node-a's.
    assert b == {f"{NAME}-0", f"{NAME}-1"}
    assert a == {f"{NAME}-2"}
