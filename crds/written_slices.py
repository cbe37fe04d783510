"""What a ResourceSlice publisher finds it wrote (an agent its node's local pools, the
controller the shared ones): each pool's newest generation, slice names and content key
(``adopt``), read back from listed slices as they were written (``key_of_slices``), so a restart
rewrites no unchanged pool and generations keep growing. Pure, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crds.dra_slices import PoolPlan, selector_nodes


@dataclass(frozen=True)
class Written:
    """What a publisher knows it wrote for one pool."""

    generation: int
    names: tuple[str, ...]
    key: str  # canonical form of the pool's content, to skip unchanged rewrites


def content_key(plan: PoolPlan) -> str:
    parts: list[Any] = [plan.node_name, list(plan.nodes), list(plan.devices)]
    if plan.per_device_nodes:
        parts.append("per-device nodes")
    if plan.counter_sets:
        parts.append(list(plan.counter_sets))
    return json.dumps(parts, sort_keys=True)


def _index(name: str) -> int:
    """The index a slice name ends in (``slice_name``); 0 for a name not ours."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def as_written(body: Mapping[str, Any]) -> dict[str, Any]:
    """A listed device as a publisher writes it: the API server stamps ``timeAdded`` on taints."""
    result = dict(body)
    if "taints" in result:
        result["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"}
                            for t in result["taints"]]
    return result


def key_of_slices(found: Iterable[Mapping[str, Any]]) -> tuple[str, str, int]:
    """(pool name, content key, generation) of one pool's listed slices (one generation).
    Slice names end in their index, which restores the device order."""
    ordered = sorted(found, key=lambda s: _index(str(s["metadata"]["name"])))
    spec0 = ordered[0]["spec"]
    devices = tuple(as_written(d) for s in ordered for d in s["spec"].get("devices", []))
    per_device = bool(spec0.get("perDeviceNodeSelection"))
    nodes = (tuple(sorted({n for d in devices for n in selector_nodes(d.get("nodeSelector"))}))
             if per_device else selector_nodes(spec0.get("nodeSelector")))
    sets = tuple(c for s in ordered for c in s["spec"].get("sharedCounters") or [])
    plan = PoolPlan(name=spec0["pool"]["name"], node_name=spec0.get("nodeName") or "",
                    nodes=nodes, devices=devices, counter_sets=sets,
                    per_device_nodes=per_device)
    return plan.name, content_key(plan), int(spec0["pool"]["generation"])


def generation(body: Mapping[str, Any]) -> int:
    return int(body["spec"]["pool"]["generation"])


def adopt(found: Iterable[Mapping[str, Any]]) -> tuple[Written, list[str]]:
    """What a publisher wrote for one pool before a restart (``found``: its listed slices):
    the newest generation as ``Written``, and the names of older slices to delete."""
    found = list(found)
    newest = max(generation(s) for s in found)
    current = [s for s in found if generation(s) == newest]
    _, key, _ = key_of_slices(current)
    stale = [str(s["metadata"]["name"]) for s in found if generation(s) != newest]
    names = tuple(sorted(str(s["metadata"]["name"]) for s in current))
    return Written(generation=newest, names=names, key=key), stale
