"""A DeviceClass mapping ``edgeplug.io/<instance>`` for each Instance whose Configuration the
scheduler allocates (DRA mode) once a pod waiting to be scheduled asks for that resource (an
Akri-style broker or workload): the scheduler then serves it from the device's slice, retrying
the pod when the class appears. Kept for the Instance's life; deleted with it, when the
Configuration leaves DRA, and at (re)list for Instances gone meanwhile. The Instance watch also
feeds ``controller.dra.shared_pools``. Why on demand: docs/dra.md, "Extended resources"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from controller.dra.shared_allocation import put_mode
from controller.dra.shared_pools import SharedPools
from controller.kube.watching import follow_forever
from controller.settings import DraSettings
from crds import dra
from crds.api import GROUP
from crds.configuration import Allocator
from crds.naming import instance_resource_name
from crds.resources import InstanceResource

log = logging.getLogger(__name__)

DeviceClassResource = create_global_resource(
    "resource.k8s.io", "v1", "DeviceClass", "deviceclasses"
)
FIELD_MANAGER: Final = "edgeplug-controller/instance-classes"
HTTP_NOT_FOUND: Final = 404
#: Where a pod asks for extended resources.
_RESOURCE_SECTIONS: Final = ("limits", "requests")

_Key = tuple[str, str]


class InstanceClasses:
    """Keeps a class for every Instance (of ``namespaces``; empty: all) whose Configuration's
    mode, as ``set_mode`` last said, is DRA, and whose resource a pod not yet scheduled asked
    for (or whose class was there at start).

    Work follows what changed: a watch event marks its Instance only when the
    Configuration it belongs to (or its being there at all) changed, a mode change marks that
    Configuration's Instances, and a sync looks only at the marked ones (every one after a
    (re)list), ``instance_classes_writes_in_flight`` API calls at a time (one at a time would
    leave the API server idle between round trips)."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 pools: SharedPools | None = None, settings: DraSettings | None = None) -> None:
        """``pools``: fed every shared Instance this watch sees and every mode ``set_mode`` is
        told (the shared devices' slices)."""
        self._settings = settings or DraSettings()
        self._client = client
        self._pools = pools
        self._namespaces = frozenset(namespaces)
        self._modes: dict[_Key, Allocator] = {}
        #: Instances seen: (namespace, instance) → their Configuration's name.
        self._instances: dict[_Key, str] = {}
        #: (namespace, configuration) → its Instances seen.
        self._by_configuration: dict[_Key, set[_Key]] = {}
        self._written: set[_Key] = set()
        self._resources: frozenset[str] | None = None  # resources(), cached
        #: (namespace, extended resource) a pod waiting to be scheduled asked for.
        self._asked: set[tuple[str, str]] = set()
        #: Instances to look at in the next sync; ``_everything``: all of them (a (re)list).
        self._marked: set[_Key] = set()
        self._everything = True
        self._changed = asyncio.Event()
        self._listed = False
        self._gate = asyncio.Semaphore(self._settings.instance_classes_writes_in_flight)
        self.writes = 0  # API writes (applies and deletes), for tests and benchmarks

    def set_mode(self, configuration: _Key, mode: Allocator | None) -> None:
        """The allocator of ``configuration``'s devices (``None``: it is gone)."""
        if self._pools is not None:
            self._pools.set_mode(configuration, mode)
        if put_mode(self._modes, configuration, mode):
            self._marked |= self._by_configuration.get(configuration, set())
            self._resources = None
            self._changed.set()

    def resources(self) -> frozenset[str]:
        """The Instances' own resources the scheduler allocates: those of every Instance in
        DRA mode, its class made yet or not."""
        if self._resources is None:
            self._resources = frozenset(instance_resource_name(key[1])
                                        for key in self._instances if self._through_dra(key))
        return self._resources

    def _through_dra(self, key: _Key) -> bool:
        cfg = self._instances.get(key)
        return cfg is not None and self._modes.get((key[0], cfg)) == Allocator.DRA

    def _wants(self, key: _Key) -> bool:
        return self._through_dra(key) and (key[0], instance_resource_name(key[1])) in self._asked

    def asked(self, pod: dict[str, Any]) -> None:
        """A pod not scheduled yet: the Instances whose own resource it asks for get a class
        (once their Configuration is in DRA mode)."""
        key = object_key(pod)
        if not self._serves(key[0]):
            return
        spec = pod.get("spec") or {}
        for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            resources = container.get("resources") or {}
            for section in _RESOURCE_SECTIONS:
                for name in resources.get(section) or {}:
                    if str(name).startswith(f"{GROUP}/"):
                        self._ask((key[0], str(name)))

    def _ask(self, resource: tuple[str, str]) -> None:
        if resource in self._asked:
            return
        self._asked.add(resource)
        instance = (resource[0], resource[1].removeprefix(f"{GROUP}/"))
        if instance in self._instances:
            self._marked.add(instance)
            self._changed.set()

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    def _set(self, key: _Key, configuration: str | None) -> None:
        """Note the Instance ``key`` of ``configuration`` (None: gone); mark it if that is a
        change."""
        before = self._instances.get(key)
        if before == configuration:
            return
        if before is not None:
            keys = self._by_configuration.get((key[0], before), set())
            keys.discard(key)
            if not keys:
                self._by_configuration.pop((key[0], before), None)
        if configuration is None:
            del self._instances[key]
            self._asked.discard((key[0], instance_resource_name(key[1])))
        else:
            self._instances[key] = configuration
            self._by_configuration.setdefault((key[0], configuration), set()).add(key)
        self._marked.add(key)
        self._resources = None
        self._changed.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(follow_forever(
                self._follow, what="instance classes",
                retry_s=self._settings.instance_classes_retry_s), name="watch-instances")
            tasks.create_task(follow_forever(
                self._follow_pods, what="pods waiting to be scheduled",
                retry_s=self._settings.instance_classes_retry_s), name="watch-waiting-pods")
            tasks.create_task(self._keep(), name="keep-instance-classes")

    async def _follow_pods(self) -> None:
        """Pods bound to no node yet (a field selector: few, and gone once bound)."""
        async for obj in self._client.list(Pod, namespace="*", fields={"spec.nodeName": ""}):
            self.asked(as_dict(obj))
        async for op, obj in self._client.watch(Pod, namespace="*",
                                                fields={"spec.nodeName": ""}):
            if op != "DELETED":
                self.asked(as_dict(obj))

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
        self._instances = {}
        self._by_configuration = {}
        for key, configuration in listed.items():
            self._set(key, configuration)
        self._listed = True
        self._everything = True
        self._changed.set()
        async for op, obj in self._client.watch(InstanceResource, namespace="*"):
            data = as_dict(obj)
            key, configuration = self._configuration_of(data)
            self._set(key, None if op == "DELETED" else configuration)
            if self._pools is not None:
                gone = op == "DELETED" or configuration is None or not _is_shared(data)
                self._pools.put(key, None if gone else data)

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
            if not self._listed:
                self._changed.clear()
                continue
            await asyncio.sleep(self._settings.instance_classes_pass_delay_s)
            self._changed.clear()
            try:
                if not swept:
                    await self._sweep()
                    swept = True
                await self._sync()
            except ApiError as error:
                log.warning("instance classes: %s; retrying", error)
                await asyncio.sleep(self._settings.instance_classes_retry_s)
                self._changed.set()

    def _taken(self) -> set[_Key]:
        if self._everything:
            self._everything = False
            self._marked.clear()
            return set(self._instances) | self._written
        taken, self._marked = self._marked, set()
        return taken

    async def _sync(self) -> None:
        keys = self._taken()
        apply = sorted(k for k in keys if self._wants(k) and k not in self._written)
        delete = sorted(k for k in keys if not self._wants(k) and k in self._written)
        results = await asyncio.gather(*(self._apply(k) for k in apply),
                                       *(self._delete(k) for k in delete),
                                       return_exceptions=True)
        failed = [(k, r) for k, r in zip(apply + delete, results, strict=True)
                  if isinstance(r, BaseException)]
        if failed:
            self._marked.update(k for k, _ in failed)
            raise failed[0][1]

    async def _apply(self, key: _Key) -> None:
        cfg = self._instances[key]
        body = dra.instance_class(key[0], cfg, key[1],
                                  extended_resource=instance_resource_name(key[1]))
        async with self._gate:
            await self._client.patch(DeviceClassResource, body["metadata"]["name"], body,
                                     patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER,
                                     force=True)
        self.writes += 1
        self._written.add(key)
        log.info("DeviceClass %s kept for Instance %s/%s", body["metadata"]["name"], *key)

    async def _sweep(self) -> None:
        """Delete classes of Instances that are gone or no longer allocated through DRA."""
        wanted = {key for key in self._instances if self._through_dra(key)}
        async for obj in self._client.list(DeviceClassResource,
                                           labels={dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}):
            annotations = (as_dict(obj).get("metadata") or {}).get("annotations") or {}
            namespace, _, name = annotations.get(dra.ANNOTATION_INSTANCE, "").partition("/")
            if namespace and self._serves(namespace):
                if (namespace, name) in wanted:  # made on demand before: kept for its life
                    self._written.add((namespace, name))
                    self._asked.add((namespace, instance_resource_name(name)))
                else:
                    await self._delete((namespace, name))

    async def _delete(self, key: _Key) -> None:
        name = dra.instance_class_name(*key)
        async with self._gate:
            deleted = await delete_class(self._client, name)
        self._written.discard(key)
        if deleted:
            self.writes += 1
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
