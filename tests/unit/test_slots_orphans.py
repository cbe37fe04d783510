"""Which held slot the orphan freer frees, over tables (agent.deviceplugins.slots.orphans); the I/O
around it (pod-resources, the ledger) is tests/integration/test_slot_reuse.py's."""

from __future__ import annotations

from typing import Any

import pytest

from agent.deviceplugins.kubelet.podresources import PodDevices
from agent.deviceplugins.slots.orphans import (
    HeldSlot,
    Judgement,
    Verdict,
    free_on_bound_pods,
    held_slots,
    judge_slot,
)
from crds.instance import SlotUsage
from tests.harness.slot_instances import NAME, slot_instance

A, B = "node-a", "node-b"
GRACE = 5.0
NOW = 100.0
RESOURCE = f"edgeplug.io/{NAME}"


@pytest.mark.parametrize(("what", "state", "expected"), [
    ("listed: seen live at its hand-out count, no clock",
     {"live": True, "handouts": 3, "seen_live": None, "clock": (90.0, 3)},
     Judgement(Verdict.LIVE, seen_live=3, clock=None)),
    ("seen live since its latest hand-out, now missed: free at once",
     {"live": False, "handouts": 3, "seen_live": 3, "clock": None},
     Judgement(Verdict.FREE, seen_live=None, clock=None)),
    ("seen live before a newer hand-out: the clock starts now",
     {"live": False, "handouts": 4, "seen_live": 3, "clock": None},
     Judgement(Verdict.WAIT, seen_live=3, clock=(NOW, 4))),
    ("missed within the grace: waits",
     {"live": False, "handouts": 3, "seen_live": None, "clock": (NOW - 1, 3)},
     Judgement(Verdict.WAIT, seen_live=None, clock=(NOW - 1, 3))),
    ("missed past the grace",
     {"live": False, "handouts": 3, "seen_live": None, "clock": (NOW - GRACE, 3)},
     Judgement(Verdict.GRACE_OVER, seen_live=None, clock=(NOW - GRACE, 3))),
    ("past the grace, but handed out again since the clock started: it starts again",
     {"live": False, "handouts": 4, "seen_live": None, "clock": (NOW - GRACE, 3)},
     Judgement(Verdict.WAIT, seen_live=None, clock=(NOW, 4))),
    ("within the grace while another node waits: per-pod evidence",
     {"live": False, "handouts": 3, "seen_live": None, "clock": None, "awaited": True},
     Judgement(Verdict.EVIDENCE, seen_live=None, clock=(NOW, 3))),
])
def test_one_held_slot_against_one_list(what: str, state: dict[str, Any],
                                        expected: Judgement) -> None:
    state = {"awaited": False, **state}
    assert judge_slot(now=NOW, grace=GRACE, **state) == expected, what


def _pod(name: str, wants: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {RESOURCE: str(wants)}}}]}}


@pytest.mark.parametrize(("what", "verdict", "bound", "listed", "expected"), [
    ("past the grace, every asking pod listed: free", Verdict.GRACE_OVER,
     [_pod("p", 1)], [PodDevices("ns", "p", ((RESOURCE, (f"{NAME}-1",)),))], (True, [])),
    ("past the grace, an asking pod not listed (a restarted kubelet): kept",
     Verdict.GRACE_OVER, [_pod("p", 1)], [], (False, ["ns/p"])),
    ("past the grace, the bound pods not readable: the grace alone frees",
     Verdict.GRACE_OVER, None, [], (True, [])),
    ("evidence: every asking pod listed with all its devices: free", Verdict.EVIDENCE,
     [_pod("p", 1)], [PodDevices("ns", "p", ((RESOURCE, (f"{NAME}-1",)),))], (True, [])),
    ("evidence: a pod listed without its device yet: not yet", Verdict.EVIDENCE,
     [_pod("p", 1)], [PodDevices("ns", "p", ())], (False, [])),
    ("evidence: the bound pods not readable: not yet", Verdict.EVIDENCE, None, [],
     (False, [])),
])
def test_the_pods_bound_here_settle_the_rest(what: str, verdict: Verdict,
                                             bound: list[dict[str, Any]] | None,
                                             listed: list[PodDevices],
                                             expected: tuple[bool, list[str]]) -> None:
    assert free_on_bound_pods(verdict, bound, listed, RESOURCE) == expected, what


def test_the_slots_a_node_holds_and_how_a_live_pod_is_listed_with_them() -> None:
    virtual = SlotUsage.by_configuration("v-1", A).format()
    instance = slot_instance(usage={f"{NAME}-0": A, f"{NAME}-1": virtual})
    held = held_slots([instance, slot_instance(name="other", usage={"other-0": B})], A,
                      {("ns", "cam"): "edgeplug.io/cam"})
    assert [(h.slot, h.resource, h.device_id) for h in held] == [
        (f"{NAME}-0", RESOURCE, f"{NAME}-0"), (f"{NAME}-1", "edgeplug.io/cam", "v-1")]
    unknown = held_slots([instance], A, {})
    # A Configuration resource not known (yet): no live pod can be matched to the slot.
    assert unknown[1] == HeldSlot(instance, f"{NAME}-1", virtual, SlotUsage.parse(virtual),
                                  None, "v-1")
