"""The thin seam over asyncua: ask a discovery URL for its servers; check one server's state.

``find_servers`` and ``check`` are the handler's only OPC-UA calls; network failures come back as
``Unreachable``, a server that talks but cannot be used as a ``Health``. Every call is bounded in
time, memory and what is kept, and no certificate or key reaches a file or a log
(docs/handlers/opcua.md, "How it works, and why").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from asyncua import ua
from asyncua.client.client import Client
from asyncua.client.ua_client import UASocketProtocol
from asyncua.crypto import security_policies, uacrypto
from asyncua.ua.uaerrors import UaError, UaStatusCodeError
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import Encoding

from discovery_handlers.contract import Health
from discovery_handlers.opcua.details import Security
from discovery_handlers.opcua.open_reply import OpenReplies
from discovery_handlers.opcua.selection import ServerRecord, clean_text, state_health

MAX_CONNECTION_BYTES = 4 * 1024 * 1024  # a FindServers answer of 10,000 servers is ~1.5 MB
MAX_SERVERS_PER_ANSWER = 1000
MAX_URLS_PER_SERVER = 16
MAX_REASON_CHARS = 160
#: asyncua logs every connection at INFO and hostile replies at ERROR/CRITICAL on each attempt;
#: the handler logs what matters once per change, so asyncua's loggers are quieted unless the
#: operator configured them.
VENDOR_LOG_LEVEL = logging.CRITICAL + 1
_SECURITY_MODES = {
    "Sign": ua.MessageSecurityMode.Sign,
    "SignAndEncrypt": ua.MessageSecurityMode.SignAndEncrypt,
}
_PEM_MARKER = b"-----BEGIN"
#: The steps of a check, as an unhealthy reason names the one the server refused.
STEP_ENDPOINTS = "endpoint query refused (unencrypted GetEndpoints)"
STEP_CHANNEL = "secure channel refused"
STEP_SESSION = "session refused"
STEP_STATE = "ServerStatus.State unreadable"
#: What OPC-UA servers answer an untrusted client certificate with at the secure channel (the
#: specification asks them not to say more); the reason adds what it most often means.
_CERTIFICATE_HINT = {"BadSecurityChecksFailed": "the server may not trust the client certificate"}

_vendor_logger = logging.getLogger("asyncua")
if _vendor_logger.level == logging.NOTSET:
    _vendor_logger.setLevel(VENDOR_LOG_LEVEL)


class Unreachable(Exception):
    """No OPC-UA conversation with the URL: the reason is safe to log."""


@dataclass(frozen=True)
class FoundServers:
    """A FindServers answer, bounded; ``total`` counts what the peer sent."""

    records: tuple[ServerRecord, ...]
    total: int


async def find_servers(url: str, *, limit_s: float) -> FoundServers:
    """Ask ``url`` (a discovery server or a server) which servers it knows, over security None."""
    replies = OpenReplies()
    client = _client(url, limit_s, replies)
    try:
        async with _bounded(limit_s):
            described = await client.connect_and_find_servers()
    except Exception as exc:
        refusal = replies.refusal()  # still not listed: FindServers gave no servers
        raise Unreachable(_reason(exc) if refusal is None else f"{STEP_CHANNEL}: {refusal}"
                          ) from None
    finally:
        client.disconnect_socket()
    if not isinstance(described, list):
        raise Unreachable("FindServers answer is not a list")
    kept = tuple(_record(item) for item in described[:MAX_SERVERS_PER_ANSWER])
    return FoundServers(records=kept, total=len(described))


async def check(url: str, *, limit_s: float, security: Security | None) -> Health:
    """Open a session on ``url`` and read ``ServerStatus.State``.

    Raises ``Unreachable`` when nothing answers in OPC-UA (or the server went silent); returns an
    unhealthy ``Health`` when the server talks but says no, naming the step that was refused:
    the unencrypted endpoint query (with security set), the secure channel, the session, or the
    state read. A server may refuse the first step and not the others (open62541's
    ``secureOnly`` answers the unencrypted GetEndpoints with ``BadSecurityPolicyRejected``).
    A reply to OpenSecureChannel that asyncua fails on (it raises ``AssertionError`` after a
    ServiceFault) is a refusal too, when ``OpenReplies`` saw it arrive; an ``AssertionError``
    or any other failure with no such reply is still ``Unreachable``.
    """
    replies = OpenReplies()
    client = _client(url, limit_s, replies)
    step = STEP_CHANNEL
    try:
        async with _bounded(limit_s):
            if security is not None:
                step = STEP_ENDPOINTS
                refused = await _secure(client, security)
                if refused is not None:
                    return refused
                step = STEP_CHANNEL
            await client.connect_socket()
            await client.send_hello()
            await client.open_secure_channel()
            step = STEP_SESSION
            try:
                await client.create_session()
                await client.activate_session()
            except (UaError, UaStatusCodeError) as exc:
                return Health.unhealthy(_session_refused(exc, security))
            step = STEP_STATE
            try:
                state = await client.nodes.server_state.read_value()
            finally:
                await _close_quietly(client)
    except UaStatusCodeError as exc:  # the peer speaks OPC-UA and said no: present
        return Health.unhealthy(_refused(step, _reason(exc), security))
    except UaError as exc:
        if step == STEP_STATE:
            return Health.unhealthy(f"{step}: {_reason(exc)}")
        return _refused_channel(step, replies, security, exc)
    except Exception as exc:
        return _refused_channel(step, replies, security, exc)
    finally:
        client.disconnect_socket()
    if isinstance(state, bool) or not isinstance(state, int):
        return Health.unhealthy("ServerStatus.State is not a ServerState")
    return state_health(int(state))


async def _secure(client: Client, security: Security) -> Health | None:
    """Set up the secured channel; a health when the server offers no matching endpoint."""
    endpoints = await client.connect_and_get_server_endpoints()
    client.disconnect_socket()
    policy: Any = getattr(security_policies, f"SecurityPolicy{security.policy}")
    mode = _SECURITY_MODES[security.mode.value]
    matching = [ep for ep in endpoints
                if ep.SecurityPolicyUri == policy.URI and ep.SecurityMode == mode]
    if not matching:
        return Health.unhealthy(
            f"server offers no {security.policy}/{security.mode.value} endpoint")
    server_cert = uacrypto.x509_from_der(  # type: ignore[no-untyped-call]
        matching[0].ServerCertificate)
    if server_cert is None:
        return Health.unhealthy("server endpoint carries no certificate")
    certificate = security.certificate.value
    try:
        client.application_uri = security.application_uri or _certificate_uri(certificate)
        await client.set_security(
            policy,
            uacrypto.CertProperties(certificate, _encoding(certificate)),
            uacrypto.CertProperties(security.private_key.value,
                                    _encoding(security.private_key.value)),
            server_certificate=server_cert.public_bytes(Encoding.DER),
            mode=mode,
        )
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        # our own certificate or key does not load: say so, naming no content (the
        # exception's text is not shown: it is about key material)
        return Health.unhealthy(f"client certificate or key unusable ({type(exc).__name__})")
    return None


def _refused_channel(step: str, replies: OpenReplies, security: Security | None,
                     exc: Exception) -> Health:
    """Unhealthy when the server answered the OpenSecureChannel of ``step`` with a refusal
    asyncua could not read; ``Unreachable`` (raised) when no such reply arrived."""
    refusal = replies.refusal() if step in (STEP_ENDPOINTS, STEP_CHANNEL) else None
    if refusal is None:
        raise Unreachable(_reason(exc)) from None
    return Health.unhealthy(_refused(step, refusal, security))


def _refused(step: str, status: str, security: Security | None) -> str:
    hint = _CERTIFICATE_HINT.get(status) if step == STEP_CHANNEL and security is not None else None
    return f"{step}: {status}" if hint is None else f"{step}: {status} ({hint})"


def _session_refused(exc: Exception, security: Security | None) -> str:
    if not isinstance(exc, UaStatusCodeError) and str(exc).startswith("No matching endpoints"):
        if security is None:
            return "server offers no endpoint with security None (set security in details)"
        return f"server offers no {security.policy}/{security.mode.value} endpoint"
    return f"{STEP_SESSION}: {_reason(exc)}"


def _certificate_uri(certificate: bytes) -> str:
    """The application URI in the client certificate (OPC-UA puts it in subjectAltName)."""
    loaded = (x509.load_pem_x509_certificate(certificate) if _encoding(certificate) == "pem"
              else x509.load_der_x509_certificate(certificate))
    try:
        san = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ""
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return uris[0] if uris else ""


def _encoding(data: bytes) -> str:
    return "pem" if data.lstrip().startswith(_PEM_MARKER) else "der"


async def _close_quietly(client: Client) -> None:
    try:
        await client.close_session()
        await client.close_secure_channel()
    except Exception:  # the state was read; a server that drops the session here is not news
        return


@contextlib.asynccontextmanager
async def _bounded(limit_s: float) -> AsyncIterator[None]:
    """``asyncio.timeout`` that always ends in ``TimeoutError`` when its own deadline passed.

    asyncua waits through ``wait_for2``, which turns a deadline that races a finished request
    into ``CancelledWithResultError`` (a ``CancelledError`` subclass that ``asyncio.timeout``
    does not translate): left alone it would end the caller's task as if cancelled. A real
    cancellation of the caller (``cancelling() > 0``) still propagates.
    """
    try:
        async with asyncio.timeout(limit_s):
            yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling() == 0:
            raise TimeoutError from None
        raise


def _client(url: str, timeout: float, replies: OpenReplies) -> Client:
    client = Client(url, timeout=timeout)
    client.max_messagesize = MAX_CONNECTION_BYTES
    make_protocol: Callable[[], UASocketProtocol] = client.uaclient._make_protocol

    def guarded() -> UASocketProtocol:
        protocol = make_protocol()
        _bound_bytes(protocol)
        replies.watch(protocol)
        return protocol

    client.uaclient._make_protocol = guarded  # type: ignore[method-assign]
    return client


def _bound_bytes(protocol: UASocketProtocol) -> None:
    received = 0
    deliver = protocol.data_received

    def data_received(data: bytes) -> None:
        nonlocal received
        received += len(data)
        if received > MAX_CONNECTION_BYTES:
            if protocol.transport is not None:
                protocol.transport.abort()
            return
        deliver(data)

    protocol.data_received = data_received  # type: ignore[method-assign]


def _record(item: Any) -> ServerRecord:
    if not isinstance(item, ua.ApplicationDescription):
        return ServerRecord("", "", "", -1, ())
    name = item.ApplicationName.Text if item.ApplicationName is not None else None
    urls = item.DiscoveryUrls if isinstance(item.DiscoveryUrls, list) else []
    kind = item.ApplicationType
    return ServerRecord(
        application_uri=clean_text(item.ApplicationUri),
        product_uri=clean_text(item.ProductUri),
        application_name=clean_text(name),
        application_type=int(kind) if isinstance(kind, int) else -1,
        discovery_urls=tuple(clean_text(u) for u in urls[:MAX_URLS_PER_SERVER]),
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, UaStatusCodeError):
        return type(exc).__name__  # asyncua names each status's class: BadSecurityChecksFailed
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = clean_text(str(exc))[:MAX_REASON_CHARS]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

