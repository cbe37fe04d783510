"""Forward a TCP port from the real node's network namespace to the host's loopback.

The harness API server listens on the host's 127.0.0.1 only, and the real
node's pods, host-network ones included, live in the node's own network namespace
(tests/harness/realnode.py). A pod that talks to the API server (the agent as the DaemonSet
from deploy/) reaches it through this forwarder: a process that opens its listening socket
inside the node's namespace (``setns``, for that socket only) and connects out in the host's,
the way a node's kube-proxy would make the ``kubernetes`` service reachable. Run as
``python -m tests.harness.realnode_forward <netns file> <port>``; it prints ``ready`` once it
listens on 127.0.0.1:<port> in the namespace, and serves until killed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys

from tests.harness.stream_splice import splice

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")


def listen_in(netns: str, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:port inside ``netns``; this thread comes back after."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)
    listener.setblocking(False)
    return listener


async def serve(listener: socket.socket, port: int) -> None:
    async def forward(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_w.close()
            return
        await splice(client_r, client_w, (server_r, server_w))

    server = await asyncio.start_server(forward, sock=listener)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    netns, port = argv[0], int(argv[1])
    asyncio.run(serve(listen_in(netns, port), port))


if __name__ == "__main__":
    main(sys.argv[1:])
