"""The idle benchmarks' CPU floor: a bare Python process serving one idle gRPC server.

An agent that serves even one kubelet device plugin runs grpcio, whose core keeps threads of its
own (a global timer, the event engine's pool and its lifeguard) that wake on their own timers
whether or not a call comes. Their CPU alone is in the range of the agent's idle target. An idle
figure means something only beside what grpcio costs on the same machine at the same moment:
this process, started beside the agent and read over the same window, is that floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator

#: The floor process: one grpc.aio server on a Unix socket, then nothing until killed.
FLOOR_PROGRAM = """
import asyncio, sys
import grpc

async def main() -> None:
    server = grpc.aio.server()
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    print("serving", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
#: How long the floor process may take to import grpcio and start serving.
START_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def idle_grpc_server() -> AsyncIterator[int]:
    """Run the floor process for the block; yields its pid once it serves."""
    with tempfile.TemporaryDirectory(prefix="epb-grpc-floor-") as directory:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FLOOR_PROGRAM, f"{directory}/floor.sock",
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
            if line.strip() != b"serving":
                raise RuntimeError(f"the idle gRPC floor process did not start ({line!r})")
            yield process.pid
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
