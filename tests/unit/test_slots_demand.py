"""Demand steers reservations: the pure rules, and what counts as a pod pinned to this node.

Like tests/unit/test_slots.py, the convergence test plays two agents against one object,
applying each one's plan (reservations and its demand in one write) to the other's result, as
resourceVersion-serialised writes would.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest
from lightkube import AsyncClient
from lightkube.models.core_v1 import PodSpec
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.crossnode.demand import (
    BOUND,
    TARGETED,
    PendingPods,
    extended_requests,
    instance_needs,
    pinned_node,
)
from agent.deviceplugins.slots.rules import instance_devices, reservation_plan, split_wanted
from crds.instance import Instance
from crds.pinning import format_pinned_demand, parse_pinned_demand
from tests.harness.slot_instances import NAME, slot_instance

S0, S1, S2, S3 = (f"{NAME}-{i}" for i in range(4))


def test_a_node_with_demand_reserves_a_free_slot_before_its_fair_share_owner() -> None:
    instance = slot_instance(usage={S0: "node-a"}, reservations={S0: "node-a"})
    plan = reservation_plan(instance, "node-a", wanted=1)
    assert plan.reserve == (S1,)
    assert plan.demand == 0, "the reservation meets the demand, written in the same patch"
    # node-b, seeing node-a's published demand, leaves the slot alone although fair share
    # gives it slot 1.
    demanded = replace(instance, demand={"node-a": 1})
    assert reservation_plan(demanded, "node-b").reserve == ()
    # Without demand, the fair-share owner reserves it, as before.
    assert reservation_plan(instance, "node-b").reserve == (S1,)
    assert reservation_plan(instance, "node-a").reserve == ()


def test_unmet_demand_is_what_available_slots_do_not_cover() -> None:
    instance = slot_instance(reservations={S0: "node-a", S1: "node-b"})
    assert reservation_plan(instance, "node-a", wanted=1).demand == 0  # slot 0 is available
    assert reservation_plan(instance, "node-a", wanted=2).demand == 1
    # The whole shortfall, even beyond what is free now: slots in use may come free later.
    assert reservation_plan(instance, "node-a", wanted=3).demand == 2


def test_an_idle_reservation_moves_to_a_node_with_demand_but_never_a_used_or_needed_one() -> None:
    instance = slot_instance(
        usage={S0: "node-a"}, reservations={S0: "node-a", S1: "node-b"}, demand={"node-a": 1}
    )
    assert reservation_plan(instance, "node-b").release == (S1,)
    # A pod bound to node-b that has not started may be being admitted with slot 1: keep it.
    assert reservation_plan(instance, "node-b", hold=True).release == ()
    # node-b's own pinned pod wants it: keep it.
    assert reservation_plan(instance, "node-b", wanted=1).release == ()
    # Used slots are never released; demand of a node no longer listed counts for nothing.
    used = replace(instance, spec=replace(instance.spec, device_usage={S0: "a", S1: "node-b"}))
    assert reservation_plan(used, "node-b").release == ()
    unlisted = replace(instance, demand={"gone": 1})
    assert reservation_plan(unlisted, "node-b").release == ()


def test_a_holder_gives_back_only_as_many_slots_as_others_need() -> None:
    instance = slot_instance(
        capacity=4,
        usage={S0: "node-a", S2: "node-a"},
        reservations={S0: "node-a", S1: "node-b", S2: "node-a", S3: "node-b"},
        demand={"node-a": 1},
    )
    assert reservation_plan(instance, "node-b").release == (S3,)
    # A free unreserved slot meets the demand first: nothing to give back.
    spare = replace(instance, reservations={S0: "node-a", S1: "node-b", S2: "node-a"})
    assert reservation_plan(spare, "node-b").release == ()
    assert reservation_plan(spare, "node-b").reserve == ()
    # node-a's own demand comes from its pinned pods now, not from what it published.
    assert reservation_plan(spare, "node-a", wanted=1).reserve == (S3,)


def test_without_demand_a_slot_reserved_for_demand_returns_to_its_fair_share_owner() -> None:
    # node-a got slot 1 for a pod that has gone; nobody needs it now.
    instance = slot_instance(usage={S0: "node-a"}, reservations={S0: "node-a", S1: "node-a"})
    assert reservation_plan(instance, "node-a", wanted=1).release == ()
    assert reservation_plan(instance, "node-a").release == (S1,)


def _apply(instance: Instance, node: str, wanted: int) -> Instance:
    plan = reservation_plan(instance, node, wanted=wanted)
    reservations = dict(instance.reservations)
    for slot in plan.reserve:
        reservations[slot] = node
    for slot in plan.release:
        reservations.pop(slot)
    demand = {**instance.demand, node: plan.demand}
    published = {n: d for n, d in demand.items() if d}
    return replace(instance, reservations=reservations, demand=published)


def test_two_agents_move_the_idle_slot_to_the_waiting_node_and_settle() -> None:
    instance = slot_instance(usage={S0: "node-a"})
    for _ in range(2):
        instance = _apply(_apply(instance, "node-a", 0), "node-b", 0)
    assert instance.reservations == {S0: "node-a", S1: "node-b"}
    # A second pod pinned to node-a waits: the slot moves over within a few rounds.
    for _ in range(4):
        instance = _apply(_apply(instance, "node-a", 1), "node-b", 0)
        a = {d.id for d in instance_devices(instance, "node-a", healthy=True) if d.healthy}
        b = {d.id for d in instance_devices(instance, "node-b", healthy=True) if d.healthy}
        assert not a & b, "a slot advertised by both nodes"
    assert instance.reservations == {S0: "node-a", S1: "node-a"}
    assert instance.demand == {}
    assert not reservation_plan(instance, "node-a", wanted=1)
    assert not reservation_plan(instance, "node-b")


def test_configuration_requests_use_available_slots_first_then_movable_ones() -> None:
    one = slot_instance(name="cam-aaaaaa", reservations={"cam-aaaaaa-0": "node-a"})
    two = slot_instance(name="cam-bbbbbb", reservations={"cam-bbbbbb-0": "node-b"})
    # One request: slot aaaaaa-0 is already available to node-a.
    assert split_wanted([two, one], "node-a", by_instance={}, by_configuration=1) == {
        "cam-aaaaaa": 1,
        "cam-bbbbbb": 0,
    }
    # Three: one available, then free slots that could move here, Instances in name order.
    assert split_wanted([two, one], "node-a", by_instance={}, by_configuration=3) == {
        "cam-aaaaaa": 2,
        "cam-bbbbbb": 1,
    }
    # An Instance-level request takes its own Instance's available slot first.
    assert split_wanted(
        [one, two], "node-a", by_instance={"cam-aaaaaa": 1}, by_configuration=1
    ) == {"cam-aaaaaa": 2, "cam-bbbbbb": 0}


def _spec(**fields: object) -> PodSpec:
    return cast(PodSpec, PodSpec.from_dict({"containers": [{"name": "main"}], **fields}))


def _affinity(*terms: dict[str, object]) -> dict[str, object]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def _in(key: str, *values: str) -> dict[str, object]:
    return {"key": key, "operator": "In", "values": list(values)}


def test_pinned_pods_are_those_that_can_run_on_one_node_only() -> None:
    assert pinned_node(_spec(nodeSelector={"kubernetes.io/hostname": "n1"})) == "n1"
    by_name = _affinity({"matchFields": [_in("metadata.name", "n1")]})
    assert pinned_node(_spec(affinity=by_name)) == "n1"
    by_label = _affinity({"matchExpressions": [_in("kubernetes.io/hostname", "n1")]})
    assert pinned_node(_spec(affinity=by_label)) == "n1"
    same = _affinity(
        {"matchFields": [_in("metadata.name", "n1")]},
        {"matchExpressions": [_in("kubernetes.io/hostname", "n1")]},
    )
    assert pinned_node(_spec(affinity=same)) == "n1"
    # Not pinned: two candidate nodes, other terms, other keys, no constraint.
    two = _affinity({"matchFields": [_in("metadata.name", "n1", "n2")]})
    assert pinned_node(_spec(affinity=two)) is None
    either = _affinity(
        {"matchFields": [_in("metadata.name", "n1")]},
        {"matchFields": [_in("metadata.name", "n2")]},
    )
    assert pinned_node(_spec(affinity=either)) is None
    zone = _affinity({"matchExpressions": [_in("topology.kubernetes.io/zone", "z1")]})
    assert pinned_node(_spec(affinity=zone)) is None
    assert pinned_node(_spec(nodeSelector={"disk": "ssd"})) is None
    assert pinned_node(_spec()) is None


def test_extended_requests_sum_containers_and_cover_the_largest_init_container() -> None:
    spec = cast(PodSpec, PodSpec.from_dict(
        {
            "containers": [
                {"name": "a", "resources": {"limits": {"edgeplug.io/cam": "1", "cpu": "2"}}},
                {"name": "b", "resources": {"requests": {"edgeplug.io/cam": "1"}}},
                {"name": "c"},
            ],
            "initContainers": [
                {"name": "i", "resources": {"limits": {"edgeplug.io/cam": "3", "x.io/y": "1"}}}
            ],
        }
    ))
    assert extended_requests(spec) == {"edgeplug.io/cam": 3, "x.io/y": 1}


def test_pod_requests_become_per_instance_wants_and_holds() -> None:
    one = slot_instance(name="cam-aaaaaa", reservations={"cam-aaaaaa-0": "node-a"})
    two = slot_instance(name="cam-bbbbbb")
    other = replace(
        slot_instance(name="mic-cccccc"), spec=replace(one.spec, configuration_name="mic")
    )
    served = {("ns", i.name): i for i in (one, two, other)}
    wanted, holding = instance_needs(
        served,
        "node-a",
        config_resources={("ns", "cam"): "edgeplug.io/cam", ("ns", "mic"): "example.com/mic"},
        wanted={"edgeplug.io/cam-bbbbbb": 1, "edgeplug.io/cam": 1},
        starting={"example.com/mic": 1},
    )
    assert wanted == {("ns", "cam-aaaaaa"): 1, ("ns", "cam-bbbbbb"): 1, ("ns", "mic-cccccc"): 0}
    assert holding == {("ns", "mic-cccccc")}


def _pod(uid: str, *, node_name: str = "", phase: str = "Pending", pin: str = "n1") -> Pod:
    spec = {
        "nodeName": node_name or None,
        "nodeSelector": {"kubernetes.io/hostname": pin},
        "containers": [{"name": "m", "resources": {"limits": {"edgeplug.io/cam": "1"}}}],
    }
    obj = {"metadata": {"uid": uid}, "spec": spec, "status": {"phase": phase}}
    return cast(Pod, Pod.from_dict(obj))


def test_a_pinned_pod_counts_as_wanted_then_starting_with_no_gap_between() -> None:
    changes: list[int] = []
    # The watch itself runs in tests/integration/test_slot_demand.py; here its events are fed in.
    unused = cast(AsyncClient, None)
    pods = PendingPods(client=unused, node="n1", on_change=lambda: changes.append(1))
    pods.update(_pod("u1"))
    pods.update(_pod("u2", pin="n2"))  # pinned elsewhere: not ours
    assert (pods.wanted(), pods.starting()) == ({"edgeplug.io/cam": 1}, {})
    pods.update(_pod("u1", node_name="n1"))  # its binding: one event moves it
    assert (pods.wanted(), pods.starting()) == ({}, {"edgeplug.io/cam": 1})
    pods.update(_pod("u1", node_name="n1", phase="Running"))
    assert (pods.wanted(), pods.starting()) == ({}, {})
    pods.update(_pod("u3"))
    pods.update(_pod("u3"), deleted=True)
    assert (pods.wanted(), pods.starting()) == ({}, {})
    assert len(changes) == 5


def test_pods_bound_here_hold_labelled_or_not_and_a_pod_in_both_streams_counts_once() -> None:
    unused = cast(AsyncClient, None)
    pods = PendingPods(client=unused, node="n1")
    # A user's pod, unlabelled: only the bound stream sees it, once the scheduler bound it.
    pods.update(_pod("user", node_name="n1"), stream=BOUND)
    assert (pods.wanted(), pods.starting()) == ({}, {"edgeplug.io/cam": 1})
    # A broker: the labelled stream sees it unscheduled, then bound; the bound stream too.
    pods.update(_pod("broker"), stream=TARGETED)
    assert pods.wanted() == {"edgeplug.io/cam": 1}
    pods.update(_pod("broker", node_name="n1"), stream=BOUND)  # bound stream first: no gap
    assert (pods.wanted(), pods.starting()) == ({}, {"edgeplug.io/cam": 2})
    pods.update(_pod("broker", node_name="n1"), stream=TARGETED)
    assert (pods.wanted(), pods.starting()) == ({}, {"edgeplug.io/cam": 2})
    # Started: one stream has said so, the other not yet; it is held until both have.
    pods.update(_pod("broker", node_name="n1", phase="Running"), stream=TARGETED)
    assert pods.starting() == {"edgeplug.io/cam": 2}
    pods.update(_pod("broker", node_name="n1"), deleted=True, stream=BOUND)
    pods.update(_pod("user", node_name="n1"), deleted=True, stream=BOUND)
    assert (pods.wanted(), pods.starting()) == ({}, {})
    # An unscheduled pod is demand only through the labelled stream.
    pods.update(_pod("stray"), stream=BOUND)
    assert pods.wanted() == {}


def test_the_controllers_count_on_the_node_is_demand_for_unlabelled_pinned_pods() -> None:
    changes: list[int] = []
    pods = PendingPods(client=cast(AsyncClient, None), node="n1",
                       on_change=lambda: changes.append(1))
    pods.annotated('{"edgeplug.io/cam":2,"edgeplug.io/cam-abc":1}')
    assert pods.wanted() == {"edgeplug.io/cam": 2, "edgeplug.io/cam-abc": 1}
    pods.update(_pod("u1"))  # a labelled pod the controller counted too: the larger count wins
    assert pods.wanted() == {"edgeplug.io/cam": 2, "edgeplug.io/cam-abc": 1}
    pods.annotated("{}")
    assert pods.wanted() == {"edgeplug.io/cam": 1}
    pods.annotated("not json")  # malformed: no demand from it, the watch goes on
    assert pods.wanted() == {"edgeplug.io/cam": 1}
    assert len(changes) == 2


def test_a_pinned_pod_the_controller_counts_until_it_starts_is_wanted_until_seen_bound() -> None:
    """The controller counts a pinned pod from creation to start (bound or not); the agent
    subtracts the pinned pods its bound stream holds, so the pod is wanted until that stream
    delivers its binding, held from then on, and never both."""
    pods = PendingPods(client=cast(AsyncClient, None), node="n1")
    pods.annotated('{"edgeplug.io/cam":2}')  # u1 and u2, pinned here, neither labelled
    pods.update(_pod("u1", node_name="n1"), stream=BOUND)
    assert (pods.wanted(), pods.starting()) == ({"edgeplug.io/cam": 1}, {"edgeplug.io/cam": 1})
    pods.update(_pod("elsewhere", node_name="n1", pin="n2"), stream=BOUND)  # not counted there
    assert (pods.wanted(), pods.starting()) == ({"edgeplug.io/cam": 1}, {"edgeplug.io/cam": 2})
    pods.update(_pod("u1", node_name="n1", phase="Running"), stream=BOUND)  # started; the
    assert pods.wanted() == {"edgeplug.io/cam": 2}  # controller's count drops in its turn
    pods.annotated('{"edgeplug.io/cam":1}')
    assert pods.wanted() == {"edgeplug.io/cam": 1}


def test_the_pinned_demand_annotation_round_trips_and_refuses_garbage() -> None:
    text = format_pinned_demand({"b/x": 1, "a/y": 2, "c/z": 0})
    assert text == '{"a/y":2,"b/x":1}'
    assert parse_pinned_demand(text) == {"a/y": 2, "b/x": 1}
    assert parse_pinned_demand(None) == {}
    for bad in ('["a"]', '{"a/y": -1}', '{"a/y": true}', '{"a/y": "2"}'):
        with pytest.raises(ValueError, match="pinned-demand"):
            parse_pinned_demand(bad)
