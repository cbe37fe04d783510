"""Removes nodes that are gone, or NotReady too long, from Instances, freeing their slots.

``NodeJanitor`` (``node_deleted``, ``release_gone_nodes``) and ``remove_node_from_instance``, a
merge patch conditioned on the ``resourceVersion`` read (docs/slots.md; docs/architecture.md, "The
controller's modules").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from controller.kube.client import Conflict, Kube
from controller.state.records import InstanceRecord
from controller.state.view import ClusterView
from crds.instance import SlotUsage

log = logging.getLogger(__name__)

#: Optimistic-concurrency attempts before giving up until the next resync.
RELEASE_ATTEMPTS: Final = 5


def release_node(spec: Mapping[str, Any], node: str) -> dict[str, Any] | None:
    """The spec merge patch that removes ``node`` and frees its slots, or None if none needed."""
    nodes = [str(n) for n in spec.get("nodes") or []]
    freed: dict[str, str] = {}
    for slot, value in (spec.get("deviceUsage") or {}).items():
        try:
            usage = SlotUsage.parse(str(value))
        except ValueError:
            continue
        if not usage.is_free and usage.node == node:
            freed[str(slot)] = ""
    if node not in nodes and not freed:
        return None
    patch: dict[str, Any] = {"nodes": [n for n in nodes if n != node]}
    if freed:
        patch["deviceUsage"] = freed
    return patch


async def remove_node_from_instance(kube: Kube, namespace: str, name: str, node: str) -> bool:
    """Removes ``node`` from one Instance; True when this call changed it."""
    for _ in range(RELEASE_ATTEMPTS):
        obj = await kube.get_instance(namespace, name)
        if obj is None:
            return False
        patch = release_node(obj.get("spec") or {}, node)
        if patch is None:
            return False
        version = str(obj["metadata"]["resourceVersion"])
        try:
            await kube.patch_instance(namespace, name, resource_version=version, spec=patch)
        except Conflict:
            continue
        if not patch["nodes"]:
            await kube.delete_instance(namespace, name)
        log.info("removed node %s from Instance %s/%s", node, namespace, name)
        return True
    log.warning(
        "gave up removing node %s from Instance %s/%s after %d conflicts; will retry",
        node, namespace, name, RELEASE_ATTEMPTS,
    )
    return False


class NodeJanitor:
    """Decides when a node counts as gone and removes it from the Instances that name it."""

    def __init__(self, *, kube: Kube, not_ready_grace_s: float, missing_grace_s: float) -> None:
        #: A node named in an Instance but absent from the view counts as deleted after
        #: ``missing_grace_s`` (an agent's first Instance may precede the Node in the watch);
        #: a Node deletion event acts at once.
        self.missing_grace_s = missing_grace_s
        self.kube = kube
        self.not_ready_grace_s = not_ready_grace_s
        self.missing_since: dict[str, datetime] = {}

    async def node_deleted(self, view: ClusterView, node: str) -> None:
        """A Node deletion seen by the watch: no grace, it is gone."""
        for namespace, name in view.instances_on(node):
            await remove_node_from_instance(self.kube, namespace, name, node)
        self.missing_since.pop(node, None)

    async def release_gone_nodes(self, view: ClusterView, record: InstanceRecord) -> float | None:
        """Removes from one Instance every node gone past its grace; returns the seconds until
        another of its nodes would pass its grace (None when every node is healthy)."""
        now = datetime.now(UTC)
        wait: float | None = None
        for node in record.instance.spec.nodes:
            remaining = self.remaining_s(view, node, now)
            if remaining is None:
                continue
            if remaining <= 0:
                await remove_node_from_instance(
                    self.kube, record.instance.namespace, record.instance.name, node
                )
            else:
                wait = remaining if wait is None else min(wait, remaining)
        return wait

    def remaining_s(self, view: ClusterView, node: str, now: datetime) -> float | None:
        """Seconds until ``node`` counts as gone (≤ 0: it is), or None while it is healthy."""
        health = view.node(node)
        if health is None:
            since = self.missing_since.setdefault(node, now)
            return self.missing_grace_s - (now - since).total_seconds()
        self.missing_since.pop(node, None)
        if health.ready or health.since is None:
            return None
        return self.not_ready_grace_s - health.unhealthy_for(now)
