"""What the reconciler reads and where it reports: the questions it asks of the cluster state.

``ClusterView`` (answered by ``controller.state.index``, or by a few dicts in unit tests) and
``EventSink`` (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.state.records import (
    ConfigurationRecord,
    InstanceRecord,
    NodeHealth,
    ObservedPod,
    OwnedObject,
    RejectedPod,
)


class ClusterView(Protocol):
    def configuration(self, namespace: str, name: str) -> ConfigurationRecord | None: ...
    def instance(self, namespace: str, name: str) -> InstanceRecord | None: ...
    def instances_of(self, namespace: str, configuration: str) -> list[InstanceRecord]: ...
    def instances_on(self, node: str) -> list[tuple[str, str]]: ...
    def broker_pods(self, namespace: str, instance: str) -> list[ObservedPod]: ...
    def broker_jobs(self, namespace: str, instance: str) -> list[OwnedObject]: ...
    def services(self, namespace: str, configuration: str) -> list[OwnedObject]: ...
    def node(self, name: str) -> NodeHealth | None: ...
    def rejected_pod(self, namespace: str, name: str) -> RejectedPod | None: ...
    def resource_owners(self, resource: str) -> list[tuple[str, str, str]]:
        """(kind, namespace, name) of each Instance or Configuration serving ``resource``."""
        ...
    def pod_broker_counts(self, namespace: str, configuration: str) -> tuple[int, int, int]:
        """(Instances, broker pods their nodes ask for, ready broker pods) of a Configuration,
        without a walk over its Instances (the status is recomputed often at scale)."""
        ...


class EventSink(Protocol):
    def __call__(
        self, body: Mapping[str, Any], *, warning: bool, reason: str, message: str
    ) -> None: ...
