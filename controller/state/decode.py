"""Decoders from the API server's JSON to the controller's records, one per kind it follows.

Each (``pod``, ``node``, ``instance``, ...) returns the record and the object's
``resourceVersion``, decoding only the fields the record holds (docs/architecture.md, "The
controller's modules").
"""

from __future__ import annotations

from typing import Any

import msgspec

from controller import naming
from controller.state import admission
from controller.state.records import (
    ConfigurationRecord,
    InstanceRecord,
    NodeHealth,
    ObservedPod,
    OwnedObject,
    RejectedPod,
    parse_time,
    sorted_labels,
)
from crds.configuration import Configuration
from crds.instance import Instance
from crds.pinning import PINNED_DEMAND_ANNOTATION


class _Meta(msgspec.Struct):
    resourceVersion: str = ""
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    lastTransitionTime: str | None = None


class _Terminated(msgspec.Struct):
    finishedAt: str | None = None


class _State(msgspec.Struct):
    terminated: _Terminated | None = None


class _ContainerStatus(msgspec.Struct):
    state: _State | None = None


class _PodStatus(msgspec.Struct):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    conditions: list[_Condition] = msgspec.field(default_factory=list)
    containerStatuses: list[_ContainerStatus] = msgspec.field(default_factory=list)


class _PodSpec(msgspec.Struct):
    nodeName: str | None = None


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _PodSpec = msgspec.field(default_factory=_PodSpec)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _Resources(msgspec.Struct):
    requests: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    limits: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)


class _Container(msgspec.Struct):
    resources: _Resources = msgspec.field(default_factory=_Resources)


class _PodSpecResources(msgspec.Struct):
    nodeName: str | None = None
    containers: list[_Container] = msgspec.field(default_factory=list)
    initContainers: list[_Container] = msgspec.field(default_factory=list)


