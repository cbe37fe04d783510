"""Resolve a Configuration's ``discoveryProperties`` from literals, Secrets and ConfigMaps.

``resolve_properties`` reads them (Secret values as ``contract.Secret``, never shown);
``ReferenceWatch`` follows the objects named so only runs whose values changed restart. Errors name
the property and the object, never a value (docs/architecture.md, "The agent's discovery modules").
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

from agent.kube import watching
from agent.kube.client import is_not_found
from crds.configuration import DiscoveryProperty, ValueSourceKind
from discovery_handlers.contract import PropertyValue
from discovery_handlers.contract import Secret as SecretValue

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
    values: Mapping[str, PropertyValue]
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
    values: dict[str, PropertyValue] = {}
    references: set[Reference] = set()
    for index, prop in enumerate(properties):
        field = f"discoveryProperties[{index}] ({prop.name})"
        if prop.value_from is None:
            values[prop.name] = prop.value or ""
            continue
        source = prop.value_from
        ref = Reference(source.kind, source.namespace or namespace, source.name)
        references.add(ref)
        try:
            values[prop.name] = await _read(client, ref, source.key, field=field)
        except _Missing as missing:
            if not source.optional:
                raise PropertyUnavailable(field, str(missing)) from None
    return ResolvedProperties(values, frozenset(references))


class _Missing(Exception):
    """The object or its key is not there (which an ``optional`` source tolerates)."""


async def _read(client: AsyncClient, ref: Reference, key: str, *, field: str) -> PropertyValue:
    resource: type[Secret] | type[ConfigMap] = (
        Secret if ref.kind is ValueSourceKind.SECRET else ConfigMap
    )
    try:
        obj = await client.get(resource, ref.name, namespace=ref.namespace)
    except ApiError as exc:
        if is_not_found(exc):
            raise _Missing(f"{ref.kind} {ref.namespace}/{ref.name} does not exist") from None
        raise PropertyUnavailable(
            field, f"cannot read {ref.kind} {ref.namespace}/{ref.name}: {exc.status.reason}"
        ) from exc
    no_key = _Missing(f"{ref.kind} {ref.namespace}/{ref.name} has no key {key!r}")
    if isinstance(obj, Secret):
        encoded = (obj.data or {}).get(key)
        if encoded is None:
            text = (obj.stringData or {}).get(key)
            if text is None:
                raise no_key
            return SecretValue(text.encode("utf-8"))
        try:
            return SecretValue(base64.b64decode(encoded, validate=True))
        except binascii.Error as exc:
            raise PropertyUnavailable(field, f"key {key!r} is not valid base64") from exc
    assert isinstance(obj, ConfigMap)
    if obj.data and key in obj.data:
        text_value: str = obj.data[key]
        return text_value
    if obj.binaryData and key in obj.binaryData:
        raw: str = obj.binaryData[key]
        return base64.b64decode(raw).decode("utf-8", errors="replace")
    raise no_key


ChangeCallback = Callable[[Reference], Awaitable[None]]


class ReferenceWatch:
    """Watches exactly the Secrets and ConfigMaps some run refers to, each by name.

    One watch per referenced object (``metadata.name`` field selector, in its namespace) rather
    than one per kind across the cluster: the agent's rights then need only the named objects
    (the controller grants them per namespace, see deploy/README.md), and the agent is never
    sent every Secret of the cluster. Calls ``on_change(reference)`` for every added, modified
    or deleted event; the callee re-resolves and decides whether anything changed.
    """

    def __init__(self, *, client: AsyncClient, on_change: ChangeCallback,
                 ready: asyncio.Event | None = None):
        #: Reads and watches go as this client: this node's own account where it has one,
        #: whose first token is there once ``ready`` is set (None: at once).
        self._client = client
        self._ready = ready
        self._on_change = on_change
        self._wanted: dict[object, frozenset[Reference]] = {}
        self._tasks: dict[Reference, asyncio.Task[None]] = {}

    async def resolve(self, *, namespace: str, properties: Sequence[DiscoveryProperty]
                      ) -> ResolvedProperties:
        """``resolve_properties`` with the reads' identity (this node's own account, where
        the agent has one: ``agent.kube.node_account``)."""
        if self._ready is not None and any(p.value_from for p in properties):
            await self._ready.wait()
        return await resolve_properties(self._client, namespace=namespace,
                                        properties=properties)

    def track(self, owner: object, references: frozenset[Reference]) -> None:
        """Declare what ``owner`` (a run key) refers to now; an empty set forgets it."""
        if references:
            self._wanted[owner] = references
        else:
            self._wanted.pop(owner, None)
        wanted = frozenset().union(*self._wanted.values())
        for ref in wanted - set(self._tasks):
            self._tasks[ref] = asyncio.create_task(
                self._watch(ref), name=f"watch-{ref.kind}-{ref.namespace}/{ref.name}"
            )
        for ref in set(self._tasks) - wanted:
            self._tasks.pop(ref).cancel()

    async def _watch(self, ref: Reference) -> None:
        if self._ready is not None:
            await self._ready.wait()
        resource: type[NamespacedResource] = (
            Secret if ref.kind is ValueSourceKind.SECRET else ConfigMap
        )
        stream = watching.watch(
            self._client, resource, what=f"{ref.kind} {ref.namespace}/{ref.name}",
            namespace=ref.namespace, fields={"metadata.name": ref.name},
        )
        async for _op, _obj in stream:
            await self._on_change(ref)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
