"""WS-Discovery over asyncio UDP sockets (standard library only): probes out, messages in.

``WsdTransport`` sends Probes (multicast on every interface that is up, and unicast) and hands
every datagram heard to the scanner. Why our own and how multicast is set up:
docs/handlers/onvif.md, "How it works, and why".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from discovery_handlers.onvif.details import WS_DISCOVERY_PORT, UnicastTarget

log = logging.getLogger(__name__)

GROUP_V4 = "239.255.255.250"
GROUP_V6 = "ff02::c"
MULTICAST_TTL = 1  # link-local: probes never cross a router
#: Receive buffer for every socket; a burst of ProbeMatches from 200 cameras fits.
RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024

#: Linux's SO_RCVBUFFORCE (not in Python's socket module).
SO_RCVBUFFORCE = 33

Receiver = Callable[[bytes, str], None]


@dataclass(frozen=True)
class Interface:
    index: int
    name: str


def multicast_interfaces() -> list[Interface]:
    """Every interface but loopback; ones that cannot multicast are skipped when used."""
    return [Interface(index, name) for index, name in socket.if_nameindex() if name != "lo"]


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, receive: Receiver) -> None:
        self._receive = receive

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        host = str(addr[0]).partition("%")[0]
        try:
            self._receive(data, host)
        except Exception:  # a bug in handling one datagram must not close the socket
            log.exception("handling a WS-Discovery datagram from %s failed", host)

    def error_received(self, exc: Exception) -> None:
        log.debug("WS-Discovery socket error: %s", exc)


class WsdTransport:
    """The sockets of one discovery run; ``close`` releases them all."""

    def __init__(self, *, receive: Receiver, multicast: bool, ipv6: bool) -> None:
        self._receive = receive
        self._multicast = multicast
        self._ipv6 = ipv6
        self._transports: list[asyncio.DatagramTransport] = []
        self._prober_v4: asyncio.DatagramTransport | None = None
        self._prober_v6: asyncio.DatagramTransport | None = None
        self._raw_v4: socket.socket | None = None
        self._interfaces: list[Interface] = []

    async def open(self) -> None:
        self._interfaces = multicast_interfaces() if self._multicast else []
        self._raw_v4 = self._socket(socket.AF_INET, 0)
        self._prober_v4 = await self._endpoint(self._raw_v4)
        if self._ipv6 and socket.has_ipv6:
            with contextlib.suppress(OSError):
                self._prober_v6 = await self._endpoint(self._socket(socket.AF_INET6, 0))
        if self._multicast:
            await self._open_listeners()

    async def _open_listeners(self) -> None:
        try:
            listener = self._socket(socket.AF_INET, WS_DISCOVERY_PORT)
            for interface in self._interfaces:
                request = struct.pack(
                    "4s4si", socket.inet_aton(GROUP_V4), b"\0" * 4, interface.index
                )
                with contextlib.suppress(OSError):
                    listener.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, request)
            await self._endpoint(listener)
        except OSError as exc:
            log.warning("cannot listen for WS-Discovery Hello/Bye on IPv4: %s", exc)
        if self._prober_v6 is None:
            return
        try:
            listener = self._socket(socket.AF_INET6, WS_DISCOVERY_PORT)
            for interface in self._interfaces:
                request = struct.pack("16sI", socket.inet_pton(socket.AF_INET6, GROUP_V6),
                                      interface.index)
                with contextlib.suppress(OSError):
                    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, request)
            await self._endpoint(listener)
        except OSError as exc:
            log.warning("cannot listen for WS-Discovery Hello/Bye on IPv6: %s", exc)

    def _socket(self, family: socket.AddressFamily, port: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:  # past net.core.rmem_max where we may (CAP_NET_ADMIN), else as far as it allows
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
            except OSError:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, MULTICAST_TTL)
                sock.bind(("::", port))
            else:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, MULTICAST_TTL)
                sock.bind(("0.0.0.0", port))
        except OSError:
            sock.close()
            raise
        return sock

    async def _endpoint(self, sock: socket.socket) -> asyncio.DatagramTransport:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Protocol(self._receive), sock=sock
        )
        self._transports.append(transport)
        return transport

    def send_probe(self, message: bytes, targets: Sequence[UnicastTarget]) -> None:
        """Send ``message`` to both multicast groups (when enabled) and to every target."""
        if self._multicast:
            self._multicast_v4(message)
            self._multicast_v6(message)
        for target in targets:
            self._unicast(message, target)

    def _multicast_v4(self, message: bytes) -> None:
        sock = self._raw_v4
        if sock is None:
            return
        for interface in self._interfaces:
            choice = struct.pack("4s4si", b"\0" * 4, b"\0" * 4, interface.index)
            try:
                # the option applies to the next send, so send synchronously, not buffered
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, choice)
                sock.sendto(message, (GROUP_V4, WS_DISCOVERY_PORT))
            except OSError as exc:  # an interface without IPv4 or not up
                log.debug("no IPv4 probe on %s: %s", interface.name, exc)

    def _multicast_v6(self, message: bytes) -> None:
        if self._prober_v6 is None:
            return
        transport = self._prober_v6
        for interface in self._interfaces:
            try:
                transport.sendto(message, (GROUP_V6, WS_DISCOVERY_PORT, 0, interface.index))
            except OSError as exc:
                log.debug("no IPv6 probe on %s: %s", interface.name, exc)

    def _unicast(self, message: bytes, target: UnicastTarget) -> None:
        transport = self._prober_v6 if ":" in target.host else self._prober_v4
        if transport is None:
            return
        try:
            transport.sendto(message, (target.host, target.port))
        except OSError as exc:  # unreachable, or a name that does not resolve
            log.debug("no unicast probe to %s:%d: %s", target.host, target.port, exc)

    def close(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports.clear()
