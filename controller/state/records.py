"""Small records of the cluster's objects: what the controller remembers of each one.

``ObservedPod``, ``RejectedPod``, ``NodeHealth``, ``InstanceRecord``, ``ConfigurationRecord`` and
``OwnedObject`` hold only the fields a decision reads (docs/architecture.md, "The controller's
modules"). They import nothing else of the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from controller import naming
from crds.configuration import Configuration
from crds.instance import Instance

#: Pod phases after which the pod's containers are done (the broker must be restarted).
FINISHED_PHASES: Final = frozenset({"Failed", "Succeeded"})


def sorted_labels(labels: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A Node's labels as a sorted tuple: hashable, and equal while they do not change."""
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def parse_time(value: Any) -> datetime | None:
    """A Kubernetes RFC 3339 timestamp (``...Z``) as an aware datetime."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_time(moment: datetime) -> str:
    """``moment`` as a Kubernetes RFC 3339 timestamp, to the second, in UTC."""
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, kw_only=True)
class ObservedPod:
    """What the controller needs to know about one existing broker pod."""

    name: str
    phase: str
    ready: bool
    spec_hash: str
    deleting: bool
    created_at: datetime | None
    finished_at: datetime | None
    node: str = ""
    instance: str = ""
    configuration: str = ""
    namespace: str = ""
    uid: str = ""
    #: The kubelet's ``status.reason`` and ``status.message``, kept for a Failed pod only (a
    #: rejection at admission is recreated at once and reported with them).
    reason: str = ""
    message: str = ""

    @classmethod
    def from_object(cls, pod: Mapping[str, Any]) -> ObservedPod:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        return cls.build(
            name=str(meta.get("name", "")),
            phase=str(status.get("phase") or "Pending"),
            conditions=status.get("conditions") or [],
            container_statuses=status.get("containerStatuses") or [],
            spec_hash=str((meta.get("annotations") or {}).get(naming.ANNOTATION_SPEC_HASH, "")),
            deleting=bool(meta.get("deletionTimestamp")),
            created_at=meta.get("creationTimestamp"),
            node=str((pod.get("spec") or {}).get("nodeName") or ""),
            instance=str(labels.get(naming.LABEL_INSTANCE, "")),
            configuration=str(labels.get(naming.LABEL_CONFIGURATION, "")),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
        )

    @classmethod
    def build(
        cls, *, name: str, namespace: str = "", phase: str, conditions: Any,
        container_statuses: Any, spec_hash: str, deleting: bool, created_at: Any, node: str,
        instance: str, configuration: str, uid: str = "", reason: str = "", message: str = "",
    ) -> ObservedPod:
        """From the pod's fields as decoded (dicts or objects with the same attribute names)."""
        ready = any(
            _field(c, "type") == "Ready" and _field(c, "status") == "True" for c in conditions
        )
        finished_at = None
        # Only a finished pod has a finish time: its restart backoff counts from it. A live
        # pod's condition times move with every status rewrite and must not change the record.
        if phase in FINISHED_PHASES:
            finished: list[datetime] = []
            for container in container_statuses:
                state = _field(container, "state")
                terminated = _field(state, "terminated") if state is not None else None
                at = parse_time(_field(terminated, "finishedAt")) if terminated else None
                if at is not None:
                    finished.append(at)
            if not finished:
                for condition in conditions:
                    at = parse_time(_field(condition, "lastTransitionTime"))
                    if at is not None:
                        finished.append(at)
            finished_at = max(finished) if finished else None
        return cls(
            name=name, phase=phase, ready=ready, spec_hash=spec_hash, deleting=deleting,
            created_at=parse_time(created_at), finished_at=finished_at, node=node,
            instance=instance, configuration=configuration, namespace=namespace, uid=uid,
            reason=reason if phase == "Failed" else "",
            message=message if phase == "Failed" else "",
        )


def _field(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


@dataclass(frozen=True, kw_only=True)
class RejectedPod:
    """A pod that is not a broker, which the kubelet rejected at admission while it asked for
    extended resources (``resources``: their names, sorted)."""

    namespace: str
    name: str
    uid: str
    node: str
    reason: str
    message: str
    resources: tuple[str, ...]


@dataclass(frozen=True)
class NodeHealth:
    name: str
    ready: bool
    since: datetime | None
    #: The Node's pinned-demand annotation as it is now ("" when absent;
    #: controller.brokers.pinned_demand).
    pinned_demand: str = ""
    #: The Node's labels, sorted (what a Configuration's nodeSelector is evaluated against).
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_object(cls, node: Mapping[str, Any]) -> NodeHealth:
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = sorted_labels(meta.get("labels") or {})
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                return cls(
                    name=name,
                    ready=condition.get("status") == "True",
                    since=parse_time(condition.get("lastTransitionTime")),
                    labels=labels,
                )
        return cls(name=name, ready=False, since=None, labels=labels)

    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def unhealthy_for(self, now: datetime) -> float:
        """Seconds the node has been not Ready (0 when Ready or unknown since when)."""
        if self.ready or self.since is None:
            return 0.0
        return max((now - self.since).total_seconds(), 0.0)


@dataclass(frozen=True)
class InstanceRecord:
    instance: Instance
    created_at: datetime | None


@dataclass(frozen=True)
class ConfigurationRecord:
    configuration: Configuration
    body: Mapping[str, Any]  # apiVersion, kind, metadata, status: for Events and status diffs


@dataclass(frozen=True)
class OwnedObject:
    """A Job or Service the controller made, as the controller remembers it."""

    name: str
    spec_hash: str
    component: str
    instance: str
    ready: bool = False
    configuration: str = ""
    namespace: str = ""
