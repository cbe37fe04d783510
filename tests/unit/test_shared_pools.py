"""Which shared pools the controller publishes (``controller.dra.pool_inputs.wanted_pools``), and
which Instance changes make ``controller.dra.shared_pools`` look at a pool again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from lightkube import AsyncClient

from controller.dra.pool_inputs import wanted_pools
from controller.dra.shared_pools import SharedPools
from crds import dra_slices
from crds.configuration import Allocator
from crds.instance import Instance, InstanceSpec

DRA, PLUGINS = Allocator.DRA, Allocator.DEVICE_PLUGIN


def _instance(name: str, configuration: str, *, shared: bool = True,
              nodes: tuple[str, ...] = ("n1", "n2")) -> Instance:
    return Instance(name=name, namespace="ns",
                    spec=InstanceSpec(configuration_name=configuration, shared=shared,
                                      nodes=nodes),
                    unhealthy={"n2": "gone"})


def test_only_shared_devices_of_configurations_the_scheduler_allocates() -> None:
    instances = [_instance("cam-000001", "cam"), _instance("cam-000002", "cam", shared=False),
                 _instance("old-000003", "old"), _instance("new-000004", "new"),
                 _instance("cam-000005", "cam", nodes=())]
    pools, held = wanted_pools(instances, {("ns", "cam"): DRA, ("ns", "old"): PLUGINS})
    assert list(pools) == [dra_slices.shared_pool("ns", "cam", "cam-000001")]
    assert pools[dra_slices.shared_pool("ns", "cam", "cam-000001")].nodes == ("n1",)
    # Wanted, but no node listed (an unhealthy device's mark goes first): held, not withdrawn.
    assert held == {dra_slices.shared_pool("ns", "cam", "cam-000005")}


# -- work follows what changed -----------------------------------------------------------------


class _Client:
    """Records the applies and deletes a pass makes; lists find nothing."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.deleted: list[str] = []

    async def patch(self, _resource: object, name: str, body: dict[str, Any],
                    **_: object) -> dict[str, Any]:
        self.applied.append(body["spec"]["pool"]["name"])
        return body

    async def delete(self, _resource: object, name: str, **_: object) -> None:
        self.deleted.append(name)

    def list(self, *_: object, **__: object) -> AsyncIterator[dict[str, Any]]:
        async def nothing() -> AsyncIterator[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            for item in found:
                yield item
        return nothing()


def _object(name: str, *, version: str = "1",
            status: dict[str, Any] | None = None, nodes: tuple[str, ...] = ("n1", "n2"),
            ) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {"configurationName": "cam", "shared": True, "nodes": list(nodes),
                     "capacity": 2},
            "status": {"unhealthy": {"n2": "gone"}, **(status or {})}}


async def _pools_of(count: int) -> tuple[SharedPools, _Client]:
    client = _Client()
    pools = SharedPools(cast(AsyncClient, client), namespaces=["ns"])
    pools.listed([_object(f"cam-{i:06x}") for i in range(count)])
    pools.set_mode(("ns", "cam"), DRA)
    pools.modes_listed()
    await pools.reconcile()
    return pools, client


async def test_a_write_that_changes_nothing_a_pool_is_built_from_marks_nothing() -> None:
    pools, client = await _pools_of(3)
    assert len(client.applied) == 3
    pools._wake.clear()
    # The controller's own display fields, a new resourceVersion, a slot record: no pool input.
    pools.put(("ns", "cam-000001"), _object("cam-000001", version="2",
                                            status={"servedBy": "dra", "claims": 1}))
    assert not pools._wake.is_set()
    await pools.reconcile()
    assert len(client.applied) == 3


