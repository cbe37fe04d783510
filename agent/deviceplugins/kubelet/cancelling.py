"""Keeping a task's cancellation when a library call swallows it.

On Python 3.11 ``asyncio.wait_for`` returns the inner result instead of raising
when a cancellation lands just as the inner future completes, and grpc.aio's
``Server.stop(grace)`` waits for its shutdown through ``wait_for``. A task cancelled while it
stopped a plugin's server then carried on as if never cancelled: the device-plugin service's
reconcile loop went back to sleep and the service never stopped. A cancellation requested while a
call runs shows in ``Task.cancelling()`` even when the call swallowed it; ``cancellation_kept``
raises it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def cancellation_kept() -> Iterator[None]:
    """Raise ``CancelledError`` after the block if this task was asked to stop while it ran
    and the block returned all the same (an exception from the block passes unchanged)."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    yield
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError("cancelled while a call that swallowed it ran")
