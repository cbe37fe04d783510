"""One DRA DeviceClass per Configuration, kept while it exists (``--dra``), and the allocator
each Configuration gets from what the API server keeps of it.

``DeviceClasses.run`` keeps the classes, each Configuration's ``status.allocator`` and, through
``instance_classes`` and ``controller.dra.shared_pools``, the per-Instance classes and shared pools.
Why classes are deleted by the controller and how the write decides the allocator:
docs/architecture.md, "The controller's DRA side"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from controller.dra import shared_allocation
from controller.dra.instance_classes import (
    DeviceClassResource,
    InstanceClasses,
    as_dict,
    delete_class,
    object_key,
)
from controller.dra.shared_pools import SharedPools
from controller.kube.watching import follow_forever
from controller.settings import DraSettings
from crds import dra, dra_features
from crds.configuration import Allocator, asked_allocator, eviction_grace
from crds.naming import configuration_resource_name
from crds.resources import ConfigurationResource

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "edgeplug-controller/device-classes"
HTTP_NOT_FOUND: Final = 404
#: The class a dry-run apply asks the API server about (never stored).
PROBE_CLASS: Final = "edgeplug-probe.edgeplug.io"

_Key = tuple[str, str]


class DeviceClasses:
    """Keeps the DeviceClasses equal to the Configurations of ``namespaces`` (empty: all), and
    each Configuration's ``status.allocator`` equal to what the cluster serves."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 extended_resources: bool = False, settings: DraSettings | None = None) -> None:
        """``extended_resources``: every class maps its Configuration's configuration-level
        resource (by default only those whose devices the scheduler allocates do)."""
        self._settings = settings or DraSettings()
        self._client = client
        self._namespaces = frozenset(namespaces)
        self._extended = extended_resources
        self._written: dict[_Key, dict[str, Any]] = {}
        self._configurations: dict[_Key, dict[str, Any]] = {}
        #: Configurations whose devices the scheduler allocates → the resource mapped.
        self._through_dra: dict[_Key, str] = {}
        #: What the API server lacks for DRA's extended-resource mapping (None: nothing), from
        #: the probe at every (re)list.
        self._missing: shared_allocation.Missing | None = None
        self.features = dra_features.FeatureReport(log)
        self.pools = SharedPools(client, namespaces=self._namespaces, settings=self._settings)
        self.instances = InstanceClasses(client, namespaces=self._namespaces, pools=self.pools,
                                         settings=self._settings)

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    def scheduler_resources(self) -> frozenset[str]:
        """The extended resources the scheduler allocates through the classes kept now: the
        Configurations' mapped resources and their Instances' own."""
        return frozenset(self._through_dra.values()) | self.instances.resources()

    async def run(self) -> None:
        """Forever: list, sync, follow the watch; start over if it breaks. Beside it, the
        per-Instance classes of devices the scheduler allocates, and the shared pools."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.instances.run(), name="instance-classes")
            tasks.create_task(self.pools.run(), name="shared-pools")
            tasks.create_task(follow_forever(
                self._follow, what="device classes", retry_s=self._settings.classes_retry_s),
                name="device-classes")

    def _decision(self, data: dict[str, Any]) -> shared_allocation.Decision:
        return shared_allocation.decide(asked_allocator(data.get("spec") or {}),
                                        missing=self._missing)

    def _body(self, key: _Key, data: dict[str, Any]) -> dict[str, Any]:
        """The class; it maps the configuration-level resource where the scheduler allocates
        the Configuration's devices (where the kubelets do, the resource is their device
        plugins' alone), or everywhere with ``extended_resources``; notes which
        Configurations the scheduler allocates for (``scheduler_resources``)."""
        spec = data.get("spec") or {}
        through_dra = self._decision(data).mode == Allocator.DRA
        resource = configuration_resource_name(key[1], spec.get("resourceName") or None)
        if through_dra:
            self._through_dra[key] = resource
        else:
            self._through_dra.pop(key, None)
        return dra.device_class(*key, extended_resource=resource
                                if self._extended or through_dra else None)

    async def _probe(self) -> None:
        """Ask the API server (a dry-run apply) whether it keeps ``extendedResourceName``."""
        probe = dra.device_class("", "probe", extended_resource=f"{dra.DRIVER}/probe")
        probe["metadata"]["name"] = PROBE_CLASS
        try:
            stored = await self._client.patch(
                DeviceClassResource, PROBE_CLASS, probe, patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER, force=True, dry_run=True)
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
            self._missing = shared_allocation.NO_RESOURCE_API
            return
        dropped = dra_features.dropped_by_device_class(probe, as_dict(stored))
        self.features.note(dropped, what="DeviceClass (dry run)")
        self._missing = shared_allocation.NO_EXTENDED_RESOURCES if dropped else None

    async def _follow(self) -> None:
        await self._probe()
        listed: dict[_Key, dict[str, Any]] = {}
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            data = as_dict(obj)
            if self._serves(object_key(data)[0]):
                listed[object_key(data)] = data
        self._configurations = listed
        await self._sweep(set(listed))
        self._written.clear()
        for key in sorted(listed):
            await self._keep(key, listed[key])
        for key in sorted(set(self.pools.modes()) - set(listed)):
            self.instances.set_mode(key, None)  # went while the watch was broken
            self.pools.set_eviction_grace(key, None)
        self.pools.modes_listed()
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = as_dict(obj)
            key = object_key(data)
            if not self._serves(key[0]):
                continue
            if op == "DELETED":
                self._configurations.pop(key, None)
                await self._delete(key)
            else:
                self._configurations[key] = data
                await self._keep(key, data)

    async def _keep(self, key: _Key, data: dict[str, Any]) -> None:
        """The class as the Configuration wants it, then its allocator in its status."""
        decision = self._decision(data)
        self.instances.set_mode(key, decision.mode)
        self.pools.set_eviction_grace(key, eviction_grace(data.get("spec") or {}))
        body = self._body(key, data)
        served = self._missing != shared_allocation.NO_RESOURCE_API
        if served and self._written.get(key) != body:
            await self._apply(key, body)
        await self._report(key, data, decision)

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

    async def _apply(self, key: _Key, body: dict[str, Any]) -> None:
        stored = await self._client.patch(
            DeviceClassResource, body["metadata"]["name"], body, patch_type=PatchType.APPLY,
            field_manager=FIELD_MANAGER, force=True)
        self.features.note(dra_features.dropped_by_device_class(body, as_dict(stored)),
                           what=f"DeviceClass {body['metadata']['name']}")
        self._written[key] = body
        log.info("DeviceClass %s kept for Configuration %s/%s",
                 body["metadata"]["name"], *key)

    async def _report(self, key: _Key, data: dict[str, Any],
                      decision: shared_allocation.Decision) -> None:
        """Write the Configuration's allocator to its status where it does not say it yet."""
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
        self._through_dra.pop(key, None)
        self.instances.set_mode(key, None)
        self.pools.set_eviction_grace(key, None)
        name = dra.device_class_name(*key)
        if await delete_class(self._client, name):
            log.info("DeviceClass %s deleted with Configuration %s/%s", name, *key)
