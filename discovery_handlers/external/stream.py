"""One ``Discover`` call to a registered handler, as an async stream of checked device lists.

``discover`` dials the endpoint, sends the details and resolved properties (Secrets as their bytes,
as Akri's agent sends them) and yields each list through ``devices.convert``; it raises
``HandlerUnreachable`` or ``HandlerFailed``. Bounds: docs/handlers/akri.md, "The modules".
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Mapping

import grpc

from discovery_handlers.contract import Device, PropertyValue, Secret
from discovery_handlers.external.akriapi import discovery_pb2 as pb
from discovery_handlers.external.akriapi import discovery_pb2_grpc as pb_grpc
from discovery_handlers.external.devices import convert
from discovery_handlers.external.registrations import EndpointType, Registration

log = logging.getLogger(__name__)

#: Seconds the agent waits for a handler's endpoint to accept a connection.
CONNECT_TIMEOUT = 5.0
#: Keepalive pings on the stream (the least interval gRPC servers accept by default, 5 min):
#: a NETWORK handler whose pod vanished without closing its connection is noticed after it.
KEEPALIVE_TIME_MS = 300_000
KEEPALIVE_TIMEOUT_MS = 20_000
#: The largest DiscoverResponse accepted (a handler listing thousands of devices fits).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The HTTP/2 ``:authority`` sent to a handler on a Unix socket. gRPC would send the socket's
#: path, percent-encoded, which is no valid authority (RFC 9113, section 8.3.1): HTTP/2 stacks
#: that check it, as h2 under tonic (Akri's own handlers) does, refuse every call with
#: RST_STREAM. A NETWORK endpoint's host:port is an authority already.
UDS_AUTHORITY = "localhost"


class HandlerUnreachable(ConnectionError):
    """The handler's endpoint did not accept a connection, or its stream broke."""


class HandlerFailed(RuntimeError):
    """The handler answered ``Discover`` with an error (bad details, say): it is there."""


#: Status codes that mean the handler could not be reached, not that it answered.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                          grpc.StatusCode.CANCELLED})


def request(details: str, properties: Mapping[str, PropertyValue]) -> pb.DiscoverRequest:
    """Akri's ``DiscoverRequest``: the details as written, every property's value as bytes."""
    return pb.DiscoverRequest(
        discovery_details=details,
        discovery_properties={
            name: pb.ByteData(
                vec=value.value if isinstance(value, Secret) else value.encode("utf-8")
            )
            for name, value in properties.items()
        },
    )


async def discover(
    registration: Registration, details: str, properties: Mapping[str, PropertyValue]
) -> AsyncGenerator[list[Device], None]:
    """Yield each list the handler sends; return when it ends its stream.

    Raises ``HandlerUnreachable`` when the endpoint cannot be reached or the stream breaks, and
    ``HandlerFailed`` when the handler answers with an error.
    """
    options: list[tuple[str, str | int]] = [
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    where = f"{registration.name} at {registration.endpoint}"
    uds = registration.endpoint_type is EndpointType.UDS
    if uds:
        options.append(("grpc.default_authority", UDS_AUTHORITY))
    if uds and not os.path.exists(registration.endpoint):  # noqa: ASYNC240 (one local stat)
        raise HandlerUnreachable(f"discovery handler {where}: the socket does not exist")
    async with grpc.aio.insecure_channel(registration.target(), options=options) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT)
        except TimeoutError as exc:
            raise HandlerUnreachable(
                f"discovery handler {where} did not accept a connection in {CONNECT_TIMEOUT:g}s"
            ) from exc
        stub = pb_grpc.DiscoveryHandlerStub(channel)
        call = stub.Discover(request(details, properties))
        logged: set[tuple[str, str]] = set()
        try:
            async for response in call:
                kept, refused = convert(response.devices)
                for refusal in refused:
                    if (refusal.device_id, refusal.reason) not in logged:
                        logged.add((refusal.device_id, refusal.reason))
                        log.warning(
                            "discovery handler %s sent a device the agent refuses: id %r: %s",
                            where, refusal.device_id, refusal.reason,
                            extra={"handler": registration.name},
                        )
                yield kept
        except grpc.aio.AioRpcError as exc:
            error = HandlerUnreachable if exc.code() in _UNREACHABLE else HandlerFailed
            raise error(f"discovery handler {where}: {exc.code().name}: {exc.details()}") from exc
        finally:
            call.cancel()
