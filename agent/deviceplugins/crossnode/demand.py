"""Which device-plugin resources Pending pods need from this node: the demand watch.

``PendingPods`` follows three narrow watches, never every Pending pod in the cluster: Pending
pods labelled ``edgeplug.io/target-node=<node>`` (unscheduled and pinned here they are wanted,
bound here held, in one stream), Pending pods bound here (``spec.nodeName``: their kubelet may
be admitting them), and this node's Node, whose ``crds.pinning.PINNED_DEMAND_ANNOTATION`` is
the controller's count of every Pending pod pinned here, labelled or not. ``wanted()`` is the
larger of the labelled count and the Node's count less the pinned pods seen bound;
``starting()`` counts the bound ones, each pod once by uid. Only uid -> request counts are
kept, never the pods. ``instance_needs`` turns them into each Instance's want and hold for
``reservation_plan``. Why a pinned pod counts from creation to start with no gap:
docs/slots.md (C5).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from lightkube import AsyncClient
from lightkube.models.core_v1 import PodSpec
from lightkube.resources.core_v1 import Node, Pod

from agent.deviceplugins.slots.rules import split_wanted
from agent.kube import watching
from crds import pinning
from crds.instance import Instance
from crds.naming import LABEL_TARGET_NODE, instance_resource_name, target_node_label

log = logging.getLogger(__name__)

PENDING = "Pending"
#: The two pod streams (see the module docstring).
TARGETED = "labelled for this node"
BOUND = "bound to this node"

Requests = pinning.Requests
_Key = tuple[str, str]  # (namespace, Instance name)


def pinned_node(spec: PodSpec) -> str | None:
    """The node a pod can only run on, as the controller pins broker pods; None if unpinned."""
    return pinning.pinned_node(spec.to_dict())


def extended_requests(spec: PodSpec) -> Requests:
    """Extended resources (``<domain>/<name>``) the pod needs (``crds.pinning``)."""
    return pinning.extended_requests(spec.to_dict())


def instance_needs(
    served: Mapping[_Key, Instance],
    node: str,
    *,
    config_resources: Mapping[_Key, str],
    wanted: Requests,
    starting: Requests,
) -> tuple[dict[_Key, int], set[_Key]]:
    """Per Instance ``node`` serves: how many of its slots pinned unscheduled pods want (the
    ``wanted`` of ``agent.deviceplugins.slots.reservation_plan``), and the Instances a pod bound
    here that has not started may need (``hold``). ``config_resources``: (namespace, Configuration)
    → the Configuration-level resource name; ``wanted``/``starting``: ``PendingPods``' counts."""
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
    """Pending pods' extended-resource requests that concern ``node``, kept current by watches.

    ``wanted()``: resource → devices requested by unscheduled Pending pods labelled for and
    pinned to ``node``. ``starting()``: resource → devices requested by Pending pods bound to
    ``node``. ``on_change`` is called after every change of either.
    """

    def __init__(
        self,
        *,
        client: AsyncClient,
        node: str,
        on_change: Callable[[], None] = lambda: None,
        on_node: Callable[[Node], None] = lambda node: None,
    ) -> None:
        self._client = client
        self.node = node
        self._on_change = on_change
        #: Every state of this node's Node the watch delivers (``agent.deviceplugins.slots.handoff``
        #: reads its allocatable there).
        self._on_node = on_node
        #: Per stream: pod uid → (bound here?, requests).
        self._streams: dict[str, dict[str, tuple[bool, Requests]]] = {
            TARGETED: {}, BOUND: {}
        }
        #: Pods seen bound here that are pinned here (uid → requests): the controller's count
        #: still holds them until they start.
        self._bound_pinned: dict[str, Requests] = {}
        #: The controller's count for this node (``crds.pinning.PINNED_DEMAND_ANNOTATION``).
        self._annotated: Requests = {}

    def wanted(self) -> Requests:
        """Per resource, the larger of what the labelled pods pinned here want and what the
        controller counted for this node (every pinned Pending pod, labelled or not: its Node
        annotation) less the pinned pods seen bound here; the two count the same pods, each
        with its own lag."""
        bound = self._bound_uids()
        labelled = pinning.sum_requests(
            r for uid, (_, r) in self._streams[TARGETED].items() if uid not in bound
        )
        held = pinning.sum_requests(self._bound_pinned.values())
        wanted = {name: max(labelled.get(name, 0),
                            self._annotated.get(name, 0) - held.get(name, 0))
                  for name in labelled.keys() | self._annotated.keys()}
        return {name: count for name, count in wanted.items() if count > 0}

    def starting(self) -> Requests:
        counts: dict[str, Requests] = {}
        for table in self._streams.values():
            counts.update({uid: r for uid, (is_bound, r) in table.items() if is_bound})
        return pinning.sum_requests(counts.values())

    def _bound_uids(self) -> set[str]:
        return {
            uid for table in self._streams.values() for uid, (bound, _) in table.items() if bound
        }

    async def run(self, *, pods: bool = True) -> None:
        """Follow the streams; ``pods`` False (no ``watch`` on pods granted): the Node's alone."""
        async with asyncio.TaskGroup() as streams:
            if pods:
                streams.create_task(self._follow(
                    TARGETED, labels={LABEL_TARGET_NODE: target_node_label(self.node)}))
                streams.create_task(self._follow(BOUND, fields={"spec.nodeName": self.node}))
            streams.create_task(self._follow_node())

    async def _follow_node(self) -> None:
        """This node's Node object: the controller's count of pods pinned here (and its
        allocatable, for ``on_node``)."""
        events = watching.watch(
            self._client, Node, what="node (pinned demand)",
            fields={"metadata.name": self.node},
        )
        async for op, node in events:
            if op != "DELETED":
                self._on_node(node)
            annotations = (node.metadata.annotations if node.metadata else None) or {}
            self.annotated(None if op == "DELETED"
                           else annotations.get(pinning.PINNED_DEMAND_ANNOTATION))

    def annotated(self, value: str | None) -> None:
        """Take the Node's pinned-demand annotation into account (public so tests can feed
        it); a malformed one counts as none, with a warning."""
        before = self.wanted()
        try:
            self._annotated = pinning.parse_pinned_demand(value)
        except ValueError as error:
            log.warning("ignoring the Node's pinned demand: %s", error)
            self._annotated = {}
        if self.wanted() != before:
            self._on_change()

    async def _follow(
        self,
        stream: str,
        *,
        labels: Mapping[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        def forget() -> None:
            # The watch starts over and lists every matching pod again; entries whose
            # deletion we missed must not linger.
            self._streams[stream].clear()
            self._forget_unbound()
            self._on_change()

        events = watching.watch(
            self._client, Pod, what=f"pending pods ({stream})", namespace="*",
            fields={"status.phase": PENDING, **(fields or {})}, labels=labels, on_restart=forget,
        )
        async for op, pod in events:
            self.update(pod, deleted=op == "DELETED", stream=stream)

    def update(self, pod: Pod, *, deleted: bool = False, stream: str = TARGETED) -> None:
        """Take one watch event's pod into account (public so tests can feed it)."""
        uid = (pod.metadata.uid if pod.metadata else None) or ""
        before = (self.wanted(), self.starting())
        table = self._streams[stream]
        table.pop(uid, None)
        spec = pod.spec
        pending = pod.status is None or pod.status.phase in (None, PENDING)
        if not deleted and spec is not None and pending:
            if spec.nodeName == self.node and (counts := extended_requests(spec)):
                table[uid] = (True, counts)
                if pinned_node(spec) == self.node:
                    self._bound_pinned[uid] = counts
            elif (
                not spec.nodeName
                and stream == TARGETED
                and pinned_node(spec) == self.node
                and (counts := extended_requests(spec))
            ):
                table[uid] = (False, counts)
        self._forget_unbound()
        if (self.wanted(), self.starting()) != before:
            self._on_change()

    def _forget_unbound(self) -> None:
        bound = self._bound_uids()
        for uid in set(self._bound_pinned) - bound:
            del self._bound_pinned[uid]
