"""Instances in, this node's local pools out: what the agent publishes for DRA. Pure, no I/O.

``plan_node`` gives one pool per Configuration with local devices here
(``<namespace>/<configuration>/node/<node>``), bound to this node; a pool holding a device the
device table does not serve yet is held back, so nothing is published healthy before its health
is known; a present but unhealthy device stays, tainted; partitions are left out where the
cluster drops counter sets. Slice bodies are ``crds.dra_slices``'s, shared with the controller,
which publishes the shared devices' pools. docs/dra.md, "What is published".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crds.dra_slices import LABEL_NODE as LABEL_NODE
from crds.dra_slices import LABEL_POOL as LABEL_POOL
from crds.dra_slices import MAX_POOL_NAME as MAX_POOL_NAME
from crds.dra_slices import TAINT_HELD as TAINT_HELD
from crds.dra_slices import TAINT_UNHEALTHY as TAINT_UNHEALTHY
from crds.dra_slices import PoolPlan as PoolPlan
from crds.dra_slices import attributes as attributes
from crds.dra_slices import counter_sets, device, is_partition
from crds.dra_slices import device_name as device_name
from crds.dra_slices import local_pool as local_pool
from crds.dra_slices import node_label as node_label
from crds.dra_slices import pool_label as pool_label
from crds.dra_slices import shared_pool as shared_pool
from crds.dra_slices import single_device_pool as single_device_pool
from crds.dra_slices import slice_bodies as slice_bodies
from crds.dra_slices import slice_name as slice_name
from crds.dra_slices import taint_value as taint_value
from crds.instance import Instance


@dataclass(frozen=True)
class NodePlan:
    """Every pool this node should publish, and the devices it taints (instance → reason).
    ``held``: pools holding a device of this node's whose health this node does not know yet;
    they are neither published nor withdrawn (what was published for them stays)."""

    pools: Mapping[str, PoolPlan]
    tainted: Mapping[str, str] = field(default_factory=dict)
    held: frozenset[str] = frozenset()


#: This node's own verdict on each device it serves now: (namespace, Instance name) → None when
#: healthy, else the reason (the agent's device table).
Served = Mapping[tuple[str, str], str | None]


def plan_node(node: str, instances: Iterable[Instance], served: Served | None = None,
              evicting: Collection[tuple[str, str]] = frozenset(), *,
              partitions: bool = True) -> NodePlan:
    """The local pools ``node`` publishes for ``instances`` (every Instance it knows of; shared
    ones are the controller's and left out).

    ``served`` is this node's own verdict on the devices it serves (``Served``). It outranks
    the Instance's ``status.unhealthy.<node>``, which is written after the Instance (and after
    every other Instance of a discovery pass) and so lags. A device of this node's that
    ``served`` lacks has no known health here yet: its pool is held (``NodePlan.held``), never
    published as though the device were healthy. None: health from the Instances alone.
    ``evicting``: (namespace, Instance name) of unhealthy devices whose taint is ``NoExecute``.
    ``partitions``: whether partitions are published (false: left out).
    """
    local: dict[str, list[tuple[Instance, str | None]]] = {}
    pools: dict[str, PoolPlan] = {}
    tainted: dict[str, str] = {}
    held: set[str] = set()
    for inst in instances:
        if inst.spec.shared or node not in inst.spec.nodes:
            continue
        if not partitions and is_partition(inst):
            continue
        unhealthy = inst.unhealthy.get(node)
        known = served is None or (inst.namespace, inst.name) in served
        if served is not None and known:
            unhealthy = served[(inst.namespace, inst.name)]
        pool = local_pool(inst.namespace, inst.spec.configuration_name, node)
        if not known:
            held.add(pool)
        elif unhealthy is not None:
            tainted[inst.name] = unhealthy
        local.setdefault(pool, []).append((inst, unhealthy))
    for name, members in local.items():
        if name in held:
            continue
        bodies: list[dict[str, Any]] = []
        left_out: dict[str, tuple[str, ...]] = {}
        for inst, reason in sorted(members, key=lambda m: m[0].name):
            body, left = device(inst, shared=False, unhealthy=reason,
                                evict=(inst.namespace, inst.name) in evicting)
            bodies.append(body)
            if left:
                left_out[inst.name] = left
        pools[name] = PoolPlan(name=name, node_name=node, devices=tuple(bodies),
                               left_out=left_out,
                               counter_sets=counter_sets(inst for inst, _ in members))
    return NodePlan(pools=pools, tainted=tainted, held=frozenset(held))
