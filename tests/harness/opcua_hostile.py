"""Hostile OPC-UA peers on loopback: the ways a network peer can misbehave toward the handler.

Every reply from the network is hostile until parsed, and one bad peer must
cost the handler a bounded time and memory and nothing else. These are real TCP servers doing
what broken or malicious OPC-UA endpoints do (no simulator of a real server is involved):

- ``silent``: accepts the connection, reads, never answers;
- ``garbage``: answers the Hello with a message header claiming a ~4 GiB body, then streams
  random bytes as fast as the socket takes them (up to ``GARBAGE_LIMIT_BYTES``);
- ``closer``: answers the Hello with half an Acknowledge, then closes.

Each counts the connections it took and the bytes it sent, so tests wait on what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from dataclasses import dataclass, field
from typing import Literal

Behaviour = Literal["silent", "garbage", "closer"]
GARBAGE_LIMIT_BYTES = 256 * 1024 * 1024  # what the garbage peer sends at most per connection
GARBAGE_BLOCK_BYTES = 1024 * 1024
_HUGE_BODY = 0xFFFFFFF0
_ACK_BODY = struct.pack("<IIIII", 0, 65535, 65535, 0, 0)  # version, buffers, limits


@dataclass
class HostilePeer:
    """A TCP server on ``127.0.0.1`` behaving as ``behaviour``; ``url`` is its opc.tcp URL."""

    behaviour: Behaviour
    connections: int = 0
    bytes_sent: int = 0
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"opc.tcp://127.0.0.1:{port}/"

    async def start(self) -> HostilePeer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            await reader.read(8192)  # the Hello
            if self.behaviour == "garbage":
                await self._garbage(writer)
            elif self.behaviour == "closer":
                whole = b"ACKF" + struct.pack("<I", 8 + len(_ACK_BODY)) + _ACK_BODY
                writer.write(whole[: len(whole) // 2])
                await writer.drain()
            else:
                while await reader.read(8192):
                    pass  # never answer
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            self._handlers.discard(task)

    async def _garbage(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"MSGF" + struct.pack("<I", _HUGE_BODY))
        block = os.urandom(GARBAGE_BLOCK_BYTES)
        sent = 0
        while sent < GARBAGE_LIMIT_BYTES and not writer.is_closing():
            writer.write(block)
            await writer.drain()
            sent += len(block)
            self.bytes_sent += len(block)
