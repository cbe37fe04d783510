"""A ``grpc.aio`` server on a Unix socket, started and stopped as the kubelet's servers are.

The kubelet stand-ins (device-manager registration, pod-resources, the
lifecycle tests' registrar) and the test device plugin each serve gRPC on a socket file; the
steps to bring one up (make the directory, clear a stale socket, bind, start) and to stop it
live here once.
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


class SocketServer:
    """One gRPC server on ``socket_path``; ``start`` after ``stop`` serves a fresh one."""

    def __init__(
        self,
        socket_path: Path,
        *,
        add_services: Callable[[grpc.aio.Server], None],
        stop_grace_s: float | None,
    ) -> None:
        self.socket_path = socket_path
        self._add_services = add_services
        self._stop_grace_s = stop_grace_s
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = await serve_on_socket(self.socket_path, add_services=self._add_services)

    async def stop(self) -> None:
        """Stop serving (letting in-flight calls finish for the grace); no-op when stopped."""
        if self._server is not None:
            await self._server.stop(self._stop_grace_s)
            self._server = None
