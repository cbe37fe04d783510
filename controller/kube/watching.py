"""List-then-watch of one kind of object into a store of small records: the controller's eyes.

A ``Watcher`` lists in pages, watches from the list's version with bookmarks, resumes after a
dropped connection, relists on 410 Gone and never gives up; ``on_change`` is called only when a
record changed. Why not kopf's per-object handling: docs/architecture.md, "Design choices"."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgspec

from controller.kube.rest import ApiFailure, Rest, status_message
from controller.metrics import PROCESS
from controller.settings import ApiSettings

log = logging.getLogger(__name__)

#: Objects per list page (the API server's own default page for clients is 500).
LIST_PAGE_SIZE: Final = 500
HTTP_OK: Final = 200
HTTP_GONE: Final = 410

R = TypeVar("R")
K = TypeVar("K")


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(name="continue", default="")


class _List(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Status(msgspec.Struct):
    code: int = 0
    message: str = ""


class _VersionMeta(msgspec.Struct):
    resourceVersion: str = ""


class _Versioned(msgspec.Struct):
    metadata: _VersionMeta = msgspec.field(default_factory=_VersionMeta)


_decode_list = msgspec.json.Decoder(_List).decode
_decode_event = msgspec.json.Decoder(_Event).decode
_decode_status = msgspec.json.Decoder(_Status).decode
_decode_version = msgspec.json.Decoder(_Versioned).decode


async def follow_forever(
    follow: Callable[[], Awaitable[None]], *, what: str, retry_s: float
) -> None:
    """Run ``follow`` (a list, then a watch) again and again: any error but cancellation is
    logged and followed by a fresh start after ``retry_s`` (the API server away, a 403)."""
    while True:
        try:
            await follow()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # keep serving, retry
            log.warning("%s: Configuration watch broke (%s); retrying", what, error)
        await asyncio.sleep(retry_s)


def retry_delay(failures: int, settings: ApiSettings) -> float:
    """Seconds to wait after ``failures`` consecutive failed attempts (1, 2, ...): doubling, and
    short enough at most to notice a returning server quickly."""
    return float(min(settings.watch_retry_max_s,
                     settings.watch_retry_first_s * 2 ** min(max(failures - 1, 0), 10)))


@dataclass(frozen=True)
class Kind(Generic[K, R]):
    """How to follow one kind: where, which objects, how to decode and key a record.

    ``decode`` returns the record and the object's resourceVersion; the record is None for an
    object the controller does not keep (it is then treated as absent). ``key`` must not depend
    on fields that change during the object's life.
    """

    name: str
    path: str
    decode: Callable[[bytes], tuple[R | None, str]]
    key: Callable[[R], K]
    label_selector: str = ""
    field_selector: str = ""


ChangeHandler = Callable[[K, R | None, R | None], None]


class Watcher(Generic[K, R]):
    """Keeps ``store`` equal to the API server's objects of one kind, calling ``on_change(key,
    old, new)`` (``old`` None: appeared; ``new`` None: vanished) for each record that changed."""

    def __init__(
        self, *, http: Rest, kind: Kind[K, R], on_change: ChangeHandler[K, R]
    ) -> None:
        self.http = http
        self.kind = kind
        self.on_change = on_change
        self.store: dict[K, R] = {}
        self.synced = asyncio.Event()
        self.version = ""
        self.events = 0
        self.lists = 0

    def _params(self, **extra: str) -> dict[str, str]:
        params = dict(extra)
        if self.kind.label_selector:
            params["labelSelector"] = self.kind.label_selector
        if self.kind.field_selector:
            params["fieldSelector"] = self.kind.field_selector
        return params

    async def run(self) -> None:
        """Follows the kind until cancelled; never ends on an API error."""
        failures = 0
        while True:
            try:
                if not self.version:
                    await self._list()
                    self.synced.set()
                await self._watch()
                failures = 0
            except Gone:
                log.info("%s: watch expired; listing again", self.kind.name)
                self.version = ""
                PROCESS.watch_restarts.labels(self.kind.name).inc()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # an outage, a 5xx, a garbage reply: retry, never die
                failures += 1
                PROCESS.watch_restarts.labels(self.kind.name).inc()
                delay = retry_delay(failures, self.http.settings)
                log.warning("%s: %s: %s; retrying in %.2gs", self.kind.name,
                            type(error).__name__, error, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        fresh: dict[K, R] = {}
        cont = ""
        while True:
            params = self._params(limit=str(LIST_PAGE_SIZE))
            if cont:
                params["continue"] = cont
            code, body = await self.http.request("GET", self.kind.path, params=params)
            if code == HTTP_GONE:  # the continue token expired mid-list
                cont, fresh = "", {}
                continue
            if code != HTTP_OK:
                raise ApiFailure(code, status_message(code, body))
            page = _decode_list(body)
            for raw in page.items:
                record, _ = self._decode(bytes(raw))
                if record is not None:
                    fresh[self.kind.key(record)] = record
            cont = page.metadata.continue_
            if not cont:
                self.version = page.metadata.resourceVersion
                break
            await asyncio.sleep(0)  # let other work run between pages
        self.lists += 1
        old = self.store
        self.store = fresh
        for key, record in fresh.items():
            before = old.get(key)
            if before != record:
                self._notify(key, before, record)
        for key, before in old.items():
            if key not in fresh:
                self._notify(key, before, None)

    async def _watch(self) -> None:
        # The API server keeps one watch open this long (jittered, so watches do not all
        # reconnect together); a quiet watch then resumes from its last bookmark.
        timing = self.http.settings
        timeout_s = timing.watch_timeout_s + random.randint(0, timing.watch_timeout_jitter_s)
        params = self._params(
            watch="1", allowWatchBookmarks="true", resourceVersion=self.version,
            timeoutSeconds=str(timeout_s),
        )
        read_timeout_s = timeout_s + timing.watch_read_margin_s
        async with self.http.stream(self.kind.path, params=params,
                                    read_timeout_s=read_timeout_s) as (code, body):
            if code == HTTP_GONE:
                raise Gone()
            if code != HTTP_OK:
                raise ApiFailure(code, status_message(code, await body.read()))
            async for line in body:
                if line.strip():
                    self._event(line)

    def _event(self, line: bytes) -> None:
        event = _decode_event(line)
        raw = bytes(event.object)
        if event.type == "ERROR":
            status = _decode_status(raw)
            if status.code == HTTP_GONE:
                raise Gone()
            raise RuntimeError(f"watch error {status.code}: {status.message}")
        if event.type == "BOOKMARK":
            self.version = _decode_version(raw).metadata.resourceVersion or self.version
            return
        self.events += 1
        record, version = self._decode(raw)
        if version:
            self.version = version
        if record is None:
            return
        key = self.kind.key(record)
        before = self.store.get(key)
        if event.type == "DELETED":
            if key in self.store:
                del self.store[key]
                self._notify(key, before, None)
            return
        if before != record:
            self.store[key] = record
            self._notify(key, before, record)

    def _decode(self, raw: bytes) -> tuple[R | None, str]:
        try:
            return self.kind.decode(raw)
        except (msgspec.DecodeError, ValueError, KeyError, TypeError) as error:
            # A malformed object must not stop the watch: skip it, say which kind.
            log.warning("%s: an object could not be read, skipped: %s", self.kind.name, error)
            return None, ""

    def _notify(self, key: K, old: R | None, new: R | None) -> None:
        try:
            self.on_change(key, old, new)
        except Exception:  # a bug in a handler must not stop the watch
            log.exception("%s: handling a change of %s failed", self.kind.name, key)


def namespaced_path(prefix: str, plural: str, namespace: str | None) -> str:
    """``/api/v1/pods`` or ``/api/v1/namespaces/<ns>/pods`` (``prefix`` is the group path)."""
    if namespace is None:
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def selector(labels: Mapping[str, Any]) -> str:
    """A label selector string; a value of None means "the label exists"."""
    return ",".join(key if value is None else f"{key}={value}" for key, value in labels.items())
