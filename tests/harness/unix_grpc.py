"""Start a ``grpc.aio`` server on a Unix socket, as the emulated kubelet's servers all do.

Why this exists: the kubelet stand-ins (device-manager registration, pod-resources, the
lifecycle tests' registrar) each serve one gRPC service on a socket file; the steps to bring
one up (make the directory, clear a stale socket, bind, start) live here once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc.aio


def _clear_socket(socket_path: Path) -> None:
    """Make the socket's directory and remove a stale socket file left there."""
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)


async def serve_on_socket(
    socket_path: Path, *, add_services: Callable[[grpc.aio.Server], None]
) -> grpc.aio.Server:
    """A started server on ``socket_path`` with the services ``add_services`` registers."""
    _clear_socket(socket_path)
    server = grpc.aio.server()
    add_services(server)
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    return server
