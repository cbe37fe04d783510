"""What the reconciler reads: small records of the cluster's objects, and the view over them.

Why this exists: ``controller.converge`` decides from the state kopf's indices hold, but must not
depend on kopf (so the reconcile steps read as plain Python and the view can be anything that
answers these questions). ``controller.handlers`` implements :class:`ClusterView` over kopf's
indices; the records keep only what the reconciler needs, so ten thousand Instances and their
brokers stay small in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from controller.nodes import NodeHealth
from controller.reconcile import ObservedPod
from crds.configuration import Configuration
from crds.instance import Instance


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
    """A Job or Service the controller made, as its index remembers it."""

    name: str
    spec_hash: str
    component: str
    instance: str
    ready: bool = False


class ClusterView(Protocol):
    def configuration(self, namespace: str, name: str) -> ConfigurationRecord | None: ...
    def instance(self, namespace: str, name: str) -> InstanceRecord | None: ...
    def instances_of(self, namespace: str, configuration: str) -> list[InstanceRecord]: ...
    def instances_on(self, node: str) -> list[tuple[str, str]]: ...
    def broker_pods(self, namespace: str, instance: str) -> list[ObservedPod]: ...
    def broker_jobs(self, namespace: str, instance: str) -> list[OwnedObject]: ...
    def services(self, namespace: str, configuration: str) -> list[OwnedObject]: ...
    def node(self, name: str) -> NodeHealth | None: ...
    def pod_broker_counts(self, namespace: str, configuration: str) -> tuple[int, int, int]:
        """(Instances, broker pods their nodes ask for, ready broker pods) of a Configuration,
        without a walk over its Instances (the status is recomputed often at scale)."""
        ...


class EventSink(Protocol):
    def __call__(
        self, body: Mapping[str, Any], *, warning: bool, reason: str, message: str
    ) -> None: ...
