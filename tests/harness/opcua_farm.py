"""A farm of OPC-UA servers in its own process, for the opcua benchmark.

The benchmark measures the handler (or the agent) in one process against many
servers in another, so neither steals the other's event loop. The farm runs, on loopback:

- ``lds``: a real asyncua discovery server holding ``--servers`` registrations: the ``--real``
  real servers themselves, and lightweight descriptions (RegisterServer) whose URLs are further
  paths on those real servers, so that checking each is the full path (connect, session, read
  ``ServerStatus.State``) against a real server while the farm stays affordable (a real asyncua
  server costs ~50 MB and ~1-2 s to start);
- ``hung_lds``: the same registrations plus one server that accepts and never answers;
- ``small_lds``: only ``mover``, a real server the parent starts and stops by writing ``start``
  or ``stop`` on stdin (answered by a JSON line with ``time.monotonic()`` of the moment the
  server listens, comparable across processes on Linux).

The first stdout line is JSON with every URL; then one JSON line per command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from tests.harness.opcua_hostile import HostilePeer
from tests.harness.opcua_servers import TestServer, description, register


async def _farm(servers: int, real: int) -> None:
    lds = await TestServer("lds", discovery=True).start()
    hung_lds = await TestServer("hung-lds", discovery=True).start()
    small_lds = await TestServer("small-lds", discovery=True).start()
    reals = [await TestServer(f"real-{k}").start() for k in range(real)]
    hung = await HostilePeer("silent").start()
    urls = [r.url for r in reals] + [
        f"{reals[i % real].url}s{i}" for i in range(servers - real)]
    registrations = [description(i, url=url) for i, url in enumerate(urls)]
    await register(lds.url, registrations)
    await register(hung_lds.url, [*registrations, description(servers, url=hung.url)])
    mover = TestServer("mover", register_to=small_lds.url)
    print(json.dumps({"lds": lds.url, "hung_lds": hung_lds.url, "small_lds": small_lds.url,
                      "hung": hung.url, "mover": mover.url, "servers": urls}), flush=True)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line == "start":
            await mover.start()
            print(json.dumps({"started": mover.url, "at": time.monotonic()}), flush=True)
        elif line == "stop":
            await mover.stop()
            print(json.dumps({"stopped": mover.url, "at": time.monotonic()}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {line!r}"}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--real", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(_farm(args.servers, args.real))


if __name__ == "__main__":
    main()
