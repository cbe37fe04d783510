"""Label this node ``edgeplug.io/<configuration>=true`` while it has devices of a Configuration.

Why this exists: users select nodes that have a kind of device (a DaemonSet on camera nodes)
without requesting a device resource. The label follows this node's Instances: added with the
first, removed (merge patch with ``null``) with the last. Configurations of one name in several
namespaces share a label, so it is counted per (namespace, configuration). Labels of
Configurations deleted while no agent ran are pruned when the agent starts.
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

    async def set(self, *, namespace: str, configuration: str, has_devices: bool) -> None:
        async with self._lock:
            key = (namespace, configuration)
            before = any(c == configuration for _, c in self._having)
            if has_devices:
                self._having.add(key)
            else:
                self._having.discard(key)
            after = any(c == configuration for _, c in self._having)
            if before == after and configuration in self._reported:
                return
            self._reported.add(configuration)
            await self._patch(configuration, LABEL_VALUE if after else None)

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
        body = {"metadata": {"labels": {label_key(configuration): value}}}
        try:
            await self._client.patch(Node, self._node, body, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning(
                "could not %s node label %s: %s",
                "set" if value else "remove", label_key(configuration), exc,
                extra={"node": self._node},
            )
