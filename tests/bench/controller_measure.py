"""What the controller benchmarks read: broker pods from a watch, and the controller's process.

The scale, outage and failover benchmarks time the same things (when a broker pod appeared or
vanished, seen through a watch, never by listing ten thousand pods every second) and read the
controller process the same way (CPU seconds and resident memory from ``/proc``, API requests
and writes from its log, where every request it sends is one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any, Final

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from controller import naming
from tests.harness.controller_process import ControllerProcess

EVENT_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.005
#: The controller counts as settled after this long without a write.
QUIET_S: Final = 3.0
SETTLE_TIMEOUT_S: Final = 600.0
_WRITE: Final = re.compile(r"HTTP Request: (POST|PATCH|PUT|DELETE) ")
_REQUEST: Final = re.compile(r"HTTP Request: ")


class PodWatch:
    """Records when each broker pod was first seen, first seen Running and seen deleted; counts
    every pod event, and which pods the scheduler has handled (a ``PodScheduled`` condition)."""

    def __init__(self, client: AsyncClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.scheduled: set[str] = set()
        self.events = 0
        self.last_event = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Lists first, then watches from the list's version: no event is missed after this."""
        selector: dict[str, Any] = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
        listing = self.client.list(Pod, namespace=self.namespace, labels=selector)
        async for pod in listing:
            assert pod.metadata is not None
            self.added.setdefault(str(pod.metadata.name), time.monotonic())
        self.task = asyncio.create_task(self._run(selector, listing.resourceVersion))

    async def _run(self, selector: dict[str, Any], version: str) -> None:
        async for kind, pod in self.client.watch(
            Pod, namespace=self.namespace, labels=selector, resource_version=version
        ):
            assert pod.metadata is not None
            name = str(pod.metadata.name)
            now = time.monotonic()
            self.events += 1
            self.last_event = now
            conditions = (pod.status.conditions if pod.status else None) or []
            if any(c.type == "PodScheduled" for c in conditions):
                self.scheduled.add(name)
            if kind == "DELETED":
                self.deleted.setdefault(name, now)
            else:
                self.added.setdefault(name, now)
                if pod.status is not None and pod.status.phase == "Running":
                    self.running.setdefault(name, now)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def settled(self, count: int, *, quiet_s: float, timeout_s: float) -> float:
        """Seconds until the scheduler has handled ``count`` pods and no pod changed for
        ``quiet_s``: the cluster itself at rest, not only the controller."""
        start = time.monotonic()
        while len(self.scheduled) < count or time.monotonic() - self.last_event < quiet_s:
            if time.monotonic() - start > timeout_s:
                break
            await asyncio.sleep(POLL_S)
        return time.monotonic() - start

    async def wait(self, table: dict[str, float], name: str,
                   timeout_s: float = EVENT_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout_s
        while name not in table:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no watch event for pod {name}")
            await asyncio.sleep(POLL_S)
        return table[name]

    async def last_of(self, table: dict[str, float], count: int, *, what: str,
                      timeout_s: float) -> float:
        """When the last of ``count`` pods entered ``table`` (``added``, ``running``)."""
        deadline = time.monotonic() + timeout_s
        while len(table) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(table)}/{count} pods {what}")
            await asyncio.sleep(POLL_S)
        return max(table.values())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (clock ticks: its figures are lifetime
    totals of seconds, which must include threads that ended; tests/harness/proc_cpu.py is for
    short windows)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _log(ctl: ControllerProcess) -> str:
    return ctl.log_path.read_text(errors="replace")


def requests(ctl: ControllerProcess) -> int:
    """API requests the controller has sent (its HTTP client logs each)."""
    return len(_REQUEST.findall(_log(ctl)))


def writes(ctl: ControllerProcess) -> int:
    """API writes (POST, PATCH, PUT, DELETE) the controller has sent."""
    return len(_WRITE.findall(_log(ctl)))


async def quiesce(ctl: ControllerProcess) -> float:
    """Seconds until the controller has written nothing for ``QUIET_S`` (status catching up)."""
    start = last_change = time.monotonic()
    seen = writes(ctl)
    while time.monotonic() - last_change < QUIET_S:
        await asyncio.sleep(QUIET_S / 10)
        now = writes(ctl)
        if now != seen:
            seen, last_change = now, time.monotonic()
        if time.monotonic() - start > SETTLE_TIMEOUT_S:
            break
    return last_change - start
