"""What Pending pods pinned to each node ask for, written on that Node for its agent.

``pinned_pod`` decodes a pod; ``PinnedDemand`` keeps each Node's ``PINNED_DEMAND_ANNOTATION`` equal
to its pinned pods' total (``sync``, ``stale_nodes``). Why: docs/slots.md, C5.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from crds import pinning

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedPod:
    """A Pending pod pinned to ``node`` (unscheduled, or bound there and not yet started)
    that requests extended resources."""

    namespace: str
    name: str
    node: str
    requests: tuple[tuple[str, int], ...]


class _Meta(msgspec.Struct):
    resourceVersion: str = ""
    name: str = ""
    namespace: str = ""
    deletionTimestamp: str | None = None


class _Status(msgspec.Struct):
    phase: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: _Status = msgspec.field(default_factory=_Status)


_decode_pod = msgspec.json.Decoder(_Pod).decode


def pinned_pod(raw: bytes) -> tuple[PinnedPod | None, str]:
    """The watch decoder: a record for a Pending pinned pod with extended requests, bound or
    not (bound to another node than its pin it can never start: not kept); None (not kept) for
    any other pod."""
    obj = _decode_pod(raw)
    meta, spec = obj.metadata, obj.spec
    if meta.deletionTimestamp or obj.status.phase not in ("", "Pending"):
        return None, meta.resourceVersion
    node = pinning.pinned_node(spec)
    requests = pinning.extended_requests(spec)
    if node is None or not requests or spec.get("nodeName") not in (None, "", node):
        return None, meta.resourceVersion
    return PinnedPod(namespace=meta.namespace, name=meta.name, node=node,
                     requests=tuple(sorted(requests.items()))), meta.resourceVersion


def node_totals(pods: Iterable[PinnedPod]) -> dict[str, pinning.Requests]:
    """Node → resource → what its pinned pods request, summed."""
    per_node: dict[str, list[dict[str, int]]] = {}
    for pod in pods:
        per_node.setdefault(pod.node, []).append(dict(pod.requests))
    return {node: pinning.sum_requests(requests) for node, requests in per_node.items()}


class PinnedDemand:
    """Keeps every node's annotation equal to its pinned pods' total.

    ``pods`` and ``annotations`` are read from the caller's watch stores (pod key → record;
    node → the annotation's current text, "" when absent); ``write(node, text or None)``
    patches the Node. The caller queues ``sync(node)`` for every node ``changed_nodes`` or
    ``stale_nodes`` names.
    """

    def __init__(
        self,
        *,
        pods: Callable[[], Iterable[PinnedPod]],
        annotations: Callable[[], dict[str, str]],
        write: Callable[[str, str | None], Awaitable[None]],
    ) -> None:
        self._all_pods = pods
        self._annotations = annotations
        self._write = write
        self._scheduled: Callable[[], frozenset[str]] = frozenset

    def leave_out(self, scheduled: Callable[[], frozenset[str]]) -> None:
        """Count no request for the resources ``scheduled()`` names: the scheduler allocates
        them (DRA), so no device plugin waits for their demand (docs/slots.md, D3)."""
        self._scheduled = scheduled

    def _pods(self) -> list[PinnedPod]:
        """The pinned pods' requests for resources the device plugins serve."""
        scheduled = self._scheduled()
        if not scheduled:
            return list(self._all_pods())
        kept = []
        for pod in self._all_pods():
            requests = tuple((r, n) for r, n in pod.requests if r not in scheduled)
            if requests:
                kept.append(PinnedPod(namespace=pod.namespace, name=pod.name, node=pod.node,
                                      requests=requests))
        return kept

    @staticmethod
    def changed_nodes(old: PinnedPod | None, new: PinnedPod | None) -> set[str]:
        return {p.node for p in (old, new) if p is not None and (old is None or new is None
                                                                  or old != new)}

    def wanted_text(self, node: str) -> str:
        total = node_totals(p for p in self._pods() if p.node == node).get(node, {})
        return pinning.format_pinned_demand(total) if total else ""

    def stale_nodes(self) -> list[str]:
        """Nodes whose annotation differs from their pinned pods' total now."""
        annotations = self._annotations()
        totals = node_totals(self._pods())
        nodes = set(annotations) | set(totals)
        return sorted(
            node for node in nodes
            if annotations.get(node, "") != (
                pinning.format_pinned_demand(totals[node]) if totals.get(node) else "")
        )

    async def sync(self, node: str) -> None:
        """Write ``node``'s annotation if it differs from its pinned pods' total."""
        want = self.wanted_text(node)
        if self._annotations().get(node, "") == want:
            return
        await self._write(node, want or None)
        log.info("pinned demand written on node %s: %s", node, want or "(none)")
