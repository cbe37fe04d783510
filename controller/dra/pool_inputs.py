"""What shared devices' pools are built from (``controller.dra.shared_pools`` keeps one
``SharedDevice`` per Instance): an Instance's inputs as the watch delivered them
(``pool_inputs``), the plan of its device (its pool's name, its content and key, and the content
once the Configuration's eviction grace is over), the pool it is published in (``pool_of``) and
a pool's content from its devices' (``assemble``). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from crds import dra_slices, written_slices
from crds.configuration import Allocator
from crds.instance import Instance

_Key = tuple[str, str]


def pool_inputs(data: Mapping[str, Any]) -> tuple[Any, Any]:
    """Everything of an Instance's object its pool is built from (``SharedDevice.of``) but its
    name and namespace: equal inputs make an equal pool."""
    return data.get("spec"), (data.get("status") or {}).get("unhealthy")


def wanted_pools(instances: Iterable[Instance],
                 modes: Mapping[_Key, Allocator]
                 ) -> tuple[dict[str, dra_slices.PoolPlan], frozenset[str]]:
    """The pools to publish for ``instances`` (shared ones whose Configuration's mode is DRA),
    and the pools held: wanted, but with no node listed yet."""
    pools: dict[str, dra_slices.PoolPlan] = {}
    held: set[str] = set()
    for inst in instances:
        if not inst.spec.shared or modes.get(
                (inst.namespace, inst.spec.configuration_name)) != Allocator.DRA:
            continue
        device = SharedDevice.of(inst)
        if device.plan is None:
            held.add(device.pool)
        else:
            pools[device.pool] = device.plan
    return pools, frozenset(held)


def pool_of(key: _Key, device: SharedDevice, *, adopted: Mapping[tuple[str, str], str],
            per_device_nodes: bool) -> str:
    """The pool a shared device is published in: the pool of its own an earlier release put it
    in (``adopted``, by namespace and device name), else its ``shared_pool`` where devices name
    their own nodes, else a pool of its own."""
    own = adopted.get((key[0], dra_slices.device_name(key[1])))
    if own is not None:
        return own
    if per_device_nodes:
        return device.pool
    return dra_slices.single_device_pool(key[0], device.configuration, key[1])


def assemble(pool: str, plans: list[dra_slices.PoolPlan], held: list[str],
             written: Mapping[str, Mapping[str, Any]], *, pooled: bool
             ) -> tuple[dra_slices.PoolPlan | None, bool]:
    """What ``pool`` is to hold, from its wanted devices' own plans (``SharedDevice.plan``) and
    the names of those ``held`` (no node listed): None when nothing (withdraw it), and
    whether it is held as written. A pool of its own (not ``pooled``) whose device is held
    stays as written; in a pool of many, a held device keeps its entry as ``written``."""
    if not pooled:
        if plans:
            return replace(plans[0], name=pool), False
        return None, bool(held)
    kept = [written[name] for name in held if name in written]
    if not plans and not kept:
        return None, False
    return dra_slices.pooled_plan(pool, plans, kept), False


@dataclass(frozen=True)
class SharedDevice:
    """What one shared Instance's pool is built from, made once per watch event that changes
    it: its Configuration, its pool's name, and the pool's plan and content key (None: held,
    no node's verdict known yet)."""

    configuration: str
    pool: str
    plan: dra_slices.PoolPlan | None
    key: str | None
    #: Unhealthy on every node: the same pool with the taint ``NoExecute``, for once the
    #: Configuration's eviction grace is over (None: healthy somewhere, or held).
    evicting: dra_slices.PoolPlan | None = None
    evicting_key: str | None = None

    @classmethod
    def of(cls, instance: Instance) -> SharedDevice:
        plan = dra_slices.shared_plan(instance)
        evicting = (dra_slices.shared_plan(instance, evict=True)
                    if plan is not None and dra_slices.unhealthy_everywhere(instance) else None)
        return cls(configuration=instance.spec.configuration_name,
                   pool=dra_slices.shared_pool(instance.namespace,
                                               instance.spec.configuration_name, instance.name),
                   plan=plan, key=written_slices.content_key(plan) if plan is not None else None,
                   evicting=evicting,
                   evicting_key=written_slices.content_key(evicting) if evicting else None)
