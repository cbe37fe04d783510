"""Instances in, ResourceSlice bodies out: what this node publishes for DRA. Pure, no I/O.

Why this exists: the publisher (``agent.dra.publisher``) only diffs and writes; every decision
about what the scheduler sees is made here, over plain data, and unit-tested over tables.

Pools (``spec.pool.name``, one driver ``edgeplug.io`` for all, see ``crds.dra``):

- A local device (a USB port, an NPU) belongs to the pool ``<namespace>/<configuration>/node/
  <node>``: one pool per Configuration per node, its slices bound to the node (``nodeName``).
  The pool name ends in the node's name even when it is too long and digested, since the
  agents' slice policy ties a local pool to the node whose token writes it by that suffix.
- A shared device (a network camera seen by several nodes) gets a pool of its own,
  ``<namespace>/<configuration>/shared/<instance>``, whose one slice's ``nodeSelector`` lists
  (by ``kubernetes.io/hostname``) every node of the Instance that finds it healthy. It is
  published once, by the lexically first node of the Instance's ``spec.nodes``. The pool name
  does not name the publisher, so when the publishing node leaves and the next one takes
  over, the device keeps its identity (driver, pool, device name): claims already allocated
  it keep counting against its capacity, and the scheduler never sees it twice. During a
  hand-over two slices of one pool may exist for an instant; the scheduler ignores the older
  generation, and two of one generation make the pool incomplete, so it allocates nothing
  from it rather than twice.
- Unhealthy devices (``status.unhealthy.<node>`` on the Instance: present but unusable, or a
  shared device not seen during its grace period) stay published with a ``NoSchedule`` taint
  ``edgeplug.io/unhealthy`` whose value is the reason (made a label value): the scheduler
  allocates them to no new claim, claims that hold one keep it, and users see why. A shared
  device drops an unhealthy node from its selector and is tainted when no node finds it
  healthy. A device that is gone (its Instance deleted, or this node left it) is withdrawn.
- This node's health of a device is the agent's own verdict (its device table), not the
  Instance's status, which is written after the Instance and lags it: a pool holding a device
  this node does not serve yet is held, neither published nor withdrawn, so no device is ever
  published healthy before its health is known (``plan_node``).

Attributes: ``crds.dra.attributes`` (the mapping users select by lives with the API):
``namespace``, ``configuration``, ``instance``, then each property of the Instance (its
``brokerProperties``) under a short alias where one exists and its lower-cased name; what does
not fit the API's limits is left out and counted.

Shared devices, and local ones of capacity above 1: ``allowMultipleAllocations: true`` and a
consumable capacity ``slots`` whose ``requestPolicy`` makes each claim take one unit by default
(KEP-5075; beta and on by default in v1.36). Its value is the Instance's ``capacity`` less the
slots device plugins hold (``deviceUsage``); a device whose every slot they hold is tainted
``edgeplug.io/held=device-plugins:NoSchedule``. The device plugins, in turn, withhold the slots
claims hold (``status.claims``; ``agent.slots.rules``, "DRA claims").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crds import dra
from crds.instance import Instance

#: The API's limits (k8s.io/api/resource/v1 validation).
MAX_DEVICES_PER_SLICE: Final = 128
#: A slice with a tainted device holds at most this many (ResourceSliceMaxDevicesWith
#: AdvancedFeatures: taints, counters, list attributes).
MAX_DEVICES_WITH_TAINTS: Final = 64
MAX_DEVICE_NAME: Final = 63
MAX_POOL_NAME: Final = 253
#: The Node label a shared pool's selector matches (well-known, set by the kubelet).
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
#: The taint an unhealthy device carries (DRADeviceTaints: beta, on by default in v1.36).
TAINT_UNHEALTHY: Final = f"{dra.DRIVER}/unhealthy"
#: The taint of a device whose every slot a device-plugin allocation holds.
TAINT_HELD: Final = f"{dra.DRIVER}/held"
MAX_LABEL_VALUE: Final = 63
_NOT_LABEL_VALUE: Final = re.compile(r"[^A-Za-z0-9._-]")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def device_name(instance: str) -> str:
    """The Instance name when it is a DNS label (Instance names are ``<config>-<hex>``),
    otherwise a digest form."""
    if len(instance) <= MAX_DEVICE_NAME and _DNS_LABEL.match(instance):
        return instance
    return f"d-{dra.digest(instance)}"


def _pool_name(*parts: str) -> str:
    name = "/".join(parts)
    return name if len(name) <= MAX_POOL_NAME else f"edgeplug/{dra.digest(name)}"


def local_pool(namespace: str, configuration: str, node: str) -> str:
    """``<namespace>/<configuration>/node/<node>``. Too long, the first part becomes a digest
    but the node stays at the end: the agent's slice policy
    (deploy/dra/agent-resourceslice-policy.yaml) ties a local pool to the node whose token
    writes it by that suffix."""
    name = _pool_name(namespace, configuration, "node", node)
    if name.endswith(f"/node/{node}"):
        return name
    return f"edgeplug/{dra.digest(f'{namespace}/{configuration}')}/node/{node}"


def shared_pool(namespace: str, configuration: str, instance: str) -> str:
    return _pool_name(namespace, configuration, "shared", instance)


def attributes(instance: Instance, *, reserved: int = 0) -> dra.Attributes:
    """The attributes of one Instance's device (``crds.dra.attributes``)."""
    return dra.attributes(namespace=instance.namespace,
                          configuration=instance.spec.configuration_name,
                          instance=instance.name, properties=instance.spec.broker_properties,
                          reserved=reserved)


