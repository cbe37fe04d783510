"""The agent's change paths do no API work in a row that they can do at once.

Each finding of a profile of those paths, against the real API server: a withdrawal stopped serving
its Instances one API round trip apart each (a deleted Configuration's plugins went one by one);
a publish wrote its Instances one at a time; a reservation move read the Instance before every
conditioned write although the pass had just decided from a copy of it. The client's calls are
observed as they pass through to the API server (nothing answers in its place).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from lightkube import AsyncClient

from agent.deviceplugins.slots.ledger import SlotLedger
from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.node_devices import NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.kube.client import ConfigurationResource, as_dict
from agent.metrics import AgentMetrics
from crds.configuration import Configuration
from discovery_handlers.contract import Device
from discovery_handlers.registry import load_handler
from tests.harness import agent_process as harness
from tests.harness.agent_nodes import create_instance, read_instance
from tests.harness.controlplane import ControlPlane

pytestmark = pytest.mark.timeout(120)

DEVICES = 4


def _observed(client: AsyncClient, method: str, before: Callable[[], None],
              after: Callable[[], None] | None = None) -> None:
    """Call ``before`` (and ``after``) around each of ``client.method``'s real calls."""
    real = getattr(client, method)

    async def observed(*args: Any, **kwargs: Any) -> Any:
        before()
        try:
            return await real(*args, **kwargs)
        finally:
            if after is not None:
                after()

    setattr(client, method, observed)


async def _publisher(control_plane: ControlPlane, namespace: str, client: AsyncClient,
                     name: str, table: NodeDeviceTable) -> InstancePublisher:
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        name, descriptions=[f"d{i}" for i in range(DEVICES)]))
    cfg = Configuration.from_object(as_dict(
        await client.get(ConfigurationResource, name, namespace=namespace)))
    return InstancePublisher(client=client, node_name=node, configuration=cfg, devices=table,
                             labels=NodeLabels(client=client, node_name=node),
                             metrics=AgentMetrics())


def _devices() -> list[Device]:
    return [Device(id=f"d{i}", properties={"DEBUG_ECHO_DESCRIPTION": f"d{i}"})
            for i in range(DEVICES)]


async def test_a_withdrawal_stops_serving_every_instance_before_its_first_api_write(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = harness.api_client(control_plane)
    table = NodeDeviceTable()
    try:
        publisher = await _publisher(control_plane, namespace, client, "wd", table)
        await publisher.publish(load_handler("debugEcho"), None, _devices(), shared=True)
        assert len(table.snapshot()) == DEVICES
        served_at_calls: list[int] = []
        for method in ("get", "patch", "delete"):
            _observed(client, method, lambda: served_at_calls.append(len(table.snapshot())))
        await publisher.withdraw()
        assert served_at_calls, "the withdrawal wrote nothing"
        assert served_at_calls[0] == 0, (
            f"{served_at_calls[0]} of {DEVICES} devices still served at the withdrawal's first "
            "API call: their plugins wait on the other Instances' writes")
        assert not await harness.instances(client, namespace)
    finally:
        await client.close()


async def test_a_publish_has_several_instance_writes_in_flight(
    control_plane: ControlPlane, namespace: str
) -> None:
    client = harness.api_client(control_plane)
    try:
        publisher = await _publisher(control_plane, namespace, client, "pub",
                                     NodeDeviceTable())
        in_flight, most = 0, 0

        def began() -> None:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)

        def ended() -> None:
            nonlocal in_flight
            in_flight -= 1

        _observed(client, "create", began, ended)
        await publisher.publish(load_handler("debugEcho"), None, _devices(), shared=True)
        assert len(await harness.instances(client, namespace)) == DEVICES
        assert most > 1, "every Instance create waited for the one before"
    finally:
        await client.close()


async def test_a_reservation_move_from_a_current_copy_reads_nothing_and_a_stale_one_rereads(
    kube: AsyncClient, namespace: str
) -> None:
    name = await create_instance(kube, namespace, configuration="mv", digest="abcdef",
                                 nodes=["node-a"], capacity=2, shared=True)
    ledger = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    current = await read_instance(kube, namespace, name)
    reads: list[None] = []
    real_get = kube.get

    async def counted_get(*args: Any, **kwargs: Any) -> Any:
        reads.append(None)
        return await real_get(*args, **kwargs)

    kube.get = counted_get  # type: ignore[method-assign]
    try:
        async with ledger.lock:
            await ledger.reserve([f"{name}-0"], known=current)
        assert not reads, "the reservation move read the Instance the pass had just decided from"
        # The copy is stale now: the conditioned write is refused, the move re-reads and lands.
        async with ledger.lock:
            await ledger.reserve([f"{name}-1"], known=current)
        assert len(reads) == 1
    finally:
        kube.get = real_get  # type: ignore[method-assign]
    after = await read_instance(kube, namespace, name)
    assert after.reservations == {f"{name}-0": "node-a", f"{name}-1": "node-a"}
