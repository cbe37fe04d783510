"""Watches that keep going: the agent's one way to follow a kind of object in the API.

``watch`` reopens a watch after any error, with bounded backoff, and calls ``on_restart`` each time
it starts over so the caller can relist; ``missed_deletions`` helps with that. Why:
docs/architecture.md, "The agent's discovery modules".
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, TypeVar

from lightkube import ApiError, AsyncClient
from lightkube.types import OnErrorAction, OnErrorResult

from agent.metrics import PROCESS
from agent.settings import current

log = logging.getLogger(__name__)

RETRY_JITTER_LOW = 0.5  # each wait is drawn from [ceiling * this, ceiling]
HTTP_GONE = 410  # the watch's resourceVersion is too old: it restarts from the current state
HTTP_TOO_MANY_REQUESTS = 429

_K = TypeVar("_K")


def retry_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failures (1, 2, ...)."""
    api = current().api
    doubled = api.watch_retry_base_s * 2 ** min(max(failures - 1, 0), 10)
    ceiling = min(api.watch_retry_max_s, doubled)
    return float(ceiling * random.uniform(RETRY_JITTER_LOW, 1.0))


def _status_code(error: BaseException) -> int | None:
    if isinstance(error, ApiError):
        return error.status.code
    response = getattr(error, "response", None)  # httpx's HTTPStatusError
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def describe(error: BaseException) -> str:
    """An error as a log line: the HTTP status for API errors, so a 403 reads as one."""
    if isinstance(error, ApiError):
        return f"HTTP {error.status.code} {error.status.reason}: {error.status.message}"
    return f"{type(error).__name__}: {error}"


async def watch(
    client: AsyncClient,
    resource: Any,
    *,
    what: str,
    namespace: str | None = None,
    fields: Mapping[str, str] | None = None,
    labels: Mapping[str, Any] | None = None,
    on_restart: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[str, Any]]:
    """Yield ``(event type, object)`` from a watch of ``resource`` until cancelled."""
    failures = 0

    def restarted() -> None:
        PROCESS.watch_restarted(resource)
        if on_restart is not None:
            on_restart()

    def on_response_error(error: Exception, count: int) -> OnErrorResult:
        # 429 is the API server's "come back shortly" (for example while a new CRD's storage
        # starts): routine, so it does not warn.
        level = logging.INFO if _status_code(error) == HTTP_TOO_MANY_REQUESTS else logging.WARNING
        log.log(level, "watch of %s failed (%s); retrying", what, describe(error))
        if isinstance(error, ApiError) and error.status.code == HTTP_GONE:
            restarted()  # lightkube drops its resourceVersion and starts over
        return OnErrorResult(OnErrorAction.RETRY, sleep=retry_delay(count))

    PROCESS.watch_started(resource)
    while True:
        kwargs: dict[str, Any] = {"on_error": on_response_error}
        if namespace is not None:
            kwargs["namespace"] = namespace
        if fields:
            kwargs["fields"] = dict(fields)
        if labels:
            kwargs["labels"] = dict(labels)
        try:
            async for event in client.watch(resource, **kwargs):
                failures = 0
                PROCESS.watch_event(resource)
                yield event
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a send that failed: reopen rather than die
            failures += 1
            log.warning("watch of %s broke (%s); reopening", what, describe(error))
            await asyncio.sleep(retry_delay(failures))
            restarted()


def missed_deletions(
    before: Mapping[_K, object], current: Mapping[_K, object], listed: Iterable[_K]
) -> list[_K]:
    """Keys a relist shows were deleted while the watch was not looking.

    ``before`` is what was known when the list was sent, ``current`` what is known now. Only
    what was known before the list can be judged by it: an object the watch delivered while the
    list was in flight may be missing from the list, and one the watch replaced meanwhile is
    newer than the list.
    """
    seen = set(listed)
    return [key for key in before if key not in seen and current.get(key) is before[key]]
