"""ResourceSlice bodies of edgeplug's pools, for the agent and the controller alike. Pure, no I/O.

An agent builds its node's local pools here (``agent.dra.slices.plan_node``), the controller
(``--dra``) the shared devices' pools (``controller.dra.shared_pools``, from ``shared_plan`` and
``pooled_plan``): pool and slice names, each device with its attributes, node selector, taints
(unhealthy, evicting, held by device plugins), ``slots`` capacity and, for partitions of one
device, the counters they consume. docs/dra.md, "What is published", says what and why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crds import dra
from crds.instance import Instance
from discovery_handlers.contract import PARTITION_CONSUMES as PROP_CONSUMES_COUNTERS
from discovery_handlers.contract import PARTITION_COUNTER_SET as PROP_COUNTER_SET
from discovery_handlers.contract import PARTITION_SHARED as PROP_SHARED_COUNTERS

#: The API's limits (k8s.io/api/resource/v1 validation).
MAX_DEVICES_PER_SLICE: Final = 128
#: A slice with a tainted device holds at most this many (ResourceSliceMaxDevicesWith
#: AdvancedFeatures: taints, counters, list attributes).
MAX_DEVICES_WITH_TAINTS: Final = 64
MAX_DEVICE_NAME: Final = 63
MAX_POOL_NAME: Final = 253
#: The pools a Configuration's shared devices are spread over (``shared_pool``): few enough
#: slices for the scheduler to walk, few enough devices a pool for a rewrite to stay small
#: (docs/dra.md, "What is published").
SHARED_POOL_BUCKETS: Final = 64
#: The Node label a shared pool's selector matches (well-known, set by the kubelet).
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
#: The taint an unhealthy device carries (DRADeviceTaints: beta, on by default in v1.36).
TAINT_UNHEALTHY: Final = f"{dra.DRIVER}/unhealthy"
#: The taint of a device whose every slot a device-plugin allocation holds.
TAINT_HELD: Final = f"{dra.DRIVER}/held"
#: A shared device none of whose nodes finds it healthy (and none says why) is tainted so.
UNHEALTHY_EVERYWHERE: Final = "unhealthy on every node"
MAX_LABEL_VALUE: Final = 63
LABEL_POOL: Final = f"{dra.DRIVER}/pool"
LABEL_NODE: Final = f"{dra.DRIVER}/node"
#: ``LABEL_MANAGED_BY`` of the agents' slices and of the controller's.
MANAGED_BY: Final = "edgeplug-agent"
CONTROLLER_MANAGED_BY: Final = dra.CLASS_MANAGER  # the controller, as on its DeviceClasses
#: The publisher the controller's slice names are made from (no node can be named so: a node
#: name is a DNS subdomain, without ``:``).
CONTROLLER_PUBLISHER: Final = ":controller"
_NOT_LABEL_VALUE: Final = re.compile(r"[^A-Za-z0-9._-]")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_COUNTER: Final = re.compile(r"^([a-z][a-z0-9_]{0,31})=([0-9]+(?:[KMGTPE]i)?)$")
_SHARED_POOL: Final = re.compile(r"^([^/]+/[^/]+/shared/[^/]+|edgeplug/[0-9a-f]+)$")


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
    """The pool of a shared device where devices carry their own node selector:
    ``<namespace>/<configuration>/shared/bucket-<nn>``, ``nn`` fixed by the Instance's name, so
    the device keeps its identity (driver, pool, device) for life, whichever nodes see it."""
    bucket = int(dra.digest(instance), 16) % SHARED_POOL_BUCKETS
    return _pool_name(namespace, configuration, "shared", f"bucket-{bucket:02d}")


def single_device_pool(namespace: str, configuration: str, instance: str) -> str:
    """``<namespace>/<configuration>/shared/<instance>``: a shared device's pool of its own,
    where the API server serves no per-device node selection (or an earlier release wrote it)."""
    return _pool_name(namespace, configuration, "shared", instance)


def is_shared_pool(pool: str) -> bool:
    """Whether ``pool`` is named as ``shared_pool`` names them."""
    return bool(_SHARED_POOL.match(pool))


def attributes(instance: Instance, *, reserved: int = 0) -> dra.Attributes:
    """The attributes of one Instance's device (``crds.dra.attributes``)."""
    return dra.attributes(namespace=instance.namespace,
                          configuration=instance.spec.configuration_name,
                          instance=instance.name, properties=instance.spec.broker_properties,
                          reserved=reserved)


@dataclass(frozen=True)
class PoolPlan:
    """One pool to publish: its devices (as API dicts) and where they can be used."""

    name: str
    node_name: str = ""  # local pools
    nodes: tuple[str, ...] = ()  # shared pools: the nodeSelector's nodes
    devices: tuple[Mapping[str, Any], ...] = ()
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the pool's counter sets (``sharedCounters``), when its devices are partitions
    counter_sets: tuple[Mapping[str, Any], ...] = ()
    #: each device names its nodes (``nodeSelector`` on the device, ``perDeviceNodeSelection``);
    #: ``nodes`` is then their union
    per_device_nodes: bool = False