@dataclass(frozen=True)
class PoolPlan:
    """One pool this node publishes: its devices (as API dicts) and where they can be used."""

    name: str
    node_name: str = ""  # local pools
    nodes: tuple[str, ...] = ()  # shared pools: the nodeSelector's nodes
    devices: tuple[Mapping[str, Any], ...] = ()
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


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


def taint_value(reason: str) -> str:
    """A device taint's value is a label value: at most 63 of ``[A-Za-z0-9._-]``, starting and
    ending alphanumeric. The full reason stays on the Instance (``status.unhealthy``)."""
    value = _NOT_LABEL_VALUE.sub("-", reason)[:MAX_LABEL_VALUE].strip("-_.")
    return value or "unhealthy"


def _device(instance: Instance, *, shared: bool, unhealthy: str | None
            ) -> tuple[dict[str, Any], tuple[str, ...]]:
    capacity = instance.spec.capacity
    multi = shared or capacity > 1
    attrs = attributes(instance, reserved=1 if multi else 0)
    body: dict[str, Any] = {
        "name": device_name(instance.name),
        "attributes": {k: {"string": v} for k, v in sorted(attrs.values.items())},
    }
    # Slots the device plugins hold (deviceUsage) are not offered to claims as well.
    free = capacity - instance.spec.used
    if multi:
        body["allowMultipleAllocations"] = True
        body["capacity"] = {dra.CAPACITY_SLOTS: {
            "value": str(max(free, 1)),
            "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
        }}
    taints = []
    if unhealthy is not None:
        # NoSchedule: no new allocation; claims that hold it keep it (NoExecute would evict).
        taints.append({"key": TAINT_UNHEALTHY, "value": taint_value(unhealthy),
                       "effect": "NoSchedule"})
    if free <= 0:
        taints.append({"key": TAINT_HELD, "value": "device-plugins", "effect": "NoSchedule"})
    if taints:
        body["taints"] = taints
    return body, attrs.left_out


