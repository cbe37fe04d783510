"""Configuration status: counts, conditions with reasons, and no write when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller.brokers import status
from controller.brokers.status import BrokerCounts

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def conditions(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in s["conditions"]}


def test_counts_and_ready_condition() -> None:
    s = status.desired_status(
        generation=4, counts=BrokerCounts(instances=2, desired=3, ready=1), has_broker_spec=True,
        spec_problems=[], refusal=None, current=None, now=NOW,
    )
    assert s["observedGeneration"] == 4
    assert s["instanceCount"] == 2
    assert s["brokers"] == {"desired": 3, "ready": 1}
    ready = conditions(s)[status.CONDITION_BROKERS_READY]
    assert (ready["status"], ready["reason"]) == ("False", status.REASON_NOT_READY)
    assert ready["message"] == "1/3 brokers ready"
    assert conditions(s)[status.CONDITION_BROKER_SPEC_VALID]["status"] == "True"


def test_invalid_spec_and_refusal_say_why() -> None:
    s = status.desired_status(
        generation=1, counts=BrokerCounts(instances=1, desired=1, ready=0), has_broker_spec=True,
        spec_problems=["spec.brokerSpec.brokerPodSpec.containers[0].image: required"],
        refusal=None, current=None, now=NOW,
    )
    valid = conditions(s)[status.CONDITION_BROKER_SPEC_VALID]
    assert (valid["status"], valid["reason"]) == ("False", status.REASON_INVALID)
    assert "containers[0].image" in str(valid["message"])
    s = status.desired_status(
        generation=1, counts=BrokerCounts(instances=1, desired=1, ready=0), has_broker_spec=True,
        spec_problems=[], refusal="Pod is invalid: spec.containers[0].name", current=None, now=NOW,
    )
    assert conditions(s)[status.CONDITION_BROKER_SPEC_VALID]["reason"] == status.REASON_REFUSED


def test_unchanged_status_needs_no_write_and_keeps_transition_time() -> None:
    counts = BrokerCounts(instances=1, desired=1, ready=1)
    first = status.desired_status(
        generation=1, counts=counts, has_broker_spec=True, spec_problems=[], refusal=None,
        current=None, now=NOW,
    )
    # The agent's own condition sits in the same list; it is neither needed nor touched.
    current = {**first, "conditions": [*first["conditions"], {"type": "DiscoveryDetailsValid"}]}
    later = status.desired_status(
        generation=1, counts=counts, has_broker_spec=True, spec_problems=[], refusal=None,
        current=current, now=NOW + timedelta(minutes=5),
    )
    assert not status.needs_write(current, later)
    assert conditions(later)[status.CONDITION_BROKERS_READY]["lastTransitionTime"] == (
        "2026-01-01T12:00:00Z"
    )
    assert status.CONDITION_BROKERS_READY in conditions(later)
    assert "DiscoveryDetailsValid" not in conditions(later)
    fewer = status.desired_status(
        generation=1, counts=BrokerCounts(instances=1, desired=1, ready=0), has_broker_spec=True,
        spec_problems=[], refusal=None, current=current, now=NOW + timedelta(minutes=5),
    )
    assert status.needs_write(current, fewer)
    assert conditions(fewer)[status.CONDITION_BROKERS_READY]["lastTransitionTime"] == (
        "2026-01-01T12:05:00Z"
    )


def test_a_node_the_selector_does_not_select_is_named_and_withdrawn_when_gone() -> None:
    counts = BrokerCounts(instances=1, desired=1, ready=1)
    forged = status.desired_status(
        generation=2, counts=counts, has_broker_spec=True, spec_problems=[], refusal=None,
        current=None, now=NOW, unselected={"cam-1a2b3c": ("node-a",)},
    )
    selected = conditions(forged)[status.CONDITION_BROKER_NODES_SELECTED]
    assert (selected["status"], selected["reason"]) == ("False", status.REASON_NODE_NOT_SELECTED)
    assert "Instance cam-1a2b3c lists node-a" in str(selected["message"])
    assert not status.needs_write(forged, forged)
    # The node left the Instance: the condition is withdrawn (an apply without it).
    clean = status.desired_status(
        generation=2, counts=counts, has_broker_spec=True, spec_problems=[], refusal=None,
        current=forged, now=NOW, unselected={},
    )
    assert status.CONDITION_BROKER_NODES_SELECTED not in conditions(clean)
    assert status.needs_write(forged, clean)
    assert not status.needs_write(clean, clean)
