"""Slot claims race against the real API server: one slot, two nodes, exactly one winner.

The ledgers write conditioned JSON merge patches (``metadata.resourceVersion``); these tests
show the API server really serialises them, so concurrent claims never both succeed.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from lightkube import AsyncClient

from agent.deviceplugins.slots.ledger import SlotLedger, SlotUnavailable
from agent.deviceplugins.slots.rules import Verdict
from crds.instance import Instance, SlotUsage
from tests.harness.agent_nodes import create_instance, read_instance

pytestmark = pytest.mark.timeout(120)

ROUNDS = 10


async def _instance(kube: AsyncClient, namespace: str, nodes: list[str], capacity: int) -> str:
    return await create_instance(
        kube,
        namespace,
        configuration=f"race{uuid.uuid4().hex[:6]}",
        digest="abcdef",
        nodes=nodes,
        capacity=capacity,
        shared=True,
    )


async def _claim(ledger: SlotLedger, slot: str) -> Instance:
    async with ledger.lock:
        return await ledger.claim({slot: SlotUsage.by_node(ledger.node)})


async def test_concurrent_claims_of_one_free_slot_have_exactly_one_winner(
    kube: AsyncClient, namespace: str
) -> None:
    name = await _instance(kube, namespace, ["node-a", "node-b"], capacity=1)
    slot = f"{name}-0"
    ledgers = [
        SlotLedger(client=kube, node=node, namespace=namespace, name=name)
        for node in ("node-a", "node-b")
    ]
    for round_ in range(ROUNDS):
        results = await asyncio.gather(*(_claim(x, slot) for x in ledgers), return_exceptions=True)
        winners = [x for x, r in zip(ledgers, results, strict=True) if isinstance(r, Instance)]
        losers = [r for r in results if isinstance(r, SlotUnavailable)]
        assert len(winners) == 1, f"round {round_}: {results}"
        assert len(losers) == 1, f"round {round_}: {results}"
        assert losers[0].verdict in (Verdict.HELD_ELSEWHERE, Verdict.RESERVED_ELSEWHERE)
        instance = await read_instance(kube, namespace, name)
        assert instance.spec.device_usage[slot] == winners[0].node
        # One conditioned write claims an unreserved slot; no reservation comes with it (the
        # winner's reconcile reserves what it holds later), and none for the loser.
        assert instance.reservations.get(slot) is None
        # The winner frees the slot and gives back its reservation for the next round.
        async with winners[0].lock:
            await winners[0].free({slot: SlotUsage.by_node(winners[0].node)})
            await winners[0].release([slot])
        assert (await read_instance(kube, namespace, name)).spec.device_usage[slot] == ""


async def test_a_slot_reserved_for_another_node_is_refused_and_left_alone(
    kube: AsyncClient, namespace: str
) -> None:
    name = await _instance(kube, namespace, ["node-a", "node-b"], capacity=2)
    a = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    b = SlotLedger(client=kube, node="node-b", namespace=namespace, name=name)
    async with b.lock:
        await b.reserve([f"{name}-1"])
    before = await read_instance(kube, namespace, name)
    with pytest.raises(SlotUnavailable) as refused:
        await _claim(a, f"{name}-1")
    assert refused.value.verdict is Verdict.RESERVED_ELSEWHERE
    assert f"{name}-1" in str(refused.value)
    after = await read_instance(kube, namespace, name)
    assert after.resource_version == before.resource_version, "a refused claim wrote nothing"
    # node-a may still claim the free, unreserved slot 0, in one conditioned write.
    claimed = await _claim(a, f"{name}-0")
    assert claimed.spec.device_usage[f"{name}-0"] == "node-a"
    current = await read_instance(kube, namespace, name)
    assert current.resource_version == claimed.resource_version, "one write, no other"


async def test_claim_on_a_stale_copy_never_takes_a_slot_claimed_since(
    kube: AsyncClient, namespace: str
) -> None:
    """Allocate judges on the watch's copy to save a read; a stale copy must cost only a retry."""
    name = await _instance(kube, namespace, ["node-a", "node-b"], capacity=1)
    slot = f"{name}-0"
    stale = await read_instance(kube, namespace, name)  # the slot is free and unreserved here
    winner = SlotLedger(client=kube, node="node-b", namespace=namespace, name=name)
    await _claim(winner, slot)

    late = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    with pytest.raises(SlotUnavailable) as refused:
        async with late.lock:
            await late.claim({slot: SlotUsage.by_node("node-a")}, known=stale)
    assert refused.value.verdict in (Verdict.HELD_ELSEWHERE, Verdict.RESERVED_ELSEWHERE)
    assert (await read_instance(kube, namespace, name)).spec.device_usage[slot] == "node-b"


