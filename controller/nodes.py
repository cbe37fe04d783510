"""Removes nodes that are gone, or NotReady too long, from Instances, freeing their slots.

Why this exists: an agent removes its own node from the Instances it stops seeing, but a node
that was deleted or died cannot: its agent is gone with it. The controller does it instead: the
node leaves every Instance's ``nodes`` and every ``deviceUsage`` slot it held (``"<node>"`` or
``"C:<vid>:<node>"``) becomes free, so other nodes' brokers can get the device. The write is a
merge patch carrying the ``resourceVersion`` the decision was made on: if an agent claimed a slot
in between, the API server answers 409 and the controller re-reads and decides again (bounded
attempts), so a claim is never overwritten. An Instance left with no node at all is deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from controller.kube import Conflict, Kube
from controller.reconcile import parse_time
from crds.instance import SlotUsage

if TYPE_CHECKING:
    from collections.abc import Iterable

    from controller.view import ClusterView, InstanceRecord

log = logging.getLogger(__name__)

#: How long a node may be NotReady (or Unknown) before the controller frees its slots.
DEFAULT_NODE_NOT_READY_GRACE_S: Final = 300.0
#: How long a node named in an Instance may be absent from the controller's view before it counts
#: as deleted (covers the moment between an agent's first Instance and the Node reaching the
#: controller's watch; a Node deletion event acts at once).
NODE_MISSING_GRACE_S: Final = 10.0
#: Optimistic-concurrency attempts before giving up until the next resync.
RELEASE_ATTEMPTS: Final = 5


@dataclass(frozen=True)
class NodeHealth:
    name: str
    ready: bool
    since: datetime | None

    @classmethod
    def from_object(cls, node: Mapping[str, Any]) -> NodeHealth:
        name = str((node.get("metadata") or {}).get("name", ""))
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return cls(
                    name=name,
                    ready=condition.get("status") == "True",
                    since=parse_time(condition.get("lastTransitionTime")),
                )
        return cls(name=name, ready=False, since=None)

    def unhealthy_for(self, now: datetime) -> float:
        """Seconds the node has been not Ready (0 when Ready or unknown since when)."""
        if self.ready or self.since is None:
            return 0.0
        return max((now - self.since).total_seconds(), 0.0)


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

    def __init__(self, *, kube: Kube, not_ready_grace_s: float) -> None:
        self.kube = kube
        self.not_ready_grace_s = not_ready_grace_s
        self.missing_since: dict[str, datetime] = {}

    async def node_deleted(self, view: ClusterView, node: str) -> None:
        """A Node deletion seen by the watch: no grace, it is gone."""
        for namespace, name in view.instances_on(node):
            await remove_node_from_instance(self.kube, namespace, name, node)
        self.missing_since.pop(node, None)

    async def release_unhealthy(self, view: ClusterView, records: Iterable[InstanceRecord]) -> None:
        """Removes from ``records`` every node NotReady (or absent) past its grace."""
        now = datetime.now(UTC)
        for record in records:
            for node in record.instance.spec.nodes:
                if self.is_gone(view, node, now):
                    await remove_node_from_instance(
                        self.kube, record.instance.namespace, record.instance.name, node
                    )

    def is_gone(self, view: ClusterView, node: str, now: datetime) -> bool:
        health = view.node(node)
        if health is None:
            since = self.missing_since.setdefault(node, now)
            return (now - since).total_seconds() >= NODE_MISSING_GRACE_S
        self.missing_since.pop(node, None)
        return health.unhealthy_for(now) >= self.not_ready_grace_s
