"""What a server answered to the check's OpenSecureChannel when asyncua could not read it.

``OpenReplies.watch`` follows a connection's OPN replies; ``OpenReplies.refusal`` then says whether
a reply came and which status it refused with (a ServiceFault asyncua fails on), or ``None`` when
there was none. Why: docs/handlers/opcua.md, "Health" and "How it works, and why".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncua import ua
from asyncua.client.ua_client import UASocketProtocol
from asyncua.common.utils import Buffer
from asyncua.ua.object_ids import ObjectIds
from asyncua.ua.ua_binary import nodeid_from_binary, struct_from_binary

from discovery_handlers.opcua.selection import clean_text

_SERVICE_FAULT = ObjectIds.ServiceFault_Encoding_DefaultBinary
_OPEN_RESPONSE = ObjectIds.OpenSecureChannelResponse_Encoding_DefaultBinary
MAX_STATUS_CHARS = 64


class OpenReplies:
    """The last complete reply to OpenSecureChannel on the connection being watched."""

    def __init__(self) -> None:
        self._body: bytes | None = None  # the reply's decoded body
        self._unreadable: str | None = None  # a reply arrived that asyncua could not decode

    def watch(self, protocol: UASocketProtocol) -> None:
        """Watch ``protocol``, a new connection: what an earlier one received is forgotten."""
        self._body = None
        self._unreadable = None
        connection: Any = protocol._connection
        receive: Callable[[Any, Buffer], Any] = connection.receive_from_header_and_body

        def watched(header: Any, body: Buffer) -> Any:  # header: ua.Header
            is_open = bool(header.MessageType == ua.MessageType.SecureOpen)
            try:
                message = receive(header, body)
            except Exception as exc:
                if is_open:  # a whole message came, and did not decrypt or verify
                    self._unreadable = type(exc).__name__
                raise
            if is_open and isinstance(message, ua.Message):
                self._body = bytes(message.body())  # type: ignore[no-untyped-call]
            return message

        connection.receive_from_header_and_body = watched

    def refusal(self) -> str | None:
        """What the reply said when it was not a good OpenSecureChannelResponse, else ``None``.

        A status name (``BadSecurityChecksFailed``) for a refusal; ``unreadable reply (...)``
        for a reply that arrived and could not be read; ``None`` when no reply arrived.
        """
        if self._unreadable is not None:
            return f"unreadable reply ({self._unreadable})"
        if self._body is None:
            return None
        return refusal_in(self._body)


def refusal_in(body: bytes) -> str | None:
    """What the decoded body of an OPN reply says, as ``OpenReplies.refusal`` does."""
    try:
        type_id = nodeid_from_binary(Buffer(body))
    except Exception as exc:
        return f"unreadable reply ({type(exc).__name__})"
    kind = type_id.Identifier if type_id.NamespaceIndex == 0 else None
    if kind == _OPEN_RESPONSE:
        try:
            response = struct_from_binary(ua.OpenSecureChannelResponse, Buffer(body))
        except Exception as exc:
            return _status_or(body, f"unreadable reply ({type(exc).__name__})")
        status = response.ResponseHeader.ServiceResult
        return None if status.is_good() else _status_name(status)
    if kind == _SERVICE_FAULT:
        return _status_or(body, "unreadable reply (ServiceFault)")
    return "unreadable reply (not an OpenSecureChannelResponse)"


def _status_or(body: bytes, otherwise: str) -> str:
    """The bad status in the reply's header (ServiceFault and the response both start so)."""
    data = Buffer(body)
    try:
        nodeid_from_binary(data)
        header = struct_from_binary(ua.ResponseHeader, data)
    except Exception:
        return otherwise
    status = header.ServiceResult
    if status.is_good():  # a fault that names no fault
        return otherwise
    return _status_name(status)


def _status_name(status: ua.StatusCode) -> str:
    """asyncua's name of the status; a code it does not know is named by its number."""
    name = clean_text(status.name)[:MAX_STATUS_CHARS]
    known = name not in ("", "Bad", "Uncertain")  # asyncua's names for an unknown code
    return name if known else f"{name or 'status'} 0x{int(status.value):08X}"
