"""Routine Events (broker created, broker deleted) gathered into one Event per short window.

Why this exists: at scale one Event per broker is one more API write per Instance (10,000
Instances, 10,000 Event POSTs) for a record nobody reads one by one. Creations and routine
deletions on a Configuration are collected for ``window_s`` and posted as one Event that names
the object when there was one and counts them when there were many. Warnings (failures,
refusals) are never held back; they go straight to the sink.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from controller.view import EventSink

log = logging.getLogger(__name__)

#: Routine Events of one Configuration are gathered for this long.
DEFAULT_EVENT_WINDOW_S: Final = 1.0
#: How many object names one gathered Event lists before "and N more".
NAMES_SHOWN: Final = 5


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

    def __init__(self, sink: EventSink, *, window_s: float = DEFAULT_EVENT_WINDOW_S) -> None:
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
