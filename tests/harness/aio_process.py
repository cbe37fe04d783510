"""Stop a subprocess the one way the harness does: SIGTERM, a grace, then SIGKILL.

The harness's long-lived helper processes (the kubelet's device manager in
``DeviceNode``, the grpc-go test plugin, the agent and handlers as processes, simulators in
network namespaces) must each be given the chance to exit cleanly (the device manager writes
its checkpoint, a plugin closes its socket) and never left behind when they do not; one
function for asyncio's processes (``terminate``) and one for ``subprocess.Popen``
(``stop_popen``) keep that sequence, and its grace, alike. Likewise an in-process
task (the agent's ``run_agent``, one of its loops) a test runs beside it: ``task_running``
cancels and awaits it however the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
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
        await cancel_and_wait(task)


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel every task, then await each (its cancellation is not an error)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def terminate(process: asyncio.subprocess.Process | None, *, grace_s: float,
                    signal_number: int = signal.SIGTERM) -> None:
    """SIGTERM (or ``signal_number``) ``process`` and wait up to ``grace_s`` for it to exit,
    then SIGKILL it. Nothing to do for None or a process that has already exited."""
    if process is None or process.returncode is not None:
        return
    process.send_signal(signal_number)
    try:
        async with asyncio.timeout(grace_s):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def stop_popen(process: subprocess.Popen[Any] | None, *, grace_s: float) -> None:
    """``terminate`` for a ``subprocess.Popen``: SIGTERM, up to ``grace_s`` to exit, SIGKILL."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)


class ChildProcess:
    """A harness helper that runs one ``subprocess.Popen`` (``process``, None until started):
    ``kill`` (SIGKILL, as a crash) and ``stop`` (``stop_popen`` with ``grace_s``) alike."""

    process: subprocess.Popen[bytes] | None = None
    grace_s: float = 10.0

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(self.grace_s)

    def stop(self) -> None:
        stop_popen(self.process, grace_s=self.grace_s)