class _PodWithResources(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _PodSpecResources = msgspec.field(default_factory=_PodSpecResources)
    status: _PodStatus = msgspec.field(default_factory=_PodStatus)


class _NodeStatus(msgspec.Struct):
    conditions: list[_Condition] = msgspec.field(default_factory=list)


class _Node(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)


class _JobStatus(msgspec.Struct):
    succeeded: int | None = None
    ready: int | None = None


class _Job(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _JobStatus = msgspec.field(default_factory=_JobStatus)


class _Owned(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _Instance(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: dict[str, Any] | None = None
    status: dict[str, Any] = msgspec.field(default_factory=dict)


class _Peering(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: dict[str, Any] = msgspec.field(default_factory=dict)


_pod = msgspec.json.Decoder(_Pod).decode
_pod_with_resources = msgspec.json.Decoder(_PodWithResources).decode
_node = msgspec.json.Decoder(_Node).decode
_job = msgspec.json.Decoder(_Job).decode
_owned = msgspec.json.Decoder(_Owned).decode
_instance = msgspec.json.Decoder(_Instance).decode
_peering = msgspec.json.Decoder(_Peering).decode
_any = msgspec.json.Decoder(dict[str, Any]).decode


def pod(raw: bytes) -> tuple[ObservedPod, str]:
    obj = _pod(raw)
    meta, status = obj.metadata, obj.status
    return ObservedPod.build(
        name=meta.name,
        namespace=meta.namespace,
        phase=status.phase or "Pending",
        conditions=status.conditions,
        container_statuses=status.containerStatuses,
        spec_hash=meta.annotations.get(naming.ANNOTATION_SPEC_HASH, ""),
        deleting=bool(meta.deletionTimestamp),
        created_at=meta.creationTimestamp,
        node=obj.spec.nodeName or "",
        instance=meta.labels.get(naming.LABEL_INSTANCE, ""),
        configuration=meta.labels.get(naming.LABEL_CONFIGURATION, ""),
        uid=meta.uid,
        reason=status.reason or "",
        message=status.message or "",
    ), meta.resourceVersion


def _is_broker_pod(meta: _Meta) -> bool:
    """A broker pod (the broker pod watch follows it): the labels its selector matches."""
    labels = meta.labels
    return (labels.get(naming.LABEL_MANAGED_BY) == naming.MANAGED_BY
            and naming.LABEL_TARGET_NODE in labels)


def rejected_pod(raw: bytes) -> tuple[RejectedPod | None, str]:
    """A user's pod that the kubelet rejected at admission while asking for extended
    resources; None for any other pod (brokers included: they have their own watch)."""
    obj = _pod_with_resources(raw)
    meta, status = obj.metadata, obj.status
    reason, message = status.reason or "", status.message or ""
    if _is_broker_pod(meta) or not admission.rejected_at_admission(
        phase=status.phase or "", reason=reason, message=message
    ):
        return None, meta.resourceVersion
    containers = [*obj.spec.containers, *obj.spec.initContainers]
    resources = admission.extended_resources(
        name for c in containers for section in (c.resources.requests, c.resources.limits)
        for name in section
    )
    if not resources:
        return None, meta.resourceVersion
    return RejectedPod(
        namespace=meta.namespace, name=meta.name, uid=meta.uid, node=obj.spec.nodeName or "",
        reason=reason, message=message, resources=resources,
    ), meta.resourceVersion


def node(raw: bytes) -> tuple[NodeHealth, str]:
    obj = _node(raw)
    version = obj.metadata.resourceVersion
    demand = obj.metadata.annotations.get(PINNED_DEMAND_ANNOTATION, "")
    labels = sorted_labels(obj.metadata.labels)
    for condition in obj.status.conditions:
        if condition.type == "Ready":
            return NodeHealth(name=obj.metadata.name, ready=condition.status == "True",
                              since=parse_time(condition.lastTransitionTime),
                              pinned_demand=demand, labels=labels), version
    return NodeHealth(name=obj.metadata.name, ready=False, since=None,
                      pinned_demand=demand, labels=labels), version


def _owned_object(meta: _Meta, *, ready: bool = False) -> OwnedObject:
    return OwnedObject(
        name=meta.name,
        spec_hash=meta.annotations.get(naming.ANNOTATION_SPEC_HASH, ""),
        component=meta.labels.get(naming.LABEL_COMPONENT, ""),
        instance=meta.labels.get(naming.LABEL_INSTANCE, ""),
        ready=ready,
        configuration=meta.labels.get(naming.LABEL_CONFIGURATION, ""),
        namespace=meta.namespace,
    )


def job(raw: bytes) -> tuple[OwnedObject, str]:
    """A broker Job."""
    obj = _job(raw)
    ready = bool(obj.status.succeeded or obj.status.ready)
    return _owned_object(obj.metadata, ready=ready), obj.metadata.resourceVersion


def service(raw: bytes) -> tuple[OwnedObject, str]:
    """A Service the controller made."""
    meta = _owned(raw).metadata
    return _owned_object(meta), meta.resourceVersion


def instance(raw: bytes) -> tuple[InstanceRecord | None, str]:
    obj = _instance(raw)
    if obj.spec is None:
        # Not an Instance the API would accept; nothing to serve.
        return None, obj.metadata.resourceVersion
    meta = obj.metadata
    body = {
        "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid,
                     "resourceVersion": meta.resourceVersion},
        "spec": obj.spec,
        "status": obj.status,
    }
    record = InstanceRecord(
        instance=Instance.from_object(body), created_at=parse_time(meta.creationTimestamp)
    )
    return record, meta.resourceVersion


def configuration(raw: bytes) -> tuple[ConfigurationRecord, str]:
    body = _any(raw)
    meta = body.get("metadata") or {}
    slim = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "finalizers")},
        "status": body.get("status") or {},
    }
    record = ConfigurationRecord(Configuration.from_object(body), slim)
    return record, str(meta.get("resourceVersion") or "")


def peering(raw: bytes) -> tuple[dict[str, Any], str]:
    """The ``status`` of a KopfPeering or ClusterKopfPeering (identity → priority, lifetime,
    lastseen of each peer)."""
    obj = _peering(raw)
    return obj.status, obj.metadata.resourceVersion