def parse_counters(text: str) -> dict[str, dict[str, str]] | None:
    """``aicore=4,memory=4Gi`` as the API's counters (``{"aicore": {"value": "4"}, ...}``);
    None when it is not that."""
    found: dict[str, dict[str, str]] = {}
    for item in text.split(","):
        match = _COUNTER.match(item.strip())
        if match is None or match.group(1) in found:
            return None
        found[match.group(1)] = {"value": match.group(2)}
    return found or None


def _consumption(properties: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """A partition's ``consumesCounters`` from its properties (None: no partition)."""
    name = properties.get(PROP_COUNTER_SET, "")
    counters = parse_counters(properties.get(PROP_CONSUMES_COUNTERS, ""))
    if not _DNS_LABEL.match(name) or counters is None:
        return None
    return [{"counterSet": name, "counters": counters}]


def is_partition(instance: Instance) -> bool:
    return _consumption(instance.spec.broker_properties) is not None


def counter_sets(instances: Iterable[Instance]) -> tuple[dict[str, Any], ...]:
    """The counter sets the partitions among ``instances`` consume from, by name (the first
    partition naming a set gives its counters)."""
    found: dict[str, dict[str, Any]] = {}
    for instance in instances:
        props = instance.spec.broker_properties
        consumed = _consumption(props)
        shared = parse_counters(props.get(PROP_SHARED_COUNTERS, ""))
        if consumed is None or shared is None or consumed[0]["counterSet"] in found:
            continue
        found[consumed[0]["counterSet"]] = {"name": consumed[0]["counterSet"],
                                            "counters": shared}
    return tuple(found[name] for name in sorted(found))


def taint_value(reason: str) -> str:
    """A device taint's value is a label value: at most 63 of ``[A-Za-z0-9._-]``, starting and
    ending alphanumeric. The full reason stays on the Instance (``status.unhealthy``)."""
    value = _NOT_LABEL_VALUE.sub("-", reason)[:MAX_LABEL_VALUE].strip("-_.")
    return value or "unhealthy"


def _attribute_values(attrs: dra.Attributes) -> dict[str, dict[str, int | str]]:
    """The attributes as a slice holds them: ours strings, the standard ones typed."""
    values: dict[str, dict[str, int | str]] = {k: {"string": v} for k, v in attrs.values.items()}
    for name, value in attrs.standard.items():
        values[name] = {"int": value} if isinstance(value, int) else {"string": value}
    return dict(sorted(values.items()))


def device(instance: Instance, *, shared: bool, unhealthy: str | None, evict: bool = False
           ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """One Instance's device as a slice lists it, and the properties left out of it.
    ``evict``: an unhealthy device's taint is ``NoExecute`` (its grace is over)."""
    capacity = instance.spec.capacity
    multi = shared or capacity > 1
    attrs = attributes(instance, reserved=1 if multi else 0)
    body: dict[str, Any] = {
        "name": device_name(instance.name),
        "attributes": _attribute_values(attrs),
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
        # NoSchedule: no new allocation, claims that hold it keep it; NoExecute (the
        # Configuration's eviction grace is over): their pods are evicted too.
        taints.append({"key": TAINT_UNHEALTHY, "value": taint_value(unhealthy),
                       "effect": "NoExecute" if evict else "NoSchedule"})
    if free <= 0:
        taints.append({"key": TAINT_HELD, "value": "device-plugins", "effect": "NoSchedule"})
    if taints:
        body["taints"] = taints
    consumed = _consumption(instance.spec.broker_properties)
    if consumed is not None:
        body["consumesCounters"] = consumed
    return body, attrs.left_out


def shared_plan(instance: Instance, *, evict: bool = False) -> PoolPlan | None:
    """One shared Instance's device in a pool of its own (``single_device_pool``; ``pooled_plan``
    puts it in its ``shared_pool``), or None while no node lists it.

    An agent lists its node in ``spec.nodes`` only once its verdict is on the Instance (an
    unhealthy device's mark in ``status.unhealthy`` is written first): the selector names the
    listed nodes not marked unhealthy, so the device is never offered on a node before its
    health there is known. No node healthy: every node listed, the device tainted with a
    node's reason (``NoExecute`` with ``evict``).
    """
    nodes = sorted(set(instance.spec.nodes))
    if not nodes:
        return None
    healthy = tuple(n for n in nodes if n not in instance.unhealthy)
    reason = None
    if not healthy:
        reason = next((instance.unhealthy[n] for n in nodes if n in instance.unhealthy),
                      UNHEALTHY_EVERYWHERE)
    body, left = device(instance, shared=True, unhealthy=reason, evict=evict)
    return PoolPlan(name=single_device_pool(instance.namespace,
                                            instance.spec.configuration_name, instance.name),
                    nodes=healthy or tuple(nodes), devices=(body,),
                    left_out={instance.name: left} if left else {})


def hostname_selector(nodes: Iterable[str]) -> dict[str, Any]:
    """A node selector naming ``nodes`` by their hostname label. One term only: the API refuses
    more at slice level and the scheduler refuses more per device; a node-name (matchFields)
    requirement holds one value. The kubelet sets the label to the node name (docs/dra.md says
    where that does not hold)."""
    return {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}]}]}