async def test_claim_on_a_current_copy_succeeds(
    kube: AsyncClient, namespace: str
) -> None:
    name = await _instance(kube, namespace, ["node-a"], capacity=2)
    current = await read_instance(kube, namespace, name)
    ledger = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    async with ledger.lock:
        claimed = await ledger.claim({f"{name}-1": SlotUsage.by_node("node-a")}, known=current)
    assert claimed.spec.device_usage[f"{name}-1"] == "node-a"
    assert (await read_instance(kube, namespace, name)).spec.device_usage[f"{name}-1"] == "node-a"


async def test_a_promised_slot_is_neither_given_to_a_configuration_claim_nor_released(
    kube: AsyncClient, namespace: str
) -> None:
    """A slot the Allocate fast path handed to a pod, not yet recorded: the API shows it free
    and reserved for this node, and it must stay this node's until it is recorded."""
    name = await _instance(kube, namespace, ["node-a", "node-b"], capacity=1)
    slot = f"{name}-0"
    ledger = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    async with ledger.lock:
        await ledger.reserve([slot])
    ledger.promised[slot] = SlotUsage.by_node("node-a")
    with pytest.raises(SlotUnavailable) as refused:
        async with ledger.lock:
            await ledger.claim({slot: SlotUsage.by_configuration("cfg-v0", "node-a")})
    assert refused.value.verdict is Verdict.HELD_ELSEWHERE
    async with ledger.lock:
        await ledger.release([slot])
    after = await read_instance(kube, namespace, name)
    assert after.reservations.get(slot) == "node-a", "a promised slot keeps its reservation"
    assert after.spec.device_usage.get(slot, "") == ""
    # Recording it (what the fast path does right after answering) is one write.
    async with ledger.lock:
        recorded = await ledger.claim({slot: SlotUsage.by_node("node-a")}, known=after)
    assert recorded.spec.device_usage[slot] == "node-a"
    assert ledger.current(after) == recorded, "the ledger knows its write before the watch"


async def test_a_reservation_refused_as_stale_retries_on_the_watched_copy_and_takes_nothing_held(
    kube: AsyncClient, namespace: str
) -> None:
    """A reservation move on a stale copy is refused (409) and retried on the newest copy the
    watch delivered, without a read; that copy can itself be stale, and the write stays
    conditioned, so a slot another node reserved since is never taken."""
    name = await _instance(kube, namespace, ["node-a", "node-b"], capacity=2)
    first, second = f"{name}-0", f"{name}-1"
    stale = await read_instance(kube, namespace, name)  # both slots free and unreserved
    other = SlotLedger(client=kube, node="node-b", namespace=namespace, name=name)
    async with other.lock:
        await other.reserve([first])
    watched = await read_instance(kube, namespace, name)  # what the watch then delivers

    mine = SlotLedger(client=kube, node="node-a", namespace=namespace, name=name)
    mine.seen(watched)
    async with mine.lock:
        await mine.reserve([first, second], known=stale)
    after = await read_instance(kube, namespace, name)
    assert after.reservations == {first: "node-b", second: "node-a"}

    # The watched copy lags too (node-b reserved the second slot after it): refused again,
    # then read, and nothing of node-b's taken.
    async with other.lock:
        await other.release([first])
    lagging = await read_instance(kube, namespace, name)
    async with mine.lock:
        await mine.release([second])
    mine.seen(lagging)
    async with other.lock:
        await other.reserve([second])
    async with mine.lock:
        await mine.reserve([first, second], known=stale)
    final = await read_instance(kube, namespace, name)
    assert final.reservations == {first: "node-a", second: "node-b"}
