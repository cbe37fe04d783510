"""Label this node ``edgeplug.io/<configuration>=true`` (and a handler's labels) while it has
devices of a Configuration.

``NodeLabels.set`` adds or removes them with one merge patch, recording ours in the Node's
``edgeplug.io/labels`` annotation; ``NodeLabels.prune`` removes at start the labels of
Configurations gone. Rules: docs/architecture.md, "The agent's discovery modules".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from crds.api import GROUP

log = logging.getLogger(__name__)

LABEL_VALUE = "true"
#: Labels outside ``edgeplug.io/`` a handler may have set: Huawei's Ascend plugin's
#: (``discovery_handlers.ascend.huawei.LABEL_KEYS``; deploy/manifests/agent-node-policy.yaml
#: allows exactly these). Set, never removed.
FOREIGN_LABEL_KEYS = frozenset({
    "accelerator", "node.kubernetes.io/npu.chip.name", "servertype",
    "mind-cluster/npu-chip-memory",
})
#: The Node annotation recording which labels the agent set, per Configuration.
OWNED_ANNOTATION = f"{GROUP}/labels"

_Owned = dict[str, list[str]]  # "namespace/configuration" -> label keys, sorted


def parse_owned(annotations: Mapping[str, str]) -> _Owned | None:
    """The record in ``OWNED_ANNOTATION``; None when there is none or it is malformed."""
    text = annotations.get(OWNED_ANNOTATION)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
        for k, v in value.items()
    ):
        log.warning("ignoring a malformed %s annotation on the Node", OWNED_ANNOTATION)
        return None
    return {k: sorted(v) for k, v in value.items()}


def _unrecorded_stale(node_labels: Mapping[str, str], names: set[str]) -> set[str]:
    """Without a record: ``edgeplug.io/<name>=true`` labels whose name is no Configuration's
    (how agents that kept no record labelled)."""
    prefix = f"{GROUP}/"
    return {key for key, value in node_labels.items()
            if key.startswith(prefix) and value == LABEL_VALUE
            and key.removeprefix(prefix) not in names}


def _record_key(namespace: str, configuration: str) -> str:
    """A Configuration's key in the ``OWNED_ANNOTATION`` record."""
    return f"{namespace}/{configuration}"


def _format_owned(owned: _Owned) -> str | None:
    return json.dumps(owned, sort_keys=True, separators=(",", ":")) if owned else None


def label_key(configuration: str) -> str:
    return f"{GROUP}/{configuration}"


class NodeLabels:
    """Keeps the node's configuration labels in line with which runs have Instances."""

    def __init__(self, *, client: AsyncClient, node_name: str) -> None:
        self._client = client
        self._node = node_name
        self._having: set[tuple[str, str]] = set()
        self._lock = asyncio.Lock()
        # Configurations whose label was written at least once by this process: the first
        # report always patches, so a label left by an earlier agent is corrected.
        self._reported: set[str] = set()
        self._handler_labels: dict[tuple[str, str], dict[str, str]] = {}
        self._written: dict[str, str] = {}  # handler labels as last written
        self._foreign: dict[str, str] = {}  # FOREIGN_LABEL_KEYS as last written
        #: The ``OWNED_ANNOTATION`` record as last read or written.
        self._owned: _Owned = {}

    async def set(
        self,
        *,
        namespace: str,
        configuration: str,
        has_devices: bool,
        handler_labels: Mapping[str, str] | None = None,
    ) -> None:
        async with self._lock:
            key = (namespace, configuration)
            before = any(c == configuration for _, c in self._having)
            if has_devices:
                self._having.add(key)
                self._handler_labels[key] = {
                    k: v for k, v in (handler_labels or {}).items()
                    if k.startswith(f"{GROUP}/") and k != label_key(configuration)
                }
            else:
                self._having.discard(key)
                self._handler_labels.pop(key, None)
            after = any(c == configuration for _, c in self._having)
            wanted: dict[str, str] = {}
            for labels in self._handler_labels.values():
                wanted.update(labels)
            changes: dict[str, str | None] = {
                k: v for k, v in wanted.items() if self._written.get(k) != v
            }
            changes.update({k: None for k in self._written if k not in wanted})
            foreign = {k: v for k, v in (handler_labels or {}).items()
                       if has_devices and k in FOREIGN_LABEL_KEYS and self._foreign.get(k) != v}
            changes.update(foreign)
            if before != after or configuration not in self._reported:
                changes[label_key(configuration)] = LABEL_VALUE if after else None
            record = _record_key(namespace, configuration)
            owned = {k: v for k, v in self._owned.items() if k != record}
            if has_devices:
                owned[record] = sorted(
                    {label_key(configuration), *self._handler_labels[key]})
            if not changes and owned == self._owned:
                return
            self._reported.add(configuration)
            if await self._patch_labels(changes, owned=owned):
                self._written = wanted
                self._foreign.update(foreign)

    async def prune(
        self,
        *,
        node_labels: Mapping[str, str],
        node_annotations: Mapping[str, str],
        configurations: Iterable[tuple[str, str]],
    ) -> None:
        """Remove labels of ours whose Configuration no longer exists (gone while we were
        down). ``configurations``: (namespace, name) of every Configuration there is."""
        configurations = list(configurations)
        existing = {_record_key(namespace, name) for namespace, name in configurations}
        async with self._lock:
            recorded = parse_owned(node_annotations)
            if recorded is None:
                stale = _unrecorded_stale(node_labels, {name for _, name in configurations})
                owned: _Owned = {}
            else:
                owned = {k: v for k, v in recorded.items() if k in existing}
                kept = {label for labels in owned.values() for label in labels}
                stale = {label for k, labels in recorded.items() if k not in existing
                         for label in labels if label not in kept and label in node_labels}
            for label in sorted(stale):
                log.info("removing stale node label %s", label, extra={"node": self._node})
            if stale or owned != (recorded or {}):
                await self._patch_labels(dict.fromkeys(stale), owned=owned)
            self._owned = owned  # as the Node should record it, written or not

    async def _patch_labels(self, labels: Mapping[str, str | None], *, owned: _Owned) -> bool:
        """One merge patch of ``labels`` and the ``owned`` record."""
        body = {"metadata": {"labels": dict(labels),
                             "annotations": {OWNED_ANNOTATION: _format_owned(owned)}}}
        try:
            await self._client.patch(Node, self._node, body, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning("could not change node labels %s: %s", sorted(labels), exc,
                        extra={"node": self._node})
            return False
        self._owned = owned
        return True
