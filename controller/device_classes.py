"""One DRA DeviceClass per Configuration, kept while it exists (``--dra``).

Why this exists: a ResourceClaim names a DeviceClass, and the agents' ResourceSlices tell
Configurations apart only by attributes (one driver, ``edgeplug.io``; see ``crds.dra``). So for
each Configuration the controller keeps a class ``<configuration>.<namespace>.edgeplug.io``
whose CEL selector picks that Configuration's devices, and a claim asks for
``deviceClassName: cam.default.edgeplug.io`` plus any selector on the device's attributes.
With ``--dra-extended-resources`` each class also maps the Configuration's configuration-level
resource (``extendedResourceName``), so an unchanged pod asking for ``edgeplug.io/cam`` is
served through DRA on nodes where no device plugin advertises it.

A DeviceClass is cluster-scoped and cannot be owned by a namespaced Configuration (the garbage
collector ignores such a reference), so the controller deletes it itself: when the
Configuration's deletion is watched, and at every (re)list for classes it labelled whose
Configuration is gone (deleted while no controller ran). A controller serving some namespaces
only touches classes of those namespaces. Every write is an idempotent server-side apply, so
two replicas writing at once agree. A cluster whose API server drops ``extendedResourceName``
(DRAExtendedResource off, as on 1.35) is reported once (``crds.dra_features``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from controller.watching import follow_forever
from crds import dra, dra_features
from crds.naming import configuration_resource_name
from crds.resources import ConfigurationResource

log = logging.getLogger(__name__)

DeviceClassResource = create_global_resource(
    "resource.k8s.io", "v1", "DeviceClass", "deviceclasses"
)
FIELD_MANAGER: Final = "edgeplug-controller/device-classes"
#: Wait before listing again after the Configuration watch broke.
RETRY_S: Final = 5.0
HTTP_NOT_FOUND: Final = 404

_Key = tuple[str, str]


class DeviceClasses:
    """Keeps the DeviceClasses equal to the Configurations of ``namespaces`` (empty: all)."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 extended_resources: bool = False) -> None:
        """``extended_resources``: each class also maps the Configuration's configuration-level
        resource (``edgeplug.io/<configuration>`` or its ``resourceName``)."""
        self._client = client
        self._namespaces = frozenset(namespaces)
        self._extended = extended_resources
        self._written: dict[_Key, dict[str, Any]] = {}
        self.features = dra_features.FeatureReport(log)

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    async def run(self) -> None:
        """Forever: list, sync, follow the watch; start over if it breaks."""
        await follow_forever(self._follow, what="device classes", retry_s=RETRY_S)

    def _body(self, data: dict[str, Any]) -> dict[str, Any]:
        namespace, name = _key(data)
        override = (data.get("spec") or {}).get("resourceName") or None
        extended = configuration_resource_name(name, override) if self._extended else None
        return dra.device_class(namespace, name, extended_resource=extended)

    async def _follow(self) -> None:
        wanted: dict[_Key, dict[str, Any]] = {}
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            if self._serves(_key(data)[0]):
                wanted[_key(data)] = self._body(data)
        await self._sweep(set(wanted))
        self._written.clear()
        for key in sorted(wanted):
            await self._apply(key, wanted[key])
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            key = _key(data)
            if not self._serves(key[0]):
                continue
            if op == "DELETED":
                await self._delete(key)
            elif self._written.get(key) != (body := self._body(data)):
                await self._apply(key, body)

    async def _sweep(self, wanted: set[_Key]) -> None:
        """Delete labelled classes whose Configuration (in a served namespace) is gone."""
        async for obj in self._client.list(DeviceClassResource,
                                           labels={dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}):
            body = _as_dict(obj)
            owner = ((body.get("metadata") or {}).get("annotations") or {}).get(
                dra.ANNOTATION_CONFIGURATION, "")
            namespace, _, name = owner.partition("/")
            if namespace and self._serves(namespace) and (namespace, name) not in wanted:
                await self._delete((namespace, name))

    async def _apply(self, key: _Key, body: dict[str, Any]) -> None:
        stored = await self._client.patch(
            DeviceClassResource, body["metadata"]["name"], body, patch_type=PatchType.APPLY,
            field_manager=FIELD_MANAGER, force=True)
        self.features.note(dra_features.dropped_by_device_class(body, _as_dict(stored)),
                           what=f"DeviceClass {body['metadata']['name']}")
        self._written[key] = body
        log.info("DeviceClass %s kept for Configuration %s/%s",
                 body["metadata"]["name"], *key)

    async def _delete(self, key: _Key) -> None:
        self._written.pop(key, None)
        name = dra.device_class_name(*key)
        try:
            await self._client.delete(DeviceClassResource, name)
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
            return
        log.info("DeviceClass %s deleted with Configuration %s/%s", name, *key)


def _key(data: dict[str, Any]) -> _Key:
    meta = data.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else cast(dict[str, Any], obj.to_dict())
