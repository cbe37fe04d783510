"""Freeing a gone node's place in an Instance, and reading a node's health."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.brokers.nodes import release_node
from controller.settings import ControllerSettings
from controller.state import decode
from controller.state.records import NodeHealth

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def test_release_removes_the_node_and_frees_only_its_slots() -> None:
    spec = {
        "nodes": ["a", "b"],
        "deviceUsage": {"i-0": "a", "i-1": "C:vid0:a", "i-2": "b", "i-3": "", "i-4": "C:v:ab"},
    }
    assert release_node(spec, "a") == {"nodes": ["b"], "deviceUsage": {"i-0": "", "i-1": ""}}


def test_release_is_none_when_nothing_to_do() -> None:
    assert release_node({"nodes": ["b"], "deviceUsage": {"i-0": "b"}}, "a") is None


def test_release_frees_slots_even_if_the_node_already_left_nodes() -> None:
    assert release_node({"nodes": ["b"], "deviceUsage": {"i-0": "a"}}, "a") == {
        "nodes": ["b"], "deviceUsage": {"i-0": ""},
    }


def test_release_leaves_malformed_usage_alone() -> None:
    assert release_node({"nodes": ["a"], "deviceUsage": {"i-0": "x:y"}}, "a") == {"nodes": []}


def test_node_health() -> None:
    since = (NOW - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sick = NodeHealth.from_object({"metadata": {"name": "a"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": since}]}})
    assert not sick.ready
    assert sick.unhealthy_for(NOW) == 90
    well = NodeHealth.from_object({"metadata": {"name": "b"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": since}]}})
    assert well.unhealthy_for(NOW) == 0
    bare = NodeHealth.from_object({"metadata": {"name": "c"}})
    assert bare.unhealthy_for(NOW) == 0, "no Ready condition yet: not known to be sick"


def test_node_labels_are_kept_for_node_selectors_and_equal_while_unchanged() -> None:
    """The reconciler evaluates a Configuration's nodeSelector against these labels; the wire
    decoder (every watch event) and from_object agree, and a heartbeat leaves them equal."""
    meta: dict[str, Any] = {"name": "a", "resourceVersion": "7",
                            "labels": {"site": "north", "kubernetes.io/hostname": "a"}}
    obj: dict[str, Any] = {"metadata": meta,
                           "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    decoded, version = decode.node(json.dumps(obj).encode())
    assert version == "7"
    assert decoded == NodeHealth.from_object(obj)
    assert decoded.label_map() == {"site": "north", "kubernetes.io/hostname": "a"}
    relabelled = {**obj, "metadata": {**meta, "labels": {"site": "south"}}}
    assert decode.node(json.dumps(relabelled).encode())[0] != decoded


def test_settings_from_args() -> None:
    settings = ControllerSettings.from_args([
        "--namespace", "x", "--namespace", "y", "--resync-interval", "2", "--standalone",
        "--node-not-ready-grace", "30", "--priority", "7",
    ])
    assert settings.namespaces == ("x", "y")
    assert not settings.clusterwide
    assert settings.engine.resync_interval_s == 2
    assert settings.peering.name is None
    assert settings.brokers.node_not_ready_grace_s == 30
    assert settings.peering.priority == 7
    defaults = ControllerSettings.from_args([])
    assert defaults.clusterwide
    assert defaults.peering.name == "edgeplug-controller"
    assert defaults.peering.priority >= 1
