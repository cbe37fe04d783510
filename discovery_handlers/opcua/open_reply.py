"""What a server answered to the check's OpenSecureChannel when asyncua could not take it.

Why this exists: asyncua reads every reply to OpenSecureChannel as an OpenSecureChannelResponse,
without looking at its type. A server that refuses the channel with a ServiceFault inside the
(secured) OPN message makes that read fail: node-opcua does so for a client certificate it does
not trust (``BadSecurityChecksFailed``). asyncua then logs the parse error, drops the connection,
and its ``open_secure_channel`` ends in ``AssertionError``, which from outside looks the same as a
peer that never answered. (A refusal sent as a plain transport ERR message, as Eclipse Milo and
open62541 send theirs, already comes out of asyncua as a status error.)

So each connection's complete OPN replies are watched where asyncua turns bytes into a message
(``SecureConnection.receive_from_header_and_body``, asyncua 2.x; the same seam style as the byte
bound in ``client.py``), and ``OpenReplies.refusal`` says, after a failed channel, whether a reply
arrived and what it said: a status the server refused with (a ServiceFault, or an
OpenSecureChannelResponse carrying a bad status), or that the reply could not be read. No reply,
or a well-formed good response (the failure came after the channel), gives ``None``: the caller
decides as before. Nothing of the reply is repaired or used beyond the status it names.
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
