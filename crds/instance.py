"""Typed, read-only view of an ``Instance``, and the grammar of its ``deviceUsage`` values.

``Instance.from_object`` parses one; ``SlotUsage`` parses and formats slot holders so nobody else
splits on ``:``. What each spec and status field records, and who writes it: docs/slots.md, "Where
the state lives", and docs/architecture.md, "The parts and who writes what".
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crds.api import API_VERSION, DEFAULT_CAPACITY, INSTANCE_KIND, owner_reference

__all__ = [
    "SPEC_FIELDS",
    "Instance",
    "InstanceSpec",
    "SlotUsage",
    "SlotUsageKind",
]

#: Wire field (under ``spec``) → ``InstanceSpec`` attribute.
SPEC_FIELDS: Final[Mapping[str, str]] = {
    "configurationName": "configuration_name",
    "cdiName": "cdi_name",
    "capacity": "capacity",
    "brokerProperties": "broker_properties",
    "shared": "shared",
    "nodes": "nodes",
    "deviceUsage": "device_usage",
    "deviceDigest": "device_digest",
}

CONFIGURATION_USAGE_PREFIX: Final = "C:"
#: Status fields the controller writes (``controller.dra.dra_usage``); the rest of ``status`` is the
#: agents' (``Instance.status_to_object``). ``servedBy`` is for display only; ``claims`` is also
#: read by the agents (``Instance.claims``).
STATUS_SERVED_BY: Final = "servedBy"
STATUS_CLAIMS: Final = "claims"
#: ``status.nodes``: the sorted nodes, for display (the device plugins' display writer, and the
#: controller with ``--dra``, write it alike).
STATUS_NODES: Final = "nodes"
#: ``status.reported.<node>``: true once that node's agent has written its health verdict; a
#: controller of the previous release offers a shared device only on such nodes (the agent
#: writes it where one chose the Configuration's allocator).
STATUS_REPORTED: Final = "reported"
CONTROLLER_STATUS_FIELDS: Final = (STATUS_SERVED_BY, STATUS_CLAIMS)
#: Status fields only the previous release reads (kept in the schema for a rollout's skew).
PREVIOUS_RELEASE_STATUS_FIELDS: Final = (STATUS_REPORTED,)


def shown_nodes(nodes: Iterable[str]) -> str:
    """``status.nodes`` for ``nodes``: sorted, comma-separated (every writer of it alike)."""
    return ",".join(sorted(nodes))


class SlotUsageKind(enum.Enum):
    FREE = "free"
    NODE = "node"
    CONFIGURATION = "configuration"


@dataclass(frozen=True)
class SlotUsage:
    """Who holds one slot: nobody, a node (Instance plugin), or a configuration-level vdev."""

    kind: SlotUsageKind
    node: str = ""
    virtual_id: str = ""

    @classmethod
    def free(cls) -> SlotUsage:
        return cls(SlotUsageKind.FREE)

    @classmethod
    def by_node(cls, node: str) -> SlotUsage:
        if not node:
            raise ValueError("a slot held by a node needs the node's name")
        return cls(SlotUsageKind.NODE, node=node)

    @classmethod
    def by_configuration(cls, virtual_id: str, node: str) -> SlotUsage:
        if not virtual_id or not node:
            raise ValueError("a configuration-level slot needs a virtual id and a node")
        return cls(SlotUsageKind.CONFIGURATION, node=node, virtual_id=virtual_id)

    @classmethod
    def parse(cls, value: str) -> SlotUsage:
        """Parses a ``deviceUsage`` value. Node names never contain ``:``, so the last ``:``
        separates the node even if a virtual id contains one."""
        if value == "":
            return cls.free()
        if value.startswith(CONFIGURATION_USAGE_PREFIX):
            virtual_id, sep, node = value[len(CONFIGURATION_USAGE_PREFIX):].rpartition(":")
            if not sep or not virtual_id or not node:
                raise ValueError(f"malformed configuration slot usage {value!r}")
            return cls.by_configuration(virtual_id, node)
        if ":" in value:
            raise ValueError(f"malformed slot usage {value!r}")
        return cls.by_node(value)

    def format(self) -> str:
        if self.kind is SlotUsageKind.FREE:
            return ""
        if self.kind is SlotUsageKind.NODE:
            return self.node
        return f"{CONFIGURATION_USAGE_PREFIX}{self.virtual_id}:{self.node}"

    def __str__(self) -> str:
        return self.format()

    @property
    def is_free(self) -> bool:
        return self.kind is SlotUsageKind.FREE


@dataclass(frozen=True)
class InstanceSpec:
    configuration_name: str
    cdi_name: str = ""
    capacity: int = DEFAULT_CAPACITY
    broker_properties: Mapping[str, str] = field(default_factory=dict)
    shared: bool = False
    nodes: tuple[str, ...] = ()
    device_usage: Mapping[str, str] = field(default_factory=dict)
    #: Which device this is (``crds.naming.device_digest``); ``""`` in an Instance written
    #: before it was recorded, which stands for whatever device its holders publish there.
    device_digest: str = ""

    @classmethod
    def from_object(cls, spec: Mapping[str, Any]) -> InstanceSpec:
        capacity = spec.get("capacity")
        return cls(
            configuration_name=str(spec["configurationName"]),
            cdi_name=str(spec.get("cdiName") or ""),
            capacity=DEFAULT_CAPACITY if capacity is None else int(capacity),
            broker_properties={
                str(k): str(v) for k, v in (spec.get("brokerProperties") or {}).items()
            },
            shared=bool(spec.get("shared", False)),
            nodes=tuple(str(n) for n in spec.get("nodes") or ()),
            device_usage={str(k): str(v) for k, v in (spec.get("deviceUsage") or {}).items()},
            device_digest=str(spec.get("deviceDigest") or ""),
        )

    def to_object(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "configurationName": self.configuration_name,
            "cdiName": self.cdi_name,
            "capacity": self.capacity,
            "brokerProperties": dict(self.broker_properties),
            "shared": self.shared,
            "nodes": list(self.nodes),
            "deviceUsage": dict(self.device_usage),
        }
        if self.device_digest:
            spec["deviceDigest"] = self.device_digest
        return spec

    @property
    def used(self) -> int:
        """How many slots someone holds (what ``status.used`` should say)."""
        return sum(1 for value in self.device_usage.values() if value)

    @property
    def nodes_shown(self) -> str:
        """``nodes`` as ``kubectl get instances -o wide`` shows them (``status.nodes``)."""
        return shown_nodes(self.nodes)


@dataclass(frozen=True)
class Instance:
    name: str
    namespace: str
    spec: InstanceSpec
    uid: str = ""
    resource_version: str = ""
    reservations: Mapping[str, str] = field(default_factory=dict)
    demand: Mapping[str, int] = field(default_factory=dict)
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    #: ``status.claims``: ResourceClaims allocated this device (the controller's count).
    claims: int = 0

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Instance:
        """Accepts the dict a Kubernetes client returns (``.to_dict()``/raw JSON)."""
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(meta["name"]),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            spec=InstanceSpec.from_object(obj["spec"]),
            reservations={
                str(k): str(v) for k, v in (status.get("reservations") or {}).items()
            },
            demand={str(k): int(v) for k, v in (status.get("demand") or {}).items() if v},
            unhealthy={str(k): str(v) for k, v in (status.get("unhealthy") or {}).items()},
            claims=int(status.get(STATUS_CLAIMS) or 0),  # schema: integer >= 0
        )

    def owner_reference(self, *, controller: bool = True) -> dict[str, Any]:
        """An ownerReference to this Instance: its brokers and service go when it goes."""
        return owner_reference(
            kind=INSTANCE_KIND, namespace=self.namespace, name=self.name, uid=self.uid,
            controller=controller,
        )

    def spec_to_object(self) -> dict[str, Any]:
        """The whole object with its ``spec`` (no status), for create or server-side apply."""
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace:
            meta["namespace"] = self.namespace
        return {
            "apiVersion": API_VERSION,
            "kind": INSTANCE_KIND,
            "metadata": meta,
            "spec": self.spec.to_object(),
        }

    def status_to_object(self) -> dict[str, Any]:
        """The ``status`` this Instance should carry: reservations, demand, the nodes that find
        the device unhealthy (and why), the used-slot count and the sorted node list."""
        return {
            "reservations": dict(self.reservations),
            "demand": dict(self.demand),
            "unhealthy": dict(self.unhealthy),
            "used": self.spec.used,
            "nodes": self.spec.nodes_shown,
        }
