"""Kubernetes Events on Configurations: posted in the background, routine ones gathered.

``EventPoster`` writes an Event without making the reconcile wait; ``EventBatcher.routine`` gathers
routine creations and deletions into one Event (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from controller.state.view import EventSink

log = logging.getLogger(__name__)

#: How many object names one gathered Event lists before "and N more".
NAMES_SHOWN: Final = 5
#: The API server refuses an Event message longer than this.
MESSAGE_MAX: Final = 1024


@dataclass
class _Pending:
    body: Mapping[str, Any]
    names: list[str] = field(default_factory=list)
    detail: str = ""


def summary(verb: str, kind: str, names: list[str], detail: str) -> str:
    """``created pod a`` for one, ``created 3 pods: a, b, c`` for several."""
    noun = kind.lower()
    if len(names) == 1:
        text = f"{verb} {noun} {names[0]}"
        return f"{text}: {detail}" if detail else text
    shown = ", ".join(names[:NAMES_SHOWN])
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    why = f" ({detail})" if detail else ""
    return f"{verb} {len(names)} {noun}s{why}: {shown}{more}"


class EventBatcher:
    """Gathers routine Events per (Configuration, reason) and posts them through ``sink``."""

    def __init__(self, sink: EventSink, *, window_s: float) -> None:
        self._sink = sink
        self._window_s = window_s
        self._pending: dict[tuple[str, str, str, str], _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def routine(
        self, body: Mapping[str, Any], *, reason: str, verb: str, kind: str, name: str,
        detail: str = "",
    ) -> None:
        """Adds one object to the next ``reason`` Event on the Configuration ``body``."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")), reason,
               f"{verb}\0{kind}\0{detail}")
        pending = self._pending.get(key)
        if pending is not None:
            pending.body = body
            pending.names.append(name)
            return
        self._pending[key] = _Pending(body=body, names=[name], detail=detail)
        task = asyncio.get_running_loop().create_task(self._flush_later(key, verb, kind))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_later(self, key: tuple[str, str, str, str], verb: str, kind: str) -> None:
        await asyncio.sleep(self._window_s)
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        try:
            self._sink(pending.body, warning=False, reason=key[2],
                       message=summary(verb, kind, pending.names, pending.detail))
        except Exception as error:  # a background task: an Event is not worth a crash
            log.warning("Event %s not posted: %s", key[2], error)


def event_object(
    body: Mapping[str, Any], *, warning: bool, reason: str, message: str, component: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about the object ``body`` (its apiVersion, kind and metadata)."""
    meta = body.get("metadata") or {}
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": meta.get("namespace") or "default",
                     "generateName": f"{meta.get('name', 'edgeplug')}."},
        "involvedObject": {
            "apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
        },
        "type": "Warning" if warning else "Normal",
        "reason": reason,
        "message": message[:MESSAGE_MAX],
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventPoster:
    """An :class:`EventSink` that writes each Event through ``create`` in the background."""

    def __init__(
        self, create: Callable[[Mapping[str, Any]], Awaitable[None]], *, component: str
    ) -> None:
        self._create = create
        self._component = component
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(
        self, body: Mapping[str, Any], *, warning: bool, reason: str, message: str
    ) -> None:
        event = event_object(body, warning=warning, reason=reason, message=message,
                             component=self._component)
        task = asyncio.get_running_loop().create_task(self._post(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, event: Mapping[str, Any]) -> None:
        try:
            await self._create(event)
        except Exception as error:  # a background task: an Event is not worth a crash
            log.warning("Event %s not posted: %s", event.get("reason"), error)
