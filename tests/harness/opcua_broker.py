"""A test broker: what an OPC-UA broker container does with the environment Allocate gave it.

The node emulator stands in for the kubelet and runs no containers, so the
end-to-end test runs this as a process with the environment the emulator recorded from the
agent's Allocate. Like Akri's OPC-UA monitoring broker it connects to ``OPCUA_DISCOVERY_URL``
and reads the node ``ns=<NAMESPACE_INDEX>;s=<IDENTIFIER>`` (both from the Configuration's
``brokerProperties``), then prints the value on one line and exits 0; any failure exits 1 and
says why on stderr.
"""

from __future__ import annotations

import asyncio
import os
import sys

from asyncua.client.client import Client

READ_TIMEOUT_S = 10.0


async def read_value() -> object:
    url = os.environ["OPCUA_DISCOVERY_URL"]
    node_id = f"ns={int(os.environ['NAMESPACE_INDEX'])};s={os.environ['IDENTIFIER']}"
    client = Client(url, timeout=READ_TIMEOUT_S)
    async with asyncio.timeout(READ_TIMEOUT_S):
        await client.connect()
        try:
            return await client.get_node(node_id).read_value()
        finally:
            await client.disconnect()


def main() -> int:
    try:
        value = asyncio.run(read_value())
    except Exception as exc:
        print(f"opcua broker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(value, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
