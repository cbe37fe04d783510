"""Resolve a Configuration's ``discoveryProperties`` from literals, Secrets and ConfigMaps.

Why this exists: handlers need credentials (an ONVIF camera's password) that users keep in
Secrets. The agent reads them just before parsing the handler's details and re-reads them when
a referenced Secret or ConfigMap changes (``ReferenceWatch``), restarting only the runs whose
resolved values actually changed. Values never reach a log line or an error message: errors name
the property and the object, never the content.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from lightkube import ApiError, AsyncClient
from lightkube.core.resource import NamespacedResource
from lightkube.resources.core_v1 import ConfigMap, Secret

from agent import watching
from agent.kube import is_not_found
from crds.configuration import DiscoveryProperty, ValueSourceKind

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Reference:
    """A Secret or ConfigMap a property reads."""

    kind: ValueSourceKind
    namespace: str
    name: str


class PropertyUnavailable(Exception):
    """A non-optional property whose Secret/ConfigMap or key is missing or unreadable."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ResolvedProperties:
    values: Mapping[str, str]
    references: frozenset[Reference]


def references_of(
    *, namespace: str, properties: Sequence[DiscoveryProperty]
) -> frozenset[Reference]:
    """The Secrets and ConfigMaps ``properties`` read, whether or not they exist yet."""
    return frozenset(
        Reference(p.value_from.kind, p.value_from.namespace or namespace, p.value_from.name)
        for p in properties
        if p.value_from is not None
    )


async def resolve_properties(
    client: AsyncClient, *, namespace: str, properties: Sequence[DiscoveryProperty]
) -> ResolvedProperties:
    """Read every property; optional ones whose source is missing are left out."""
    values: dict[str, str] = {}
    references: set[Reference] = set()
    for index, prop in enumerate(properties):
        field = f"discoveryProperties[{index}] ({prop.name})"
        if prop.value_from is None:
            values[prop.name] = prop.value or ""
            continue
        source = prop.value_from
        ref = Reference(source.kind, source.namespace or namespace, source.name)
        references.add(ref)
        value = await _read(client, ref, source.key, field=field)
        if value is not None:
            values[prop.name] = value
        elif not source.optional:
            raise PropertyUnavailable(
                field, f"{ref.kind} {ref.namespace}/{ref.name} has no key {source.key!r}"
            )
    return ResolvedProperties(values, frozenset(references))


async def _read(client: AsyncClient, ref: Reference, key: str, *, field: str) -> str | None:
    resource: type[Secret] | type[ConfigMap] = (
        Secret if ref.kind is ValueSourceKind.SECRET else ConfigMap
    )
    try:
        obj = await client.get(resource, ref.name, namespace=ref.namespace)
    except ApiError as exc:
        if is_not_found(exc):
            return None
        raise PropertyUnavailable(
            field, f"cannot read {ref.kind} {ref.namespace}/{ref.name}: {exc.status.reason}"
        ) from exc
    if isinstance(obj, Secret):
        encoded = (obj.data or {}).get(key)
        if encoded is None:
            return (obj.stringData or {}).get(key)
        try:
            return base64.b64decode(encoded).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise PropertyUnavailable(field, f"key {key!r} is not UTF-8 text") from exc
    assert isinstance(obj, ConfigMap)
    if obj.data and key in obj.data:
        text: str = obj.data[key]
        return text
    if obj.binaryData and key in obj.binaryData:
        raw: str = obj.binaryData[key]
        return base64.b64decode(raw).decode("utf-8", errors="replace")
    return None


ChangeCallback = Callable[[Reference], Awaitable[None]]


class ReferenceWatch:
    """Watches Secrets and ConfigMaps (lazily, one watch per kind once a run needs it).

    Calls ``on_change(reference)`` for every added, modified or deleted object some run refers
    to; the callee re-resolves and decides whether anything changed.
    """

    def __init__(self, *, client: AsyncClient, namespace: str | None, on_change: ChangeCallback):
        self._client = client
        self._namespace = namespace
        self._on_change = on_change
        self._wanted: dict[object, frozenset[Reference]] = {}
        self._tasks: dict[ValueSourceKind, asyncio.Task[None]] = {}

    def track(self, owner: object, references: frozenset[Reference]) -> None:
        """Declare what ``owner`` (a run key) refers to now; an empty set forgets it."""
        if references:
            self._wanted[owner] = references
        else:
            self._wanted.pop(owner, None)
        for ref in references:
            if ref.kind not in self._tasks:
                self._tasks[ref.kind] = asyncio.create_task(
                    self._watch(ref.kind), name=f"watch-{ref.kind}"
                )

    def _referenced(self, ref: Reference) -> bool:
        return any(ref in refs for refs in self._wanted.values())

    async def _watch(self, kind: ValueSourceKind) -> None:
        resource: type[NamespacedResource] = Secret if kind is ValueSourceKind.SECRET else ConfigMap
        stream = watching.watch(
            self._client, resource, what=str(kind), namespace=self._namespace or "*"
        )
        async for _op, obj in stream:
            meta = getattr(obj, "metadata", None)
            if meta is None or meta.name is None or meta.namespace is None:
                continue
            ref = Reference(kind, meta.namespace, meta.name)
            if self._referenced(ref):
                await self._on_change(ref)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
