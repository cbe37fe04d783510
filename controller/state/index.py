"""The cluster as the controller's watches last saw it, indexed for the questions it asks.

``ClusterState`` answers ``controller.state.view.ClusterView`` with dict lookups; the ``put_*``
callbacks of the watches keep it current (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

from collections import defaultdict
from typing import TypeVar

from controller.state.records import (
    ConfigurationRecord,
    InstanceRecord,
    NodeHealth,
    ObservedPod,
    OwnedObject,
    RejectedPod,
)
from crds.api import CONFIGURATION_KIND, INSTANCE_KIND
from crds.naming import configuration_resource_name, instance_resource_name

Key = tuple[str, str]
Owner = tuple[str, str, str]  # (kind, namespace, name) of an Instance or Configuration
V = TypeVar("V")


def _remove(index: dict[Key, dict[str, V]], key: Key, name: str) -> None:
    found = index.get(key)
    if found is not None:
        found.pop(name, None)
        if not found:
            del index[key]


class ClusterState:
    """A :class:`controller.state.view.ClusterView` over records kept by the watches."""

    def __init__(self) -> None:
        self._configurations: dict[Key, ConfigurationRecord] = {}
        self._instances: dict[Key, InstanceRecord] = {}
        self._instances_by_configuration: dict[Key, dict[str, InstanceRecord]] = {}
        self._instances_by_node: dict[str, set[Key]] = {}
        self._desired_by_configuration: dict[Key, int] = defaultdict(int)
        self._pods_by_instance: dict[Key, dict[str, ObservedPod]] = {}
        self._ready_by_configuration: dict[Key, int] = defaultdict(int)
        self._jobs_by_instance: dict[Key, dict[str, OwnedObject]] = {}
        self._services_by_configuration: dict[Key, dict[str, OwnedObject]] = {}
        self._nodes: dict[str, NodeHealth] = {}
        self._rejected: dict[Key, RejectedPod] = {}
        self._owners_by_resource: dict[str, set[Owner]] = {}

    # -- the view ------------------------------------------------------------------------------

    def configuration(self, namespace: str, name: str) -> ConfigurationRecord | None:
        return self._configurations.get((namespace, name))

    def configurations(self) -> list[Key]:
        return list(self._configurations)

    def instance(self, namespace: str, name: str) -> InstanceRecord | None:
        return self._instances.get((namespace, name))

    def instance_keys(self) -> list[Key]:
        return list(self._instances)

    def pod_count(self) -> int:
        return sum(len(pods) for pods in self._pods_by_instance.values())

    def instances_of(self, namespace: str, configuration: str) -> list[InstanceRecord]:
        return list(self._instances_by_configuration.get((namespace, configuration), {}).values())

    def instances_on(self, node: str) -> list[Key]:
        return sorted(self._instances_by_node.get(node, ()))

    def instances_with_brokers(self) -> list[Key]:
        """(namespace, Instance) for every Instance a broker pod or job is labelled with,
        whether that Instance still exists or not."""
        return sorted({key for key, pods in self._pods_by_instance.items() if pods}
                      | {key for key, jobs in self._jobs_by_instance.items() if jobs})

    def broker_pods(self, namespace: str, instance: str) -> list[ObservedPod]:
        return list(self._pods_by_instance.get((namespace, instance), {}).values())

    def broker_jobs(self, namespace: str, instance: str) -> list[OwnedObject]:
        return list(self._jobs_by_instance.get((namespace, instance), {}).values())

    def services(self, namespace: str, configuration: str) -> list[OwnedObject]:
        return list(self._services_by_configuration.get((namespace, configuration), {}).values())

    def node(self, name: str) -> NodeHealth | None:
        return self._nodes.get(name)

    def nodes(self) -> list[NodeHealth]:
        return list(self._nodes.values())

    def rejected_pod(self, namespace: str, name: str) -> RejectedPod | None:
        return self._rejected.get((namespace, name))

    def rejected_pod_keys(self) -> list[Key]:
        return list(self._rejected)

    def resource_owners(self, resource: str) -> list[Owner]:
        """The Instances (``edgeplug.io/<instance>``) and Configurations (their
        configuration-level resource) that serve the extended resource ``resource``."""
        return sorted(self._owners_by_resource.get(resource, ()))

    def pod_broker_counts(self, namespace: str, configuration: str) -> tuple[int, int, int]:
        key = (namespace, configuration)
        return (
            len(self._instances_by_configuration.get(key, ())),
            self._desired_by_configuration.get(key, 0),
            self._ready_by_configuration.get(key, 0),
        )

    # -- changes, from the watches -------------------------------------------------------------

    def _own(self, resource: str, owner: Owner, *, owns: bool) -> None:
        owners = self._owners_by_resource.setdefault(resource, set())
        if owns:
            owners.add(owner)
            return
        owners.discard(owner)
        if not owners:
            del self._owners_by_resource[resource]

    def put_configuration(
        self, key: Key, old: ConfigurationRecord | None, new: ConfigurationRecord | None
    ) -> None:
        owner = (CONFIGURATION_KIND, *key)
        for record, owns in ((old, False), (new, True)):
            if record is not None:
                cfg = record.configuration
                self._own(configuration_resource_name(cfg.name, cfg.spec.resource_name), owner,
                          owns=owns)
        if new is None:
            self._configurations.pop(key, None)
        else:
            self._configurations[key] = new

    def put_instance(
        self, key: Key, old: InstanceRecord | None, new: InstanceRecord | None
    ) -> None:
        namespace, name = key
        if (old is None) != (new is None):
            self._own(instance_resource_name(name), (INSTANCE_KIND, *key), owns=new is not None)
        if old is not None:
            spec = old.instance.spec
            owner = (namespace, spec.configuration_name)
            _remove(self._instances_by_configuration, owner, name)
            self._desired_by_configuration[owner] -= len(spec.nodes)
            if not self._desired_by_configuration[owner]:
                del self._desired_by_configuration[owner]
            for node in spec.nodes:
                on_node = self._instances_by_node.get(node)
                if on_node is not None:
                    on_node.discard(key)
                    if not on_node:
                        del self._instances_by_node[node]
        if new is None:
            self._instances.pop(key, None)
            return
        self._instances[key] = new
        spec = new.instance.spec
        owner = (namespace, spec.configuration_name)
        self._instances_by_configuration.setdefault(owner, {})[name] = new
        self._desired_by_configuration[owner] += len(spec.nodes)
        for node in spec.nodes:
            self._instances_by_node.setdefault(node, set()).add(key)

    @staticmethod
    def _counts_ready(pod: ObservedPod | None) -> bool:
        return pod is not None and pod.ready and not pod.deleting

    def put_pod(self, key: Key, old: ObservedPod | None, new: ObservedPod | None) -> None:
        namespace, name = key
        if old is not None:
            _remove(self._pods_by_instance, (namespace, old.instance), name)
            if self._counts_ready(old):
                owner = (namespace, old.configuration)
                self._ready_by_configuration[owner] -= 1
                if not self._ready_by_configuration[owner]:
                    del self._ready_by_configuration[owner]
        if new is not None:
            self._pods_by_instance.setdefault((namespace, new.instance), {})[name] = new
            if self._counts_ready(new):
                self._ready_by_configuration[(namespace, new.configuration)] += 1

    def put_job(self, key: Key, old: OwnedObject | None, new: OwnedObject | None) -> None:
        namespace, name = key
        if old is not None:
            _remove(self._jobs_by_instance, (namespace, old.instance), name)
        if new is not None:
            self._jobs_by_instance.setdefault((namespace, new.instance), {})[name] = new

    def put_service(self, key: Key, old: OwnedObject | None, new: OwnedObject | None) -> None:
        namespace, name = key
        if old is not None:
            _remove(self._services_by_configuration, (namespace, old.configuration), name)
        if new is not None:
            self._services_by_configuration.setdefault(
                (namespace, new.configuration), {}
            )[name] = new

    def put_rejected_pod(
        self, key: Key, _old: RejectedPod | None, new: RejectedPod | None
    ) -> None:
        if new is None:
            self._rejected.pop(key, None)
        else:
            self._rejected[key] = new

    def put_node(self, key: str, _old: NodeHealth | None, new: NodeHealth | None) -> None:
        if new is None:
            self._nodes.pop(key, None)
        else:
            self._nodes[key] = new
