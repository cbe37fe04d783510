"""In-memory ``Instance`` views for the pure slot-rule tests.

Tests/unit/test_slots.py and tests/unit/test_slots_demand.py both judge the
slot rules against a shared Instance of two nodes; one builder keeps their Instances alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from crds.instance import Instance, InstanceSpec

#: The Instance the slot-rule tests use unless they say otherwise.
NAME = "cam-1a2b3c"
NODES = ("node-a", "node-b")


def slot_instance(
    *,
    nodes: tuple[str, ...] = NODES,
    capacity: int = 2,
    usage: Mapping[str, str] | None = None,
    reservations: Mapping[str, str] | None = None,
    demand: Mapping[str, int] | None = None,
    name: str = NAME,
) -> Instance:
    """A shared Instance of configuration ``cam`` in namespace ``ns``."""
    return Instance(
        name=name,
        namespace="ns",
        spec=InstanceSpec(
            configuration_name="cam",
            capacity=capacity,
            shared=True,
            nodes=nodes,
            device_usage=dict(usage or {}),
        ),
        reservations=dict(reservations or {}),
        demand=dict(demand or {}),
    )