def plan_node(node: str, instances: Iterable[Instance], served: Served | None = None
              ) -> NodePlan:
    """The pools ``node`` publishes for ``instances`` (every Instance it knows of).

    ``served`` is this node's own verdict on the devices it serves (``Served``). It outranks
    the Instance's ``status.unhealthy.<node>``, which is written after the Instance (and after
    every other Instance of a discovery pass) and so lags. A device of this node's that
    ``served`` lacks has no known health here yet: its pool is held (``NodePlan.held``), never
    published as though the device were healthy. None: health from the Instances alone.
    """
    local: dict[str, list[tuple[Instance, str | None]]] = {}
    pools: dict[str, PoolPlan] = {}
    tainted: dict[str, str] = {}
    held: set[str] = set()
    for inst in instances:
        nodes = sorted(set(inst.spec.nodes))
        if node not in nodes:
            continue
        unhealthy = dict(inst.unhealthy)
        known = served is None or (inst.namespace, inst.name) in served
        if served is not None and known:
            verdict = served[(inst.namespace, inst.name)]
            if verdict is None:
                unhealthy.pop(node, None)
            else:
                unhealthy[node] = verdict
        if not inst.spec.shared:
            pool = local_pool(inst.namespace, inst.spec.configuration_name, node)
            if not known:
                held.add(pool)
            elif node in unhealthy:
                tainted[inst.name] = unhealthy[node]
            local.setdefault(pool, []).append((inst, unhealthy.get(node)))
            continue
        if nodes[0] != node:
            continue  # another node publishes it
        name = shared_pool(inst.namespace, inst.spec.configuration_name, inst.name)
        if not known:
            held.add(name)
            continue
        healthy = tuple(n for n in nodes if n not in unhealthy)
        reason = None
        if not healthy:  # usable nowhere: kept visible on every node, tainted
            reason = unhealthy.get(node, "unhealthy on every node")
            tainted[inst.name] = reason
        body, left = _device(inst, shared=True, unhealthy=reason)
        pools[name] = PoolPlan(name=name, nodes=healthy or tuple(nodes), devices=(body,),
                               left_out={inst.name: left} if left else {})
    for name, members in local.items():
        if name in held:
            continue
        bodies: list[dict[str, Any]] = []
        left_out: dict[str, tuple[str, ...]] = {}
        for inst, reason in sorted(members, key=lambda m: m[0].name):
            body, left = _device(inst, shared=False, unhealthy=reason)
            bodies.append(body)
            if left:
                left_out[inst.name] = left
        pools[name] = PoolPlan(name=name, node_name=node, devices=tuple(bodies),
                               left_out=left_out)
    return NodePlan(pools=pools, tainted=tainted, held=frozenset(held))


def slice_name(pool: str, index: int, publisher: str) -> str:
    """``edgeplug.io-<digest of pool and publisher>-<index>``: stable, so a rewrite is an
    apply; naming the publisher keeps two nodes' slices of one pool apart in a hand-over."""
    return f"{dra.DRIVER}-{dra.digest(f'{pool}@{publisher}')}-{index}"


def pool_label(pool: str) -> str:
    """The value of ``LABEL_POOL`` (pool names hold slashes, label values may not)."""
    return dra.digest(pool)


def node_label(node: str) -> str:
    """The value of ``LABEL_NODE``: the node name, or a digest when it is no label value."""
    return node if len(node) <= MAX_DEVICE_NAME else dra.digest(node)


LABEL_POOL: Final = f"{dra.DRIVER}/pool"
LABEL_NODE: Final = f"{dra.DRIVER}/node"
MANAGED_BY: Final = "edgeplug-agent"


def slice_bodies(plan: PoolPlan, *, generation: int, publisher: str) -> list[dict[str, Any]]:
    """The pool's ResourceSlices, ``MAX_DEVICES_PER_SLICE`` devices each, or
    ``MAX_DEVICES_WITH_TAINTS`` when one of the pool's devices is tainted (an empty pool is no
    slice at all: the caller deletes what was there)."""
    limit = (MAX_DEVICES_WITH_TAINTS if any("taints" in d for d in plan.devices)
             else MAX_DEVICES_PER_SLICE)
    chunks = [plan.devices[i:i + limit] for i in range(0, len(plan.devices), limit)]
    result = []
    for index, chunk in enumerate(chunks):
        spec: dict[str, Any] = {
            "driver": dra.DRIVER,
            "pool": {"name": plan.name, "generation": generation,
                     "resourceSliceCount": len(chunks)},
            "devices": [dict(d) for d in chunk],
        }
        if plan.node_name:
            spec["nodeName"] = plan.node_name
        else:
            # One term only: the API refuses more at slice level and the scheduler refuses
            # more per device; a node-name (matchFields) requirement holds one value. So the
            # nodes are named by their hostname label, which the kubelet sets to the node name
            # (docs/dra.md says where that does not hold).
            spec["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": list(plan.nodes)}]}]}
        result.append({
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(plan.name, index, publisher),
                "labels": {LABEL_POOL: pool_label(plan.name), LABEL_NODE: node_label(publisher),
                           dra.LABEL_MANAGED_BY: MANAGED_BY},
            },
            "spec": spec,
        })
    return result