def selector_nodes(selector: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The nodes a ``hostname_selector`` names (none for another selector)."""
    terms = (selector or {}).get("nodeSelectorTerms") or [{}]
    return tuple(v for e in terms[0].get("matchExpressions", []) for v in e["values"])


def pooled_plan(pool: str, plans: Iterable[PoolPlan],
                kept: Iterable[Mapping[str, Any]] = ()) -> PoolPlan:
    """One pool of shared devices, each naming its own nodes: the devices of ``plans`` (one
    device's pool each, ``shared_plan``) with their plan's nodes as their selector, and
    ``kept``: devices as written before (with their selector), held as they are."""
    devices: dict[str, Mapping[str, Any]] = {str(d["name"]): d for d in kept}
    left: dict[str, tuple[str, ...]] = {}
    for plan in plans:
        for device in plan.devices:
            devices[str(device["name"])] = {**device,
                                            "nodeSelector": hostname_selector(plan.nodes)}
        left.update(plan.left_out)
    ordered = tuple(devices[name] for name in sorted(devices))
    nodes = sorted({n for d in ordered for n in selector_nodes(d.get("nodeSelector"))})
    return PoolPlan(name=pool, nodes=tuple(nodes), devices=ordered, left_out=left,
                    per_device_nodes=True)


def unhealthy_everywhere(instance: Instance) -> bool:
    """Whether a shared device's pool is tainted unhealthy (``shared_plan``): some node is
    listed and every listed node marks it unhealthy."""
    nodes = instance.spec.nodes
    return bool(nodes) and all(n in instance.unhealthy for n in nodes)


def slice_name(pool: str, index: int, publisher: str) -> str:
    """``edgeplug.io-<digest of pool and publisher>-<index>``: stable, so a rewrite is an
    apply; naming the publisher keeps two publishers' slices of one pool apart."""
    return f"{dra.DRIVER}-{dra.digest(f'{pool}@{publisher}')}-{index}"


def pool_label(pool: str) -> str:
    """The value of ``LABEL_POOL`` (pool names hold slashes, label values may not)."""
    return dra.digest(pool)


def node_label(node: str) -> str:
    """The value of ``LABEL_NODE``: the node name, or a digest when it is no label value."""
    return node if len(node) <= MAX_DEVICE_NAME else dra.digest(node)


def slice_bodies(plan: PoolPlan, *, generation: int, publisher: str
                 ) -> list[dict[str, Any]]:
    """The pool's ResourceSlices, ``MAX_DEVICES_PER_SLICE`` devices each, or
    ``MAX_DEVICES_WITH_TAINTS`` when one of the pool's devices is tainted (an empty pool is no
    slice at all: the caller deletes what was there). ``publisher``: the agent's node (its
    slices carry ``LABEL_NODE``), or ``CONTROLLER_PUBLISHER``."""
    limit = (MAX_DEVICES_WITH_TAINTS
             if plan.per_device_nodes
             or any("taints" in d or "consumesCounters" in d for d in plan.devices)
             else MAX_DEVICES_PER_SLICE)
    chunks: list[tuple[Mapping[str, Any], ...]] = [
        plan.devices[i:i + limit] for i in range(0, len(plan.devices), limit)]
    count = len(chunks) + (1 if chunks and plan.counter_sets else 0)
    if publisher == CONTROLLER_PUBLISHER:
        labels = {LABEL_POOL: pool_label(plan.name), dra.LABEL_MANAGED_BY: CONTROLLER_MANAGED_BY}
    else:
        labels = {LABEL_POOL: pool_label(plan.name), LABEL_NODE: node_label(publisher),
                  dra.LABEL_MANAGED_BY: MANAGED_BY}
    result = []
    for index in range(count):
        spec: dict[str, Any] = {
            "driver": dra.DRIVER,
            "pool": {"name": plan.name, "generation": generation, "resourceSliceCount": count},
        }
        if index < len(chunks):
            spec["devices"] = [dict(d) for d in chunks[index]]
        else:  # the last slice holds the counter sets (a slice holds devices or counters)
            spec["sharedCounters"] = [dict(c) for c in plan.counter_sets]
        if plan.node_name:
            spec["nodeName"] = plan.node_name
        elif plan.per_device_nodes:
            spec["perDeviceNodeSelection"] = True
        else:
            spec["nodeSelector"] = hostname_selector(plan.nodes)
        result.append({
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(plan.name, index, publisher),
                         "labels": dict(labels)},
            "spec": spec,
        })
    return result
