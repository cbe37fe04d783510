"""When each Instance of a namespace appeared on the API server, as a watch saw it.

The ONVIF and OPC-UA benchmarks time "a device appears → its Instance exists on the API server"
the same way: a watch, opened before the clock starts, records the moment it first sees each
Instance (and forgets one when it is deleted), and the benchmark waits on that record with a
deadline. One implementation keeps those figures comparable and their scaffolding in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from crds.resources import InstanceResource
from tests.harness.controller_process import apply
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import until

#: How long any one Instance may take to appear or go (a busy 2-core machine; never pass/fail).
DEADLINE_S = 120.0
#: Pause before reopening a watch that failed (429 while the API server warms up).
WATCH_REOPEN_S = 0.2
#: Pause between two looks at the record: a dict the watch fills, no I/O.
POLL_S = 0.005


class InstanceTimes:
    """Use as ``async with InstanceTimes(kubeconfig, namespace) as times``: ``times.seen`` maps
    each live Instance's name to the ``time.monotonic()`` at which the watch first saw it."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self._client = AsyncClient(KubeConfig.from_file(str(kubeconfig)))
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> InstanceTimes:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.close()

    async def _watch(self) -> None:
        while True:
            try:
                async for kind, obj in self._client.watch(InstanceResource,
                                                          namespace=self.namespace):
                    name = obj.metadata.name if obj.metadata else None
                    if name and kind == "DELETED":
                        self.seen.pop(name, None)
                    elif name:
                        self.seen.setdefault(name, time.monotonic())
            except Exception:  # 429 while the API server warms up: reopen
                await asyncio.sleep(WATCH_REOPEN_S)

    async def wait(self, check: Any, what: str) -> None:
        """Until ``check()`` holds (it reads ``seen``); fails naming ``what`` after the deadline."""
        await until(check, what=what, within=DEADLINE_S, poll=POLL_S)

    async def appeared(self, name: str) -> float:
        """When the Instance ``name`` was first seen, once it has been."""
        await self.wait(lambda: name in self.seen, f"Instance {name}")
        return self.seen[name]

    async def gone(self, name: str) -> None:
        """Once the Instance ``name`` was seen deleted."""
        await self.wait(lambda: name not in self.seen, f"Instance {name} deleted")


def apply_configuration(plane: ControlPlane, namespace: str, name: str, handler: str,
                        details: str, **spec: Any) -> None:
    """Apply a Configuration of ``handler`` with these discoveryDetails (and other spec fields)."""
    apply(plane, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"discoveryHandler": {"name": handler, "discoveryDetails": details}, **spec},
    })
