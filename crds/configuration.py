"""Typed, read-only view of a ``Configuration`` as the API server returns it.

``Configuration.from_object`` parses one; ``allocator_of``, ``asked_allocator`` and
``eviction_grace`` read single fields of raw objects. ``SPEC_FIELDS`` maps every wire field to its
attribute (checked against the manifest; docs/architecture.md, "The API package").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crds.api import (
    API_VERSION,
    CONFIGURATION_KIND,
    DEFAULT_CAPACITY,
    DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS,
    owner_reference,
)
from crds.selectors import LabelSelector, LabelSelectorRequirement, SelectorOperator

__all__ = [
    "SPEC_FIELDS",
    "BrokerDeviceAccess",
    "Configuration",
    "ConfigurationSpec",
    "DiscoveryHandlerInfo",
    "DiscoveryProperty",
    "LabelSelector",
    "LabelSelectorRequirement",
    "SelectorOperator",
    "UnhealthyDevices",
    "ValueSource",
    "ValueSourceKind",
    "eviction_grace",
]

#: Wire path (dotted, under ``spec``) → ``ConfigurationSpec`` attribute.
SPEC_FIELDS: Final[Mapping[str, str]] = {
    "discoveryHandler": "discovery_handler",
    "capacity": "capacity",
    "brokerSpec.brokerPodSpec": "broker_pod_spec",
    "brokerSpec.brokerJobSpec": "broker_job_spec",
    "instanceServiceSpec": "instance_service_spec",
    "configurationServiceSpec": "configuration_service_spec",
    "brokerProperties": "broker_properties",
    "offlineGracePeriodSeconds": "offline_grace_period_seconds",
    "resourceName": "resource_name",
    "nodeSelector": "node_selector",
    "brokerDeviceAccess": "broker_device_access",
    "allocator": "allocator",
    "sharedDeviceAllocation": "allocator",
    "unhealthyDevices": "unhealthy_devices",
}


class BrokerDeviceAccess(enum.StrEnum):
    """How broker pods get their device (``spec.brokerDeviceAccess``, an edgeplug addition):
    the Instance's extended resource from the device plugins (Akri's way, the default), or a
    ResourceClaim that selects the Instance's device through DRA (docs/dra.md)."""

    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class Allocator(enum.StrEnum):
    """Which allocator serves every device of a Configuration, local and shared
    (``spec.allocator``, an edgeplug addition; docs/slots.md): the scheduler, from
    ResourceSlices (DRA), or the kubelets through the agents' device plugins (the compatibility
    mode). Never both at once."""

    DRA = "dra"
    DEVICE_PLUGIN = "devicePlugin"


def allocator_of(obj: Mapping[str, Any]) -> Allocator | None:
    """The allocator a Configuration object's devices have now: its spec's choice, else the
    controller's (``status.allocator``, or the same under its earlier name); ``None`` while
    neither says, or says something unknown."""
    for part in ("spec", "status"):
        try:
            chosen = asked_allocator(obj.get(part) or {})
        except ValueError:
            return None
        if chosen is not None:
            return chosen
    return None


def decided_for_shared_devices_only(obj: Mapping[str, Any]) -> bool:
    """Whether a Configuration object's allocator was chosen by a controller of the previous
    release: the spec chooses none and the status names one only under its earlier name
    (``sharedDeviceAllocation``; this release's controller writes ``allocator`` beside it).
    That controller decided for shared devices alone and mapped no local device's resource
    to a DeviceClass, so its local devices stay the kubelets' (docs/operations.md, "Version
    skew")."""
    status = obj.get("status") or {}
    try:
        asked = asked_allocator(obj.get("spec") or {})
    except ValueError:
        return False
    return asked is None and "allocator" not in status and bool(
        status.get("sharedDeviceAllocation"))


def asked_allocator(fields: Mapping[str, Any]) -> Allocator | None:
    """The allocator a Configuration's spec (or status) names: ``allocator``, or its earlier
    name ``sharedDeviceAllocation``, which means the same; ``None``: the cluster's best. Raises
    ``ValueError`` for a value that is neither."""
    chosen = fields.get("allocator") or fields.get("sharedDeviceAllocation")
    return Allocator(chosen) if chosen else None


