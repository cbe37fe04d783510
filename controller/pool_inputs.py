"""What one shared Instance's pool is built from (``controller.shared_pools`` keeps one per
Instance): its inputs as the watch delivered them (``pool_inputs``), and the plan made from them
(``SharedDevice``): the pool's name, the slice content and its key, and the content once the
Configuration's eviction grace is over. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crds import dra_slices
from crds.configuration import Allocator
from crds.instance import STATUS_REPORTED, Instance

_Key = tuple[str, str]


def pool_inputs(data: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """Everything of an Instance's object its pool is built from (``SharedDevice.of``) but its
    name and namespace: equal inputs make an equal pool."""
    status = data.get("status") or {}
    return data.get("spec"), status.get(STATUS_REPORTED), status.get("unhealthy")


def wanted_pools(instances: Iterable[Instance],
                 modes: Mapping[_Key, Allocator]
                 ) -> tuple[dict[str, dra_slices.PoolPlan], frozenset[str]]:
    """The pools to publish for ``instances`` (shared ones whose Configuration's mode is DRA),
    and the pools held: wanted, but with no node's health known yet."""
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
                   plan=plan, key=dra_slices.content_key(plan) if plan is not None else None,
                   evicting=evicting,
                   evicting_key=dra_slices.content_key(evicting) if evicting else None)
