"""The OPC-UA benchmark's floor: what the server farm takes to answer a bare asyncua client.

The handler's time to its first complete, checked list of 500 servers means
little on a shared machine without the time the servers themselves need to answer. In a fresh
process (asyncua imported before the clock starts, as in ``opcua_runner``) this asks the
discovery server ``FindServers`` once, then every server it names (discovery servers left out,
as the handler leaves them) ``GetEndpoints`` (a secure
channel of security None and one request; no session), as many at once as the handler checks,
and prints one JSON line: ``seconds``, ``servers`` (named by the discovery server) and
``answered``. Usage: ``python -m tests.harness.opcua_floor URL``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from asyncua import ua
from asyncua.client.client import Client

from tests.harness.opcua_runner import MAX_CONCURRENT_CHECKS

LIMIT_S = 30.0


async def endpoints(url: str, gate: asyncio.Semaphore) -> bool:
    async with gate:
        client = Client(url, timeout=LIMIT_S)
        try:
            return bool(await client.connect_and_get_server_endpoints())
        finally:
            client.disconnect_socket()


async def floor(url: str) -> dict[str, float | int]:
    started = time.perf_counter()
    lds = Client(url, timeout=LIMIT_S)
    try:
        described = await lds.connect_and_find_servers()
    finally:
        lds.disconnect_socket()
    urls = [item.DiscoveryUrls[0] for item in described  # servers, as the handler keeps them
            if item.DiscoveryUrls and item.ApplicationType != ua.ApplicationType.DiscoveryServer]
    gate = asyncio.Semaphore(MAX_CONCURRENT_CHECKS)
    answered = await asyncio.gather(*(endpoints(u, gate) for u in urls))
    return {"seconds": time.perf_counter() - started, "servers": len(urls),
            "answered": sum(answered)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(floor(sys.argv[1]))), flush=True)
