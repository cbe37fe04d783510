"""opcua against hostile peers (real TCP servers that never answer, stream garbage, close
mid-message) and a real discovery server answering FindServers with 10,000 entries: each costs
a bounded time and memory, nothing crashes, and the real server beside them is still found."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from asyncua import ua

from discovery_handlers.opcua import client, handler
from discovery_handlers.opcua.client import MAX_CONNECTION_BYTES, MAX_SERVERS_PER_ANSWER
from tests.harness.opcua_hostile import GARBAGE_LIMIT_BYTES, HostilePeer
from tests.harness.opcua_servers import TestServer, description, free_port
from tests.harness.opcua_watch import DeviceWatch

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 1.5
#: How long a round with hostile peers may take: each costs at most TIMEOUT_S, in parallel; the
#: rest is slack for a loaded 2-core machine (a deadline, not a timing being measured).
BOUND_S = 3 * TIMEOUT_S + 10
ENTRIES = 10_000


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def real() -> AsyncIterator[TestServer]:
    async with TestServer("real") as server:
        yield server


@pytest.mark.parametrize("behaviour", ["silent", "garbage", "closer"])
async def test_each_hostile_peer_is_unreachable_within_the_timeout(behaviour: str) -> None:
    peer = await HostilePeer(behaviour).start()  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    try:
        for call in (lambda: client.find_servers(peer.url, limit_s=TIMEOUT_S),
                     lambda: client.check(peer.url, limit_s=TIMEOUT_S, security=None)):
            started = loop.time()
            with pytest.raises(client.Unreachable):
                await asyncio.wait_for(call(), BOUND_S)  # the bound is the handler's own
            assert loop.time() - started < BOUND_S
    finally:
        await peer.stop()


async def test_garbage_stream_is_cut_at_the_connection_bound() -> None:
    peer = await HostilePeer("garbage").start()
    tracemalloc.start()
    try:
        with pytest.raises(client.Unreachable):
            await client.find_servers(peer.url, limit_s=30.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await peer.stop()
    assert peer.bytes_sent < GARBAGE_LIMIT_BYTES, "the handler hung up before the peer was done"
    assert peak < 4 * MAX_CONNECTION_BYTES, f"peak {peak / 2**20:.0f} MiB while receiving garbage"


async def test_hostile_peers_beside_a_real_server(real: TestServer) -> None:
    peers = [await HostilePeer(b).start() for b in ("silent", "garbage", "closer")]
    urls = "".join(f"\n      - {u}" for u in [*(p.url for p in peers), real.url])
    details = handler.parse_details(
        f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls:{urls}\n"
        f"discoveryIntervalSeconds: 0.2\ntimeoutSeconds: {TIMEOUT_S}\n", {})
    try:
        async with DeviceWatch(details) as watch:
            devices = await watch.until(bool, what="the first list", within=BOUND_S)
            assert list(devices) == [real.url]
            assert devices[real.url].health.healthy
            rounds = [p.connections for p in peers]
            await watch.until(lambda _: all(p.connections >= n + 2 for p, n in zip(
                peers, rounds, strict=True)), what="two more rounds with every hostile peer")
            assert list(watch.latest) == [real.url], "the real server stays listed throughout"
    finally:
        for peer in peers:
            await peer.stop()


async def test_find_servers_answer_with_10000_entries(
    real: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery_handlers.opcua")
    lds = await TestServer("big-lds", discovery=True).start()
    closed = free_port()  # nothing listens there: every listed server refuses
    try:
        lds.register_locally([description(0, url=real.url, name="real")])
        lds.register_locally([description(i, url=f"opc.tcp://127.0.0.1:{closed}/s{i}")
                              for i in range(1, ENTRIES)])
        found = await client.find_servers(lds.url, limit_s=10.0)
        assert found.total == ENTRIES + 1  # the discovery server lists itself too
        assert len(found.records) == MAX_SERVERS_PER_ANSWER
        details = handler.parse_details(
            f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{lds.url}]\n"
            f"timeoutSeconds: {TIMEOUT_S}\n", {})
        async with DeviceWatch(details) as watch:
            devices = await watch.until(bool, what="the first list", within=BOUND_S + 20)
        assert list(devices) == [real.url]
        assert f"FindServers answered {ENTRIES + 1} servers; kept the first" in caplog.text
    finally:
        await lds.stop()


async def test_a_hung_server_delays_no_other(real: TestServer) -> None:
    hung_timeout_s = 60.0  # far longer than any deadline below: a delay would show
    lds = await TestServer("hung-lds", discovery=True).start()
    peer = await HostilePeer("silent").start()
    try:
        lds.register_locally([description(0, url=real.url, name="real")])
        details = handler.parse_details(
            f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{lds.url}]\n"
            f"discoveryIntervalSeconds: 0.2\ntimeoutSeconds: {hung_timeout_s}\n", {})
        async with DeviceWatch(details) as watch:
            await watch.until(lambda d: list(d) == [real.url], what="the real server")
            lds.register_locally([description(1, url=peer.url, name="hung")])
            await watch.until(lambda _: peer.connections > 0, what="the hung server's check")
            # while that check hangs: a new server appears, and a known one changes health
            second = f"{real.url}second"
            lds.register_locally([description(2, url=second, name="second")])
            await watch.until(lambda d: second in d, what="the new server", within=20)
            await real.set_state(ua.ServerState.Suspended)
            try:
                await watch.until(lambda d: not d[real.url].health.healthy,
                                  what="the real server unhealthy", within=20)
            finally:
                await real.set_state(ua.ServerState.Running)
            assert peer.url not in watch.latest, "the hung server is not listed while it hangs"
    finally:
        await peer.stop()
        await lds.stop()