async def test_a_pass_rewrites_only_the_pools_whose_inputs_changed() -> None:
    pools, client = await _pools_of(50)
    every_pool = {dra_slices.shared_pool("ns", "cam", f"cam-{i:06x}") for i in range(50)}
    assert len(client.applied) == len(every_pool) < 50  # devices share pools
    client.applied.clear()
    pools.put(("ns", "cam-000007"), _object("cam-000007", status={"unhealthy": {}}))
    assert pools._wake.is_set()
    await pools.reconcile()
    assert client.applied == [dra_slices.shared_pool("ns", "cam", "cam-000007")]
    # A device alone in its pool: the pool goes.
    alone = next(n for n in (f"cam-{i:06x}" for i in range(50))
                 if sum(dra_slices.shared_pool("ns", "cam", f"cam-{i:06x}")
                        == dra_slices.shared_pool("ns", "cam", n) for i in range(50)) == 1)
    pools.put(("ns", alone), None)
    await pools.reconcile()
    assert client.applied == [dra_slices.shared_pool("ns", "cam", "cam-000007")]
    assert len(client.deleted) == 1
    # A mode change looks at that Configuration's pools: every one withdrawn.
    pools.set_mode(("ns", "cam"), PLUGINS)
    await pools.reconcile()
    assert len(client.deleted) == len(every_pool)


async def test_without_per_device_node_selection_each_device_has_a_pool_of_its_own() -> None:
    client = _Client()
    pools = SharedPools(cast(AsyncClient, client), namespaces=["ns"])
    pools.per_device_nodes = False  # what the dry-run write found on an API server without it
    names = [f"cam-{i:06x}" for i in range(5)]
    pools.listed([_object(n) for n in names])
    pools.set_mode(("ns", "cam"), DRA)
    pools.modes_listed()
    await pools.reconcile()
    assert sorted(client.applied) == sorted(
        dra_slices.single_device_pool("ns", "cam", n) for n in names)


class _ListingClient(_Client):
    """Lists the slices it is given (what an earlier controller wrote)."""

    def __init__(self, slices: list[dict[str, Any]]) -> None:
        super().__init__()
        self.slices = slices

    def list(self, *_: object, **__: object) -> AsyncIterator[dict[str, Any]]:
        async def listed() -> AsyncIterator[dict[str, Any]]:
            for item in self.slices:
                yield item
        return listed()


async def test_a_device_an_earlier_release_gave_a_pool_of_its_own_stays_in_it() -> None:
    old = Instance.from_object(_object("cam-000003"))
    own = dra_slices.shared_plan(old)
    assert own is not None
    client = _ListingClient(dra_slices.slice_bodies(
        own, generation=4, publisher=dra_slices.CONTROLLER_PUBLISHER))
    pools = SharedPools(cast(AsyncClient, client), namespaces=["ns"])
    pools.per_device_nodes = True
    pools.listed([_object(f"cam-{i:06x}") for i in range(5)])
    pools.set_mode(("ns", "cam"), DRA)
    pools.modes_listed()
    await pools._adopt()
    await pools.reconcile()
    assert own.name == dra_slices.single_device_pool("ns", "cam", "cam-000003")
    assert own.name not in client.applied, "unchanged: not rewritten"
    assert set(client.applied) == {dra_slices.shared_pool("ns", "cam", f"cam-{i:06x}")
                                   for i in (0, 1, 2, 4)}
    # Its health changes: rewritten in the same pool, claims allocated from it still count.
    pools.put(("ns", "cam-000003"), _object("cam-000003", status={"unhealthy": {}}))
    await pools.reconcile()
    assert client.applied[-1] == own.name


# -- eviction of pods holding a device unhealthy everywhere ------------------------------------


class _BodyClient(_Client):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    async def patch(self, _resource: object, name: str, body: dict[str, Any],
                    **_: object) -> dict[str, Any]:
        self.bodies.append(body)
        return await super().patch(_resource, name, body)


def _effects(client: _BodyClient) -> list[str | None]:
    found: list[str | None] = []
    for body in client.bodies:
        taints = body["spec"]["devices"][0].get("taints") or [{}]
        found.append(taints[0].get("effect"))
    return found


SICK = {"unhealthy": {"n1": "gone", "n2": "gone"}}


async def test_a_device_unhealthy_everywhere_evicts_after_the_configurations_grace() -> None:
    client = _BodyClient()
    pools = SharedPools(cast(AsyncClient, client), namespaces=["ns"])
    pools.listed([_object("cam-000001", status={"unhealthy": {}})])
    pools.set_mode(("ns", "cam"), DRA)
    pools.set_eviction_grace(("ns", "cam"), 0)
    pools.modes_listed()
    await pools.reconcile()
    pools.put(("ns", "cam-000001"), _object("cam-000001", status=SICK))
    await pools.reconcile()
    # Healthy somewhere: no taint; unhealthy everywhere with a grace of 0: NoExecute at once.
    assert _effects(client) == [None, "NoExecute"]
    # Recovery takes the taint away.
    pools.put(("ns", "cam-000001"), _object("cam-000001", status={"unhealthy": {}}))
    await pools.reconcile()
    assert _effects(client) == [None, "NoExecute", None]


