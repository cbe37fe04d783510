"""Stop an asyncio subprocess the one way the harness does: SIGTERM, a grace, then SIGKILL.

Why this exists: the harness's long-lived helper processes (the kubelet's device manager in
``DeviceNode``, the grpc-go test plugin) must each be given the chance to exit cleanly (the
device manager writes its checkpoint, a plugin closes its socket) and never left behind when
they do not; one function keeps that sequence, and its grace, alike. Likewise an in-process
task (the agent's ``run_agent``, one of its loops) a test runs beside it: ``task_running``
cancels and awaits it however the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


@contextlib.asynccontextmanager
async def task_running(
    coro: Coroutine[Any, Any, T], *, name: str | None = None
) -> AsyncIterator[asyncio.Task[T]]:
    """``coro`` as a task for the block's duration; cancelled and awaited on leaving it."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def terminate(process: asyncio.subprocess.Process | None, *, grace_s: float) -> None:
    """SIGTERM ``process`` and wait up to ``grace_s`` for it to exit, then SIGKILL it.
    Nothing to do for None or a process that has already exited."""
    if process is None or process.returncode is not None:
        return
    process.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
