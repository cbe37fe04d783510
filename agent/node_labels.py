"""Label this node ``edgeplug.io/<configuration>=true`` while it has devices of a Configuration.

Why this exists: users select nodes that have a kind of device (a DaemonSet on camera nodes)
without requesting a device resource. The label follows this node's Instances: added with the
first, removed (merge patch with ``null``) with the last. Configurations of one name in several
namespaces share a label, so it is counted per (namespace, configuration). Labels of
Configurations deleted while no agent ran are pruned when the agent starts.

A handler may describe the devices as labels too (``LabellingHandler``: Ascend's chip model and
count): those ``edgeplug.io/`` labels are set with the same merge patch and removed with the
Configuration's last device on this node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from crds.api import GROUP

log = logging.getLogger(__name__)

LABEL_VALUE = "true"


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
            if before != after or configuration not in self._reported:
                changes[label_key(configuration)] = LABEL_VALUE if after else None
            if not changes:
                return
            self._reported.add(configuration)
            if await self._patch_labels(changes):
                self._written = wanted

    async def prune(self, *, node_labels: Mapping[str, str], configurations: Iterable[str]) -> None:
        """Remove labels of ours whose Configuration no longer exists (gone while we were down)."""
        prefix = f"{GROUP}/"
        existing = set(configurations)
        async with self._lock:
            for key, value in node_labels.items():
                name = key.removeprefix(prefix)
                if key.startswith(prefix) and value == LABEL_VALUE and name not in existing:
                    log.info("removing stale node label %s", key, extra={"node": self._node})
                    await self._patch(name, None)

    async def _patch(self, configuration: str, value: str | None) -> None:
        await self._patch_labels({label_key(configuration): value})

    async def _patch_labels(self, labels: Mapping[str, str | None]) -> bool:
        body = {"metadata": {"labels": dict(labels)}}
        try:
            await self._client.patch(Node, self._node, body, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning("could not change node labels %s: %s", sorted(labels), exc,
                        extra={"node": self._node})
            return False
        return True
