"""opcua: what a reply to OpenSecureChannel says, over a table of bodies encoded by asyncua itself
(the node-opcua refusal itself is tested in tests/integration/test_opcua_nodeopcua.py): a refusal
names its status, a good response is no refusal, anything else that arrived is an unreadable
reply, never a status guessed from it."""

from __future__ import annotations

import pytest
from asyncua import ua
from asyncua.ua.ua_binary import struct_to_binary

from discovery_handlers.opcua.open_reply import OpenReplies, refusal_in

SECURITY_CHECKS_FAILED = 0x80130000
UNKNOWN_BAD = 0x80FF0000  # no status asyncua knows


def fault(code: int) -> bytes:
    reply = ua.ServiceFault()
    reply.ResponseHeader.ServiceResult = ua.StatusCode(ua.UInt32(code))
    return bytes(struct_to_binary(reply))


def response(code: int) -> bytes:
    reply = ua.OpenSecureChannelResponse()
    reply.ResponseHeader.ServiceResult = ua.StatusCode(ua.UInt32(code))
    return bytes(struct_to_binary(reply))


@pytest.mark.parametrize(("body", "said"), [
    (fault(SECURITY_CHECKS_FAILED), "BadSecurityChecksFailed"),  # node-opcua's refusal
    (fault(UNKNOWN_BAD), f"Bad 0x{UNKNOWN_BAD:08X}"),
    (fault(0), "unreadable reply (ServiceFault)"),  # a fault naming no fault
    (response(SECURITY_CHECKS_FAILED), "BadSecurityChecksFailed"),
    (response(0), None),  # the channel was opened: whatever failed came later
    (response(0)[:30], "unreadable reply (NotEnoughData)"),  # cut: nothing is guessed
    (response(SECURITY_CHECKS_FAILED)[:30], "BadSecurityChecksFailed"),  # header only
    (bytes(struct_to_binary(ua.ReadResponse())),
     "unreadable reply (not an OpenSecureChannelResponse)"),
    (b"", "unreadable reply (NotEnoughData)"),
], ids=["fault", "unknown-status", "good-fault", "bad-response", "good-response", "cut-response",
        "header-only-response",
        "other-type", "empty"])
def test_what_the_reply_says(body: bytes, said: str | None) -> None:
    assert refusal_in(body) == said


def test_no_reply_is_no_refusal() -> None:
    assert OpenReplies().refusal() is None
