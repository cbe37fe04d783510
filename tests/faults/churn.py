"""Pods created and deleted without pause while a fault runs, as users' workloads would.

The kubelet-restart storm and the agent kills must happen while pods are being
admitted, not between admissions. ``PodChurn`` keeps creating a pod pinned to a node, waits
until it runs, deletes it and starts the next, until told to stop; a pod that never runs within
the deadline fails the scenario with its last status.

``admitting`` is held from a pod's creation until it runs: a fault that must not strike while
the kubelet admits a pod takes it (see test_kubelet_storm.py for why one must not).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from lightkube import AsyncClient

from tests.faults.cluster import delete_pod
from tests.harness.agent_nodes import pinned_pod
from tests.harness.kube_waits import WAIT_S, running, wait_pod


@dataclass
class PodChurn:
    """One pod at a time on ``node`` asking for ``resource``: create, run, delete, again."""

    client: AsyncClient
    namespace: str
    node: str
    resource: str
    prefix: str
    #: Pods that ran and were deleted.
    ran: int = 0
    admitting: asyncio.Lock = field(default_factory=asyncio.Lock)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            name = f"{self.prefix}-{self.ran}"
            async with self.admitting:
                await self.client.create(
                    pinned_pod(self.namespace, name, resource=self.resource, node=self.node,
                               stop_at_once=True))
                await wait_pod(self.client, self.namespace, name, running, "Running",
                               within=WAIT_S)
            await delete_pod(self.client, self.namespace, name)
            self.ran += 1

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"churn-{self.prefix}")

    async def stop(self) -> None:
        """Finish the pod in hand, then stop; re-raises what failed the churn."""
        self._stop.set()
        assert self._task is not None
        await self._task

    async def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