@dataclass(frozen=True)
class UnhealthyDevices:
    """What a device found unhealthy does to the pods holding it (``spec.unhealthyDevices``,
    an edgeplug addition; docs/dra.md): once unhealthy ``evict_after_seconds`` on end, its
    ResourceSlice taint ``edgeplug.io/unhealthy`` turns ``NoExecute`` and the pods holding it
    are evicted. Absent from the spec: they keep it (``NoSchedule`` only)."""

    evict_after_seconds: int

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> UnhealthyDevices:
        return cls(evict_after_seconds=int(obj["evictAfterSeconds"]))

    def to_object(self) -> dict[str, Any]:
        return {"evictAfterSeconds": self.evict_after_seconds}


def eviction_grace(spec: Mapping[str, Any]) -> int | None:
    """``spec.unhealthyDevices.evictAfterSeconds`` of a Configuration's raw spec; None where
    the field is absent (or malformed: pods then stay, as without it)."""
    value = (spec.get("unhealthyDevices") or {}).get("evictAfterSeconds")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class ValueSourceKind(enum.StrEnum):
    SECRET = "secretKeyRef"
    CONFIG_MAP = "configMapKeyRef"


@dataclass(frozen=True)
class ValueSource:
    """Where a discovery property's value lives: one key of a Secret or a ConfigMap."""

    kind: ValueSourceKind
    name: str
    key: str
    namespace: str | None = None
    optional: bool | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ValueSource:
        for kind in ValueSourceKind:
            ref = obj.get(kind.value)
            if ref is not None:
                return cls(
                    kind=kind,
                    name=str(ref["name"]),
                    key=str(ref["key"]),
                    namespace=ref.get("namespace"),
                    optional=ref.get("optional"),
                )
        raise ValueError(f"valueFrom names neither a Secret nor a ConfigMap: {dict(obj)!r}")

    def to_object(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": self.name, "key": self.key}
        if self.namespace is not None:
            ref["namespace"] = self.namespace
        if self.optional is not None:
            ref["optional"] = self.optional
        return {self.kind.value: ref}


@dataclass(frozen=True)
class DiscoveryProperty:
    """A ``{name, value}`` or ``{name, valueFrom}`` entry of ``discoveryProperties``."""

    name: str
    value: str | None = None
    value_from: ValueSource | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> DiscoveryProperty:
        value_from = obj.get("valueFrom")
        return cls(
            name=str(obj["name"]),
            value=obj.get("value"),
            value_from=ValueSource.from_object(value_from) if value_from is not None else None,
        )

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.value is not None:
            out["value"] = self.value
        if self.value_from is not None:
            out["valueFrom"] = self.value_from.to_object()
        return out


@dataclass(frozen=True)
class DiscoveryHandlerInfo:
    """Which handler discovers, with its YAML ``discovery_details`` still unparsed."""

    name: str
    discovery_details: str = ""
    discovery_properties: tuple[DiscoveryProperty, ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> DiscoveryHandlerInfo:
        return cls(
            name=str(obj["name"]),
            discovery_details=str(obj.get("discoveryDetails") or ""),
            discovery_properties=tuple(
                DiscoveryProperty.from_object(p) for p in obj.get("discoveryProperties") or ()
            ),
        )

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "discoveryDetails": self.discovery_details}
        if self.discovery_properties:
            out["discoveryProperties"] = [p.to_object() for p in self.discovery_properties]
        return out


@dataclass(frozen=True)
class ConfigurationSpec:
    discovery_handler: DiscoveryHandlerInfo
    capacity: int = DEFAULT_CAPACITY
    broker_pod_spec: dict[str, Any] | None = None
    broker_job_spec: dict[str, Any] | None = None
    instance_service_spec: dict[str, Any] | None = None
    configuration_service_spec: dict[str, Any] | None = None
    broker_properties: Mapping[str, str] = field(default_factory=dict)
    offline_grace_period_seconds: int = DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS
    resource_name: str | None = None
    node_selector: LabelSelector | None = None
    broker_device_access: BrokerDeviceAccess = BrokerDeviceAccess.DEVICE_PLUGIN
    allocator: Allocator | None = None
    unhealthy_devices: UnhealthyDevices | None = None

    @property
    def has_broker(self) -> bool:
        return self.broker_pod_spec is not None or self.broker_job_spec is not None

    @classmethod
    def from_object(cls, spec: Mapping[str, Any]) -> ConfigurationSpec:
        broker = spec.get("brokerSpec") or {}
        selector = spec.get("nodeSelector")
        capacity = spec.get("capacity")
        grace = spec.get("offlineGracePeriodSeconds")
        return cls(
            discovery_handler=DiscoveryHandlerInfo.from_object(spec["discoveryHandler"]),
            capacity=DEFAULT_CAPACITY if capacity is None else int(capacity),
            broker_pod_spec=broker.get("brokerPodSpec"),
            broker_job_spec=broker.get("brokerJobSpec"),
            instance_service_spec=spec.get("instanceServiceSpec"),
            configuration_service_spec=spec.get("configurationServiceSpec"),
            broker_properties={
                str(k): str(v) for k, v in (spec.get("brokerProperties") or {}).items()
            },
            offline_grace_period_seconds=(
                DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS if grace is None else int(grace)
            ),
            resource_name=spec.get("resourceName") or None,
            node_selector=LabelSelector.from_object(selector) if selector is not None else None,
            broker_device_access=BrokerDeviceAccess(
                spec.get("brokerDeviceAccess") or BrokerDeviceAccess.DEVICE_PLUGIN),
            allocator=asked_allocator(spec),
            unhealthy_devices=(UnhealthyDevices.from_object(spec["unhealthyDevices"])
                               if spec.get("unhealthyDevices") else None),
        )

    def to_object(self) -> dict[str, Any]:
        """The ``spec`` dict for the API server (defaults written out explicitly)."""
        out: dict[str, Any] = {
            "discoveryHandler": self.discovery_handler.to_object(),
            "capacity": self.capacity,
            "offlineGracePeriodSeconds": self.offline_grace_period_seconds,
        }
        broker: dict[str, Any] = {}
        if self.broker_pod_spec is not None:
            broker["brokerPodSpec"] = self.broker_pod_spec
        if self.broker_job_spec is not None:
            broker["brokerJobSpec"] = self.broker_job_spec
        if broker:
            out["brokerSpec"] = broker
        if self.instance_service_spec is not None:
            out["instanceServiceSpec"] = self.instance_service_spec
        if self.configuration_service_spec is not None:
            out["configurationServiceSpec"] = self.configuration_service_spec
        if self.broker_properties:
            out["brokerProperties"] = dict(self.broker_properties)
        if self.resource_name is not None:
            out["resourceName"] = self.resource_name
        if self.node_selector is not None:
            out["nodeSelector"] = self.node_selector.to_object()
        if self.broker_device_access != BrokerDeviceAccess.DEVICE_PLUGIN:
            out["brokerDeviceAccess"] = self.broker_device_access.value
        if self.allocator is not None:
            out["allocator"] = self.allocator.value
        if self.unhealthy_devices is not None:
            out["unhealthyDevices"] = self.unhealthy_devices.to_object()
        return out


@dataclass(frozen=True)
class Configuration:
    name: str
    namespace: str
    spec: ConfigurationSpec
    uid: str = ""
    generation: int = 0
    resource_version: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Configuration:
        """Accepts the dict a Kubernetes client returns (``.to_dict()``/raw JSON)."""
        meta = obj.get("metadata") or {}
        return cls(
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            spec=ConfigurationSpec.from_object(obj["spec"]),
        )

    def to_object(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace:
            meta["namespace"] = self.namespace
        return {
            "apiVersion": API_VERSION,
            "kind": CONFIGURATION_KIND,
            "metadata": meta,
            "spec": self.spec.to_object(),
        }

    def owner_reference(self, *, controller: bool = True) -> dict[str, Any]:
        """An ownerReference to this Configuration, so owned objects go when it goes."""
        return owner_reference(
            kind=CONFIGURATION_KIND, namespace=self.namespace, name=self.name, uid=self.uid,
            controller=controller,
        )
