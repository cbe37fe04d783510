"""One DeviceClass per Instance whose Configuration the scheduler allocates (DRA mode).

Akri-style brokers and pods ask for one device by its Instance's resource,
``edgeplug.io/<instance>``, in ``resources.limits``. When the scheduler allocates a
Configuration's devices, no device plugin advertises that name, so a class selecting only that
Instance's device maps it (``extendedResourceName``) and the scheduler serves such a pod from the
device's ResourceSlice: a local device's from its node's pool, a shared one's from its own pool,
counting its ``slots`` capacity once across every node that sees it.

These classes are cluster-scoped and cannot be owned by the namespaced Instance: the controller
deletes a class with its Instance, when its Configuration stops being allocated through DRA,
and at every (re)list for classes whose Instance went while no controller ran. Writes are
idempotent server-side applies. The same watch feeds ``controller.shared_pools`` (the shared
devices' ResourceSlices).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from controller.shared_allocation import put_mode
from controller.shared_pools import SharedPools
from controller.watching import follow_forever
from crds import dra
from crds.configuration import Allocator
from crds.naming import instance_resource_name
from crds.resources import InstanceResource

log = logging.getLogger(__name__)

DeviceClassResource = create_global_resource(
    "resource.k8s.io", "v1", "DeviceClass", "deviceclasses"
)
FIELD_MANAGER: Final = "edgeplug-controller/instance-classes"
RETRY_S: Final = 5.0
HTTP_NOT_FOUND: Final = 404

_Key = tuple[str, str]


class InstanceClasses:
    """Keeps a class for every Instance (of ``namespaces``; empty: all) whose Configuration's
    mode, as ``set_mode`` last said, is DRA."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 pools: SharedPools | None = None) -> None:
        """``pools``: fed every shared Instance this watch sees and every mode ``set_mode`` is
        told (the shared devices' slices)."""
        self._client = client
        self._pools = pools
        self._namespaces = frozenset(namespaces)
        self._modes: dict[_Key, Allocator] = {}
        #: Instances seen: (namespace, instance) → their Configuration's name.
        self._instances: dict[_Key, str] = {}
        self._written: set[_Key] = set()
        self._changed = asyncio.Event()
        self._listed = False

    def set_mode(self, configuration: _Key, mode: Allocator | None) -> None:
        """The allocator of ``configuration``'s devices (``None``: it is gone)."""
        if self._pools is not None:
            self._pools.set_mode(configuration, mode)
        if put_mode(self._modes, configuration, mode):
            self._changed.set()

    def resources(self) -> frozenset[str]:
        """The Instances' own resources the classes kept now map."""
        return frozenset(instance_resource_name(key[1]) for key in self._written)

    def _wanted(self) -> set[_Key]:
        return {key for key, cfg in self._instances.items()
                if self._modes.get((key[0], cfg)) == Allocator.DRA}

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(follow_forever(self._follow, what="instance classes",
                                             retry_s=RETRY_S), name="watch-instances")
            tasks.create_task(self._keep(), name="keep-instance-classes")

    async def _follow(self) -> None:
        listed: dict[_Key, str] = {}
        shared = []
        async for obj in self._client.list(InstanceResource, namespace="*"):
            data = as_dict(obj)
            key, configuration = self._configuration_of(data)
            if configuration is not None:
                listed[key] = configuration
                if _is_shared(data):
                    shared.append(data)
        if self._pools is not None:
            self._pools.listed(shared)
        self._instances = listed
        self._listed = True
        self._changed.set()
        async for op, obj in self._client.watch(InstanceResource, namespace="*"):
            data = as_dict(obj)
            key, configuration = self._configuration_of(data)
            if op == "DELETED" or configuration is None:
                self._instances.pop(key, None)
            else:
                self._instances[key] = configuration
            if self._pools is not None:
                gone = op == "DELETED" or configuration is None or not _is_shared(data)
                self._pools.put(key, None if gone else data)
            self._changed.set()

    def _configuration_of(self, data: dict[str, Any]) -> tuple[_Key, str | None]:
        """The Instance's key, and its Configuration's name if it is of a namespace we serve."""
        key = object_key(data)
        if not self._serves(key[0]):
            return key, None
        return key, str((data.get("spec") or {}).get("configurationName") or "")

    async def _keep(self) -> None:
        swept = False
        while True:
            await self._changed.wait()
            self._changed.clear()
            if not self._listed:
                continue
            try:
                if not swept:
                    await self._sweep()
                    swept = True
                await self._sync()
            except ApiError as error:
                log.warning("instance classes: %s; retrying", error)
                await asyncio.sleep(RETRY_S)
                self._changed.set()

    async def _sync(self) -> None:
        wanted = self._wanted()
        for key in sorted(wanted - self._written):
            cfg = self._instances[key]
            body = dra.instance_class(key[0], cfg, key[1],
                                      extended_resource=instance_resource_name(key[1]))
            await self._client.patch(DeviceClassResource, body["metadata"]["name"], body,
                                     patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER,
                                     force=True)
            self._written.add(key)
            log.info("DeviceClass %s kept for Instance %s/%s", body["metadata"]["name"], *key)
        for key in sorted(self._written - wanted):
            await self._delete(key)

    async def _sweep(self) -> None:
        """Delete classes of Instances that are gone or no longer allocated through DRA."""
        wanted = self._wanted()
        async for obj in self._client.list(DeviceClassResource,
                                           labels={dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}):
            annotations = (as_dict(obj).get("metadata") or {}).get("annotations") or {}
            namespace, _, name = annotations.get(dra.ANNOTATION_INSTANCE, "").partition("/")
            if namespace and self._serves(namespace):
                if (namespace, name) in wanted:
                    self._written.add((namespace, name))
                else:
                    await self._delete((namespace, name))

    async def _delete(self, key: _Key) -> None:
        self._written.discard(key)
        name = dra.instance_class_name(*key)
        if await delete_class(self._client, name):
            log.info("DeviceClass %s deleted (Instance %s/%s)", name, *key)


def _is_shared(data: dict[str, Any]) -> bool:
    return bool((data.get("spec") or {}).get("shared"))


async def delete_class(client: AsyncClient, name: str) -> bool:
    """Delete the DeviceClass ``name``; False when it was already gone."""
    try:
        await client.delete(DeviceClassResource, name)
    except ApiError as error:
        if error.status.code != HTTP_NOT_FOUND:
            raise
        return False
    return True


def object_key(data: dict[str, Any]) -> _Key:
    """(namespace, name) of an object as the API server returned it."""
    meta = data.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def as_dict(obj: Any) -> dict[str, Any]:
    """The object as a dict, whether lightkube returned one or a generic resource."""
    return obj if isinstance(obj, dict) else cast(dict[str, Any], obj.to_dict())
