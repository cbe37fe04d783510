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

The class write is also how the controller learns whether the cluster can allocate shared
devices through the scheduler: each Configuration's ``status.sharedDeviceAllocation`` and
``SharedDeviceAllocation`` condition follow from it (``controller.shared_allocation``), and the
shared Instances of those served by DRA get a class each (``controller.instance_classes``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from controller import shared_allocation
from controller.instance_classes import DeviceClassResource, InstanceClasses, as_dict, object_key
from controller.watching import follow_forever
from crds import dra, dra_features
from crds.configuration import SharedDeviceAllocation
from crds.naming import configuration_resource_name
from crds.resources import ConfigurationResource

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "edgeplug-controller/device-classes"
#: Wait before listing again after the Configuration watch broke.
RETRY_S: Final = 5.0
HTTP_NOT_FOUND: Final = 404

_Key = tuple[str, str]


class DeviceClasses:
    """Keeps the DeviceClasses equal to the Configurations of ``namespaces`` (empty: all), and
    each Configuration's ``status.sharedDeviceAllocation`` equal to what the cluster serves."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 extended_resources: bool = False) -> None:
        """``extended_resources``: a class whose Configuration's shared devices go through the
        device plugins maps its configuration-level resource too (one served through DRA
        always does)."""
        self._client = client
        self._namespaces = frozenset(namespaces)
        self._extended = extended_resources
        self._written: dict[_Key, dict[str, Any]] = {}
        #: What the API server lacks for DRA, per Configuration, from its last class write.
        self._missing: dict[_Key, str | None] = {}
        self.features = dra_features.FeatureReport(log)
        self.instances = InstanceClasses(client, namespaces=self._namespaces)

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    async def run(self) -> None:
        """Forever: list, sync, follow the watch; start over if it breaks. Beside it, the
        per-Instance classes of shared devices the scheduler allocates."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.instances.run(), name="instance-classes")
            tasks.create_task(follow_forever(self._follow, what="device classes",
                                             retry_s=RETRY_S), name="device-classes")

    def _body(self, data: dict[str, Any]) -> dict[str, Any]:
        namespace, name = object_key(data)
        spec = data.get("spec") or {}
        asked = spec.get("sharedDeviceAllocation")
        mapped = self._extended or asked != SharedDeviceAllocation.DEVICE_PLUGIN.value
        extended = (configuration_resource_name(name, spec.get("resourceName") or None)
                    if mapped else None)
        return dra.device_class(namespace, name, extended_resource=extended)

    async def _follow(self) -> None:
        wanted: dict[_Key, tuple[dict[str, Any], dict[str, Any]]] = {}
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            data = as_dict(obj)
            if self._serves(object_key(data)[0]):
                wanted[object_key(data)] = (self._body(data), data)
        await self._sweep(set(wanted))
        self._written.clear()
        for key in sorted(wanted):
            await self._apply(key, *wanted[key])
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = as_dict(obj)
            key = object_key(data)
            if not self._serves(key[0]):
                continue
            if op == "DELETED":
                await self._delete(key)
            elif self._written.get(key) != (body := self._body(data)):
                await self._apply(key, body, data)
            else:
                await self._report(key, data)

    async def _sweep(self, wanted: set[_Key]) -> None:
        """Delete labelled classes whose Configuration (in a served namespace) is gone."""
        async for obj in self._client.list(DeviceClassResource,
                                           labels={dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}):
            body = as_dict(obj)
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            if dra.ANNOTATION_INSTANCE in annotations:
                continue  # a shared Instance's class: InstanceClasses keeps those
            namespace, _, name = annotations.get(dra.ANNOTATION_CONFIGURATION, "").partition("/")
            if namespace and self._serves(namespace) and (namespace, name) not in wanted:
                await self._delete((namespace, name))

    async def _apply(self, key: _Key, body: dict[str, Any], data: dict[str, Any]) -> None:
        try:
            stored = await self._client.patch(
                DeviceClassResource, body["metadata"]["name"], body, patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER, force=True)
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
            self._missing[key] = ("the API server does not serve resource.k8s.io/v1 "
                                  "DeviceClasses")
            await self._report(key, data)
            return
        dropped = dra_features.dropped_by_device_class(body, as_dict(stored))
        self.features.note(dropped, what=f"DeviceClass {body['metadata']['name']}")
        if body["spec"].get("extendedResourceName"):
            self._missing[key] = (
                "the API server drops DeviceClass spec.extendedResourceName (feature gate "
                "DRAExtendedResource off)" if dropped else None)
        else:
            self._missing.setdefault(key, None)
        self._written[key] = body
        log.info("DeviceClass %s kept for Configuration %s/%s",
                 body["metadata"]["name"], *key)
        await self._report(key, data)

    async def _report(self, key: _Key, data: dict[str, Any]) -> None:
        """Write the Configuration's allocator to its status where it does not say it yet."""
        asked_text = (data.get("spec") or {}).get("sharedDeviceAllocation")
        asked = SharedDeviceAllocation(asked_text) if asked_text else None
        decision = shared_allocation.decide(asked, missing=self._missing.get(key))
        self.instances.set_mode(key, decision.mode)
        current = data.get("status") or {}
        if shared_allocation.is_current(current, decision):
            return
        patch = shared_allocation.status_patch(
            *key, decision, generation=int((data.get("metadata") or {}).get("generation") or 0),
            current=current, now=datetime.now(UTC))
        try:
            await self._client.patch(
                ConfigurationResource.Status, key[1], patch, namespace=key[0],
                patch_type=PatchType.APPLY, field_manager=shared_allocation.FIELD_MANAGER,
                force=True)
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
            return
        log.info("Configuration %s/%s: shared devices allocated by %s (%s)", *key,
                 decision.mode.value, decision.reason)

    async def _delete(self, key: _Key) -> None:
        self._written.pop(key, None)
        self._missing.pop(key, None)
        self.instances.set_mode(key, None)
        name = dra.device_class_name(*key)
        try:
            await self._client.delete(DeviceClassResource, name)
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
            return
        log.info("DeviceClass %s deleted with Configuration %s/%s", name, *key)
