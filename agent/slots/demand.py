"""Which device-plugin resources Pending pods need from this node: the demand watch.

Why this exists: reservations (``agent.slots.rules``) decide which node may hand out a shared slot.
A node whose pods wait for a slot reserved by an idle node must say so, or the pods wait
forever. The controller pins broker pods to one node (required node affinity on
``metadata.name`` or ``kubernetes.io/hostname``, or a ``kubernetes.io/hostname`` nodeSelector);
such a pod, Pending and unscheduled, can only ever run here, so its requests are this node's
demand. Unpinned pending pods are ignored: had any node a free reserved slot, the scheduler
would already have placed them.

One lightkube watch of Pending pods (field selector ``status.phase=Pending``) feeds two tables:
unscheduled pods pinned here (``spec.nodeName`` empty) are this node's demand; pods bound to
this node that have not started may be in admission by the kubelet right now, so the service
gives back no reservation of what they request. One stream, not two (``spec.nodeName=`` and
``spec.nodeName=<node>``), because a pod moves from the first table to the second in one
MODIFIED event (its binding); with two streams there is a moment where the pod is in neither,
and the slot its kubelet is admitting it with could be given away (a test caught exactly that).
Only pod uid → extended-resource counts are kept, never the pods, and only for pods that
concern this node: the agent's memory target is 79 MiB with 200 Instances.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from lightkube import AsyncClient
from lightkube.models.core_v1 import (
    Container,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodSpec,
)
from lightkube.resources.core_v1 import Pod

from agent import watching
from agent.slots.rules import split_wanted
from crds.instance import Instance
from crds.naming import instance_resource_name

log = logging.getLogger(__name__)

HOSTNAME_LABEL = "kubernetes.io/hostname"
NAME_FIELD = "metadata.name"
PENDING = "Pending"

Requests = dict[str, int]
_Key = tuple[str, str]  # (namespace, Instance name)


def _pins(requirement: NodeSelectorRequirement, key: str) -> str | None:
    values = requirement.values or []
    if requirement.key == key and requirement.operator == "In" and len(set(values)) == 1:
        return values[0]
    return None


def _term_node(term: NodeSelectorTerm) -> str | None:
    """The one node a node-selector term admits, if it pins one."""
    pinned = {_pins(r, NAME_FIELD) for r in term.matchFields or []}
    pinned |= {_pins(r, HOSTNAME_LABEL) for r in term.matchExpressions or []}
    pinned.discard(None)
    return pinned.pop() if len(pinned) == 1 else None


def pinned_node(spec: PodSpec) -> str | None:
    """The node a pod can only run on, as the controller pins broker pods; None if unpinned."""
    by_selector = (spec.nodeSelector or {}).get(HOSTNAME_LABEL)
    if by_selector:
        return str(by_selector)
    affinity = spec.affinity.nodeAffinity if spec.affinity else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    if required is None or not required.nodeSelectorTerms:
        return None
    # Terms are ORed: the pod is pinned only if every term admits the same single node.
    nodes = {_term_node(term) for term in required.nodeSelectorTerms}
    return nodes.pop() if len(nodes) == 1 and None not in nodes else None


def _container_requests(container: Container) -> Requests:
    resources = container.resources
    if resources is None:
        return {}
    # Extended resources must have requests == limits; either one may be given alone.
    merged = {**(resources.limits or {}), **(resources.requests or {})}
    counts: Requests = {}
    for name, quantity in merged.items():
        if "/" in name and str(quantity).isdecimal() and int(str(quantity)) > 0:
            counts[name] = int(str(quantity))
    return counts


def extended_requests(spec: PodSpec) -> Requests:
    """Extended resources (``<domain>/<name>``) the pod needs: the sum over its containers, or
    more if one init container alone asks for more (init containers run one at a time)."""
    total: Requests = {}
    for container in spec.containers or []:
        for name, count in _container_requests(container).items():
            total[name] = total.get(name, 0) + count
    for init in spec.initContainers or []:
        for name, count in _container_requests(init).items():
            total[name] = max(total.get(name, 0), count)
    return total


def _sum(pods: Iterable[Requests]) -> Requests:
    total: Requests = {}
    for requests in pods:
        for name, count in requests.items():
            total[name] = total.get(name, 0) + count
    return total


def instance_needs(
    served: Mapping[_Key, Instance],
    node: str,
    *,
    config_resources: Mapping[_Key, str],
    wanted: Requests,
    starting: Requests,
) -> tuple[dict[_Key, int], set[_Key]]:
    """Per Instance ``node`` serves: how many of its slots pinned unscheduled pods want (the
    ``wanted`` of ``agent.slots.reservation_plan``), and the Instances a pod bound here that has
    not started may need (``hold``). ``config_resources``: (namespace, Configuration) → the
    Configuration-level resource name; ``wanted``/``starting``: ``PendingPods``' counts."""
    groups: dict[_Key, list[Instance]] = {}
    for (namespace, _), instance in served.items():
        groups.setdefault((namespace, instance.spec.configuration_name), []).append(instance)
    per_instance: dict[_Key, int] = {}
    holding: set[_Key] = set()
    for group, instances in groups.items():
        config_resource = config_resources.get(group, "")
        split = split_wanted(
            instances,
            node,
            by_instance={i.name: wanted.get(instance_resource_name(i.name), 0) for i in instances},
            by_configuration=wanted.get(config_resource, 0),
        )
        for instance in instances:
            key = (group[0], instance.name)
            per_instance[key] = split[instance.name]
            resource = instance_resource_name(instance.name)
            if starting.get(resource) or starting.get(config_resource):
                holding.add(key)
    return per_instance, holding


class PendingPods:
    """Pending pods' extended-resource requests that concern ``node``, kept current by a watch.

    ``wanted()``: resource → devices requested by unscheduled Pending pods pinned to ``node``.
    ``starting()``: resource → devices requested by Pending pods bound to ``node``.
    ``on_change`` is called after every change of either.
    """

    def __init__(
        self, *, client: AsyncClient, node: str, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self._client = client
        self.node = node
        self._on_change = on_change
        self._unscheduled: dict[str, Requests] = {}
        self._bound: dict[str, Requests] = {}

    def wanted(self) -> Requests:
        return _sum(self._unscheduled.values())

    def starting(self) -> Requests:
        return _sum(self._bound.values())

    async def run(self) -> None:
        def forget() -> None:
            # The watch starts over and lists every matching pod again; entries whose
            # deletion we missed must not linger.
            self._unscheduled.clear()
            self._bound.clear()

        stream = watching.watch(
            self._client, Pod, what="pending pods", namespace="*",
            fields={"status.phase": PENDING}, on_restart=forget,
        )
        async for op, pod in stream:
            self.update(pod, deleted=op == "DELETED")

    def update(self, pod: Pod, *, deleted: bool = False) -> None:
        """Take one watch event's pod into account (public so tests can feed it)."""
        uid = (pod.metadata.uid if pod.metadata else None) or ""
        before = (self._unscheduled.get(uid), self._bound.get(uid))
        self._unscheduled.pop(uid, None)
        self._bound.pop(uid, None)
        spec = pod.spec
        pending = pod.status is None or pod.status.phase in (None, PENDING)
        if not deleted and spec is not None and pending:
            if spec.nodeName == self.node and (counts := extended_requests(spec)):
                self._bound[uid] = counts
            elif (
                not spec.nodeName
                and pinned_node(spec) == self.node
                and (counts := extended_requests(spec))
            ):
                self._unscheduled[uid] = counts
        if (self._unscheduled.get(uid), self._bound.get(uid)) != before:
            self._on_change()
