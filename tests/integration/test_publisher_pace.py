"""A Configuration of many shared devices is published at the API server's pace.

Against the real API server, one node's ``InstancePublisher`` publishes a list of shared
devices new to it, its client's calls recorded in order: the collision names are read in one
list (not a GET per device) from ``LIST_FROM`` new devices on, and by a GET each below. What a
device costs depends on who allocates it: where the scheduler does, one apply (it makes the
Instance, no slot map, and listing the node is its healthy verdict); where device plugins do, its
create (with the slots) and its apply; where a controller of the previous release chose, also its
first verdict (``status.reported``), which goes ahead of later Instances and before the device
reaches the table. A device another node publishes under its collision name is joined there.
Withdrawn, an Instance the node alone is listed on costs a read and a delete, and this
process's watches take its deletion unread.
"""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import AsyncClient

from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.name_records import LIST_FROM
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.kube import node_instances
from agent.kube.client import ConfigurationResource, InstanceResource, as_dict
from agent.metrics import AgentMetrics
from agent.settings import current
from crds.configuration import Allocator, Configuration
from crds.instance import STATUS_REPORTED
from crds.naming import collision_instance_name, device_digest, instance_name, slot_id
from discovery_handlers.contract import Device, Health
from discovery_handlers.registry import load_handler
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane

CFG = "pace"
CAPACITY = 2
#: Devices of the list that takes the one list: more than ``LIST_FROM``, and more than the
#: writes the publisher has in flight, so that a verdict can go ahead of a later device's create.
MANY = current().publishing.writes_in_flight + LIST_FROM

Call = tuple[str, str]  # (what: get, list, create, apply, status, ...; the Instance name)


def _record(client: AsyncClient, calls: list[Call], monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the Instance calls ``client`` makes, in the order they are sent (its Node and
    Event calls are not recorded)."""

    def kind_of(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        target = args[0] if args else None
        if method == "create":
            return "create" if isinstance(target, InstanceResource) else None
        if target is InstanceResource.Status:
            return "status"
        if target is not InstanceResource:
            return None
        if method == "patch":
            return str(getattr(kwargs.get("patch_type"), "name", "patch")).lower()
        return method

    def wrap(method: str) -> None:
        original = getattr(client, method)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            kind = kind_of(method, args, kwargs)
            if kind is not None:
                calls.append((kind, _name(args)))
            return original(*args, **kwargs)

        monkeypatch.setattr(client, method, recorded)

    for method in ("get", "create", "patch", "list", "delete"):
        wrap(method)


def _name(args: tuple[Any, ...]) -> str:
    if len(args) > 1 and isinstance(args[1], str):
        return args[1]
    if args and isinstance(args[0], InstanceResource):
        return str((as_dict(args[0]).get("metadata") or {}).get("name") or "")
    return ""


class _OrderedTable(NodeDeviceTable):
    """A table that notes, at each put, whether the device's verdict was sent before."""

    def __init__(self, calls: list[Call]) -> None:
        super().__init__()
        self._calls = calls
        self.unreported: list[str] = []

    async def put(self, device: NodeDevice) -> None:
        if ("status", device.instance) not in self._calls:
            self.unreported.append(device.instance)
        await super().put(device)


async def _publisher(client: AsyncClient, namespace: str, node: str,
                     table: NodeDeviceTable) -> InstancePublisher:
    cfg = Configuration.from_object(as_dict(
        await client.get(ConfigurationResource, CFG, namespace=namespace)))
    return InstancePublisher(client=client, node_name=node, configuration=cfg, devices=table,
                             labels=NodeLabels(client=client, node_name=node),
                             metrics=AgentMetrics())


async def _other_node_holds(client: AsyncClient, namespace: str, device: str,
                            other: str) -> str:
    """Another node's Instance of shared ``device`` under its collision name; the name."""
    cfg = Configuration.from_object(as_dict(
        await client.get(ConfigurationResource, CFG, namespace=namespace)))
    digest = device_digest(device, shared=True, node="")
    name = collision_instance_name(CFG, digest)
    await client.create(InstanceResource.from_dict({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "namespace": namespace,
                     "ownerReferences": [cfg.owner_reference()]},
        "spec": {"configurationName": CFG, "capacity": CAPACITY, "shared": True,
                 "nodes": [other], "deviceDigest": digest,
                 "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": device},
                 "deviceUsage": {slot_id(name, i): "" for i in range(CAPACITY)}}}))
    return name