async def test_without_the_field_or_within_the_grace_the_taint_is_no_schedule() -> None:
    client = _BodyClient()
    pools = SharedPools(cast(AsyncClient, client), namespaces=["ns"])
    pools.listed([_object("cam-000001", status=SICK)])
    pools.set_mode(("ns", "cam"), DRA)
    pools.modes_listed()
    await pools.reconcile()
    assert _effects(client) == ["NoSchedule"]
    # A grace of a day: still NoSchedule, and a timer is running for its end.
    pools.set_eviction_grace(("ns", "cam"), 86400)
    await pools.reconcile()
    assert _effects(client) == ["NoSchedule"]
    assert pools._grace_timer is not None
    # The field lowered to 0: the device is past it, evicting.
    pools.set_eviction_grace(("ns", "cam"), 0)
    await pools.reconcile()
    assert _effects(client) == ["NoSchedule", "NoExecute"]
    pools.set_eviction_grace(("ns", "cam"), None)
    await pools.reconcile()
    assert _effects(client) == ["NoSchedule", "NoExecute", "NoSchedule"]


# -- what changed: which Instance events mark their pool ---------------------------------------


def _changed(**change: Any) -> dict[str, Any]:
    """The Instance of ``_object("cam-000001")`` with ``change`` merged into its parts."""
    body = _object("cam-000001")
    for part, fields in change.items():
        body[part] = {**body[part], **fields}
    return body


WHAT_CHANGED: list[tuple[str, dict[str, Any] | None, bool]] = [
    ("nothing (a resync)", _changed(), False),
    ("a new resourceVersion", _changed(metadata={"resourceVersion": "9"}), False),
    ("a label and an annotation",
     _changed(metadata={"labels": {"a": "b"}, "annotations": {"c": "d"}}), False),
    ("the controller's servedBy and claims", _changed(status={"servedBy": "dra", "claims": 2}),
     False),
    ("status.used as the agent writes it", _changed(status={"used": 0}), False),
    ("a previous release's agent's reported mark",
     _changed(status={"reported": {"n1": True, "n2": True}}), False),
    ("a free slot's record", _changed(spec={"deviceUsage": {"cam-000001-0": ""}}), False),
    ("a node joins (its verdict the listing)", _changed(spec={"nodes": ["n1", "n2", "n3"]}),
     True),
    ("a node finds it unhealthy", _changed(status={"unhealthy": {"n1": "gone"}}), True),
    ("a slot held by a device plugin",
     _changed(spec={"deviceUsage": {"cam-000001-0": "n1"}}), True),
    ("its capacity", _changed(spec={"capacity": 3}), True),
    ("a broker property (an attribute)", _changed(spec={"brokerProperties": {"IP": "10.0.0.7"}}),
     True),
    ("the healthy node leaves", _changed(spec={"nodes": ["n2"]}), True),
    ("no longer shared", _changed(spec={"shared": False}), True),
    ("deleted", None, True),
]


@pytest.mark.parametrize(("change", "body", "marks"), WHAT_CHANGED,
                         ids=[c[0] for c in WHAT_CHANGED])
def test_an_instance_event_marks_its_pool_only_when_a_pool_input_changed(
        change: str, body: dict[str, Any] | None, marks: bool) -> None:
    pools = SharedPools(cast(AsyncClient, object()), namespaces=["ns"])
    pools.listed([_object("cam-000001"), _object("cam-000002")])
    pools.set_mode(("ns", "cam"), DRA)
    pools.modes_listed()
    pools._taken()  # the full pass after the list
    pools._wake.clear()
    pools.put(("ns", "cam-000001"), body)
    assert pools._wake.is_set() is marks, change
    assert pools._taken() == ({dra_slices.shared_pool("ns", "cam", "cam-000001")}
                              if marks else set()), change
