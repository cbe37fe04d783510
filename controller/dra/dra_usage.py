"""``status.servedBy``, ``status.claims`` and ``status.nodes`` of Instances: how a device is
offered, who holds it, which nodes see it (the device plugins' display writer shows the nodes of
the Instances they serve; under DRA nothing else would).

``DraUsage.run`` follows Nodes, the driver's ResourceSlices, ResourceClaims and Instances and
patches the fields that differ; ``desired_fields`` computes them. How and why: docs/dra.md,
"`kubectl get instances`", and docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from controller.kube.client import Kube
from controller.kube.rest import Rest
from controller.kube.watching import Kind, Watcher, namespaced_path
from controller.settings import DraSettings
from crds import dra
from crds.api import GROUP, INSTANCE_PLURAL, VERSION
from crds.instance import STATUS_CLAIMS, STATUS_NODES, STATUS_SERVED_BY, shown_nodes
from crds.naming import instance_resource_name

log = logging.getLogger(__name__)

_RESOURCE_PREFIX: Final = f"{GROUP}/"
_DRA_PREFIX: Final = "/apis/resource.k8s.io/v1"

_Key = tuple[str, str]  # (namespace, name)
_DeviceId = tuple[str, str]  # (pool, device)
#: (servedBy, claims, nodes) as an Instance's status shows them.
Fields = tuple[str, int, str]


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceUsage:
    namespace: str
    name: str
    nodes: tuple[str, ...]
    served_by: str | None  # as last written (None: never)
    claims: int | None
    shown_nodes: str | None = None  # status.nodes as last written

    @property
    def written(self) -> tuple[str | None, int | None, str | None]:
        return self.served_by, self.claims, self.shown_nodes


@dataclass(frozen=True)
class PublishedSlice:
    name: str
    devices: tuple[tuple[_DeviceId, _Key], ...]  # (pool, device) → (namespace, instance)


@dataclass(frozen=True)
class AllocatedClaim:
    key: _Key
    devices: frozenset[_DeviceId]


@dataclass(frozen=True)
class AdvertisingNode:
    name: str
    resources: frozenset[str]  # edgeplug.io/* with capacity above 0


# -- decoders (only the fields a record keeps) ----------------------------------------------


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""


class _InstanceSpec(msgspec.Struct):
    nodes: list[str] = msgspec.field(default_factory=list)


class _InstanceStatus(msgspec.Struct):
    servedBy: str | None = None
    claims: int | None = None
    nodes: str | None = None


class _Instance(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _InstanceSpec = msgspec.field(default_factory=_InstanceSpec)
    status: _InstanceStatus = msgspec.field(default_factory=_InstanceStatus)


class _Attribute(msgspec.Struct):
    string: str | None = None


class _Device(msgspec.Struct):
    name: str = ""
    attributes: dict[str, _Attribute] = msgspec.field(default_factory=dict)


class _Pool(msgspec.Struct):
    name: str = ""


class _SliceSpec(msgspec.Struct):
    driver: str = ""
    pool: _Pool = msgspec.field(default_factory=_Pool)
    devices: list[_Device] = msgspec.field(default_factory=list)


class _Slice(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _SliceSpec = msgspec.field(default_factory=_SliceSpec)


class _Result(msgspec.Struct):
    driver: str = ""
    pool: str = ""
    device: str = ""


class _Devices(msgspec.Struct):
    results: list[_Result] = msgspec.field(default_factory=list)


class _Allocation(msgspec.Struct):
    devices: _Devices = msgspec.field(default_factory=_Devices)


class _ClaimStatus(msgspec.Struct):
    allocation: _Allocation | None = None


class _Claim(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _ClaimStatus = msgspec.field(default_factory=_ClaimStatus)


class _NodeStatus(msgspec.Struct):
    capacity: dict[str, str] = msgspec.field(default_factory=dict)


class _Node(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


_decode_instance = msgspec.json.Decoder(_Instance).decode
_decode_slice = msgspec.json.Decoder(_Slice).decode
_decode_claim = msgspec.json.Decoder(_Claim).decode
_decode_node = msgspec.json.Decoder(_Node).decode


def decode_instance(raw: bytes) -> tuple[InstanceUsage, str]:
    obj = _decode_instance(raw)
    return InstanceUsage(namespace=obj.metadata.namespace, name=obj.metadata.name,
                         nodes=tuple(sorted(obj.spec.nodes)), served_by=obj.status.servedBy,
                         claims=obj.status.claims, shown_nodes=obj.status.nodes), \
        obj.metadata.resourceVersion


def decode_slice(raw: bytes) -> tuple[PublishedSlice | None, str]:
    obj = _decode_slice(raw)
    version = obj.metadata.resourceVersion
    if obj.spec.driver != dra.DRIVER:
        return None, version
    devices = []
    for device in obj.spec.devices:
        namespace = device.attributes.get(dra.ATTR_NAMESPACE, _Attribute()).string
        instance = device.attributes.get(dra.ATTR_INSTANCE, _Attribute()).string
        if namespace and instance:
            devices.append(((obj.spec.pool.name, device.name), (namespace, instance)))
    return PublishedSlice(name=obj.metadata.name, devices=tuple(devices)), version


def decode_claim(raw: bytes) -> tuple[AllocatedClaim, str]:
    obj = _decode_claim(raw)
    version = obj.metadata.resourceVersion
    allocation = obj.status.allocation
    ours = frozenset((r.pool, r.device) for r in allocation.devices.results
                     if r.driver == dra.DRIVER) if allocation is not None else frozenset()
    # A claim holding none of our devices is kept too (no devices): a watch event whose record
    # is None is skipped, so a claim deallocated and then deleted would otherwise stay counted.
    return AllocatedClaim(key=(obj.metadata.namespace, obj.metadata.name), devices=ours), version


def decode_node(raw: bytes) -> tuple[AdvertisingNode, str]:
    obj = _decode_node(raw)
    advertised = frozenset(name for name, amount in obj.status.capacity.items()
                           if name.startswith(_RESOURCE_PREFIX) and amount not in ("", "0"))
    return AdvertisingNode(name=obj.metadata.name, resources=advertised), \
        obj.metadata.resourceVersion


# -- what the fields should read --------------------------------------------------------------


def unwritten_reads_so(inst: InstanceUsage, fields: Fields) -> bool:
    """Whether ``inst``'s fields were never written and ``fields`` would read as they do now
    (nothing serves it, no claim holds it): writing them is left to when it is served."""
    return inst.served_by is None and inst.claims is None and fields[:2] == (
        dra.served_by(device_plugin=False, dra=False), 0)


def desired_fields(
    instances: Iterable[InstanceUsage], *, slices: Iterable[PublishedSlice],
    claims: Iterable[AllocatedClaim], nodes: dict[str, AdvertisingNode],
) -> dict[_Key, Fields]:
    """(servedBy, claims, nodes) of every Instance."""
    owner: dict[_DeviceId, _Key] = {}
    for published in slices:
        owner.update(published.devices)
    published_keys = set(owner.values())
    held: dict[_Key, int] = {}
    for claim in claims:
        for key in {owner[d] for d in claim.devices if d in owner}:
            held[key] = held.get(key, 0) + 1
    result: dict[_Key, Fields] = {}
    for inst in instances:
        key = (inst.namespace, inst.name)
        resource = instance_resource_name(inst.name)
        plugin = any(resource in nodes[n].resources for n in inst.nodes if n in nodes)
        result[key] = (dra.served_by(device_plugin=plugin, dra=key in published_keys),
                       held.get(key, 0), shown_nodes(inst.nodes))
    return result


class DraUsage:
    """Keeps ``status.servedBy``, ``status.claims`` and ``status.nodes`` of the served
    namespaces' Instances."""

    def __init__(self, *, http: Rest, kube: Kube, namespaces: Iterable[str] = (),
                 settings: DraSettings | None = None) -> None:
        self._settings = settings or DraSettings()
        self._kube = kube
        self._wake = asyncio.Event()
        self._gate = asyncio.Semaphore(self._settings.usage_writes_in_flight)
        #: What this controller last wrote to each Instance (its own write's event wakes nothing).
        self._wrote: dict[_Key, Fields] = {}
        self.writes = 0
        scopes: list[str | None] = list(namespaces) or [None]
        crd_prefix = f"/apis/{GROUP}/{VERSION}"
        self._instances: list[Watcher[_Key, InstanceUsage]] = [
            Watcher(http=http, on_change=self._instance_changed, kind=Kind(
                name=f"dra usage: instances@{ns or '*'}", decode=decode_instance,
                path=namespaced_path(crd_prefix, INSTANCE_PLURAL, ns),
                key=lambda r: (r.namespace, r.name)))
            for ns in scopes
        ]
        self._slices: Watcher[str, PublishedSlice] = Watcher(
            http=http, on_change=self._changed, kind=Kind(
                name="dra usage: resourceslices", decode=decode_slice,
                path=f"{_DRA_PREFIX}/resourceslices", key=lambda r: r.name,
                field_selector=f"spec.driver={dra.DRIVER}"))
        self._claims: Watcher[_Key, AllocatedClaim] = Watcher(
            http=http, on_change=self._changed, kind=Kind(
                name="dra usage: resourceclaims", decode=decode_claim,
                path=f"{_DRA_PREFIX}/resourceclaims", key=lambda r: r.key))
        self._nodes: Watcher[str, AdvertisingNode] = Watcher(
            http=http, on_change=self._changed, kind=Kind(
                name="dra usage: nodes", decode=decode_node, path="/api/v1/nodes",
                key=lambda r: r.name))

    def _watchers(self) -> list[Watcher[Any, Any]]:
        return [*self._instances, self._slices, self._claims, self._nodes]

    def _changed(self, _key: object, _old: object, _new: object) -> None:
        self._wake.set()

    def _instance_changed(self, key: _Key, old: InstanceUsage | None,
                          new: InstanceUsage | None) -> None:
        """Wakes a pass unless only the fields changed, to what this controller wrote."""
        if new is None:
            self._wrote.pop(key, None)
        elif old is not None and old.nodes == new.nodes and \
                self._wrote.get(key) == new.written:
            return
        self._wake.set()

    async def run(self) -> None:
        """Follow the four kinds and write the fields until cancelled."""
        tasks = [asyncio.create_task(w.run(), name=w.kind.name) for w in self._watchers()]
        try:
            for watcher in self._watchers():
                await watcher.synced.wait()
            while True:
                await self._wake.wait()
                await asyncio.sleep(self._settings.usage_pass_delay_s)
                self._wake.clear()
                await self._pass()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pass(self) -> None:
        instances = [r for w in self._instances for r in w.store.values()]
        wanted = desired_fields(instances, slices=self._slices.store.values(),
                                claims=self._claims.store.values(), nodes=self._nodes.store)
        stale = [(inst, wanted[(inst.namespace, inst.name)]) for inst in instances]
        await asyncio.gather(*(self._write(inst, fields) for inst, fields in stale
                               if inst.written != fields
                               and not unwritten_reads_so(inst, fields)))

    async def _write(self, inst: InstanceUsage, fields: Fields) -> None:
        key = (inst.namespace, inst.name)
        try:
            async with self._gate:
                # Noted first: the write's watch event may come before its reply.
                self._wrote[key] = fields
                await self._kube.patch_instance_status(
                    inst.namespace, inst.name, {STATUS_SERVED_BY: fields[0],
                                                STATUS_CLAIMS: fields[1],
                                                STATUS_NODES: fields[2]})
            self.writes += 1
        except Exception as error:  # display only: the next change writes it again
            self._wrote.pop(key, None)
            log.info("status.servedBy/claims/nodes of Instance %s/%s not written: %s",
                     inst.namespace, inst.name, error)
