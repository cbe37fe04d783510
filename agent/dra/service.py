"""The agent's DRA side, one entry point for ``agent.main``: ResourceSlices and, where the
kubelet's plugin directories are given, the DRA kubelet plugin.

``main`` is wiring only, and with ``DRA=on`` it starts exactly this; nothing
under ``agent.dra`` is imported otherwise (an agent without DRA pays none of its memory).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDeviceTable
from agent.dra.plugin import ClaimPreparer, DraKubeletPlugin
from agent.dra.publisher import DraPublisher
from agent.kube.node_reads import NodeReads
from agent.metrics import AgentMetrics
from crds import dra


async def serve_dra(*, client: AsyncClient, node_name: str, namespace: str | None,
                    devices: NodeDeviceTable, cdi_dir: Path | None, plugins_dir: Path,
                    registry_dir: Path | None, reads: NodeReads | None = None,
                    metrics: AgentMetrics | None = None) -> None:
    """Publish this node's pools; serve the kubelet plugin unless ``registry_dir`` is None,
    reading claims with ``reads`` (by default the agent's own client)."""
    async with asyncio.TaskGroup() as group:
        group.create_task(
            DraPublisher(client=client, node_name=node_name, namespace=namespace,
                         devices=devices).run())
        if registry_dir is not None:
            preparer = ClaimPreparer(reads=reads or NodeReads(client), node_name=node_name,
                                     devices=devices, cdi_dir=cdi_dir,
                                     state_dir=plugins_dir / dra.DRIVER,
                                     status_client=client)
            plugin = DraKubeletPlugin(preparer=preparer, plugins_dir=plugins_dir,
                                      registry_dir=registry_dir, metrics=metrics)
            group.create_task(plugin.run())
