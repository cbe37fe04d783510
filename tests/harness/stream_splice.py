"""Join two byte streams both ways: the relays the harness runs between network namespaces.

The ONVIF agent's API relay (``onvif_agent_netns``) and the real node's API
forwarder (``realnode_forward``) both copy bytes between a client connection and the one they
open for it, each direction until its end; one copy of that loop serves both.
"""

from __future__ import annotations

import asyncio

CHUNK_BYTES = 64 * 1024


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` into ``writer`` until the end (or a broken connection), then close it."""
    try:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    other: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Both directions between one connection and ``other``, until both have ended."""
    await asyncio.gather(pipe(reader, other[1]), pipe(other[0], writer))