#: Who allocates the Configuration's devices: the table's allocator, and whether a controller of
#: the previous release chose it.
ALLOCATORS = {"dra": (Allocator.DRA, False), "devicePlugin": (Allocator.DEVICE_PLUGIN, False),
              "previous-controller": (Allocator.DRA, True)}


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
@pytest.mark.parametrize("size", [3, MANY], ids=["few", "many"])
async def test_new_shared_devices_cost_the_writes_their_allocator_needs(
        control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch,
        size: int, allocator: str) -> None:
    node = harness.new_node(control_plane)
    devices = [f"p{i}" for i in range(size)]
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        CFG, descriptions=devices, capacity=CAPACITY))
    client, observer = harness.api_client(control_plane), harness.api_client(control_plane)
    try:
        joined = await _other_node_holds(client, namespace, devices[0], "elsewhere")
        calls: list[Call] = []
        table = _OrderedTable(calls)
        chosen, previous = ALLOCATORS[allocator]
        await table.set_allocator(namespace, CFG, chosen, shared_only=previous)
        scheduler, marks = chosen == Allocator.DRA and not previous, previous
        publisher = await _publisher(client, namespace, node, table)
        _record(client, calls, monkeypatch)
        await publisher.publish(
            load_handler("debugEcho"), None,
            [Device(id=d, properties={"DEBUG_ECHO_DESCRIPTION": d}) for d in devices],
            shared=True)
        monkeypatch.undo()

        names = {d: instance_name(CFG, d, shared=True, node=node) for d in devices[1:]}
        names[devices[0]] = joined
        found = await harness.instances(observer, namespace)
        assert set(found) == set(names.values()), "one Instance per device, the first joined"
        for name in names.values():
            spec, status = found[name]["spec"], found[name].get("status") or {}
            assert node in spec["nodes"], name
            assert (status.get(STATUS_REPORTED) or {}).get(node) is (True if marks else None), \
                name
            if scheduler and name != joined:
                assert "deviceUsage" not in spec, f"{name}: no slot map where no plugin serves"
        assert sorted(found[joined]["spec"]["nodes"]) == sorted(["elsewhere", node])
        assert instance_name(CFG, devices[0], shared=True, node=node) not in found

        def count(what: str, name: str | None = None) -> int:
            return sum(1 for w, n in calls if w == what and (name is None or n == name))

        lists = count("list")
        gets = [n for w, n in calls if w == "get"]
        # Where device plugins serve it, the joined name's create answered 409 and a read.
        joined_read = [] if scheduler else [joined]
        if size >= LIST_FROM:
            assert lists == 1, calls  # the collision names, all at once
            assert gets == joined_read, gets
        else:
            assert lists == 0, calls
            assert len(gets) == size + len(joined_read), gets  # each collision name
        for name in names.values():
            assert count("apply", name) == 1, name
            assert count("status", name) == (1 if marks else 0), name
            assert count("merge", name) == 0, f"{name}: slots were created with it"
            if not previous:  # there, the scheduler allocates once the table has shared ones
                assert count("create", name) == (0 if scheduler else 1), name
        if marks:
            assert table.unreported == [], "each device reaches the table after its verdict"
        assert set(table.snapshot()) == {(namespace, n) for n in names.values()}
        if size >= LIST_FROM and marks:
            writes = [w for w, _n in calls if w in ("create", "status")]
            last_create = len(writes) - 1 - writes[::-1].index("create")
            assert writes.index("status") < last_create, "verdicts wait for no other Instance"

        # Withdrawn: an Instance this node alone is listed on is read and deleted (no mark
        # taken back, no leave first); the one shared with another node is left (its mark
        # taken back where the previous controller reads it).
        calls.clear()
        _record(client, calls, monkeypatch)
        await publisher.withdraw()
        monkeypatch.undo()
        left = await harness.instances(observer, namespace)
        assert set(left) == {joined}
        assert left[joined]["spec"]["nodes"] == ["elsewhere"]
        assert node not in ((left[joined].get("status") or {}).get(STATUS_REPORTED) or {})
        for name in names.values():
            if name != joined:
                assert [w for w, n in calls if n == name] == ["get", "delete"], name
                # This process's watches take its DELETED for a deletion, unread.
                assert found[name]["metadata"]["uid"] in node_instances._deleted, name
    finally:
        await client.close()
        await observer.close()


async def test_an_unhealthy_shared_device_is_marked_before_its_node_is_listed(
        control_plane: ControlPlane, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller offers a shared device on every listed node not marked unhealthy: a
    device found unhealthy is applied without this node, marked, then listed."""
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        CFG, descriptions=["sick"], capacity=CAPACITY))
    client, observer = harness.api_client(control_plane), harness.api_client(control_plane)
    try:
        calls: list[Call] = []
        table = _OrderedTable(calls)
        await table.set_allocator(namespace, CFG, Allocator.DRA)
        publisher = await _publisher(client, namespace, node, table)
        _record(client, calls, monkeypatch)
        await publisher.publish(
            load_handler("debugEcho"), None,
            [Device(id="sick", properties={"DEBUG_ECHO_DESCRIPTION": "sick"},
                    health=Health.unhealthy("lens cap on"))], shared=True)
        monkeypatch.undo()
        name = instance_name(CFG, "sick", shared=True, node=node)
        assert [w for w, n in calls if n == name] == ["apply", "status", "apply"]
        found = (await harness.instances(observer, namespace))[name]
        assert found["spec"]["nodes"] == [node]
        assert found["status"]["unhealthy"] == {node: "lens cap on"}
    finally:
        await client.close()
        await observer.close()
