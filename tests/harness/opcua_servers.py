"""Real asyncua servers and discovery servers on loopback for the opcua handler's tests.

The handler's tests, end-to-end test, CLI test and benchmark all need the same
real parts: an asyncua discovery server, asyncua servers that register with it (or not), that
can be stopped and restarted on the same port, put in a state other than Running, or accept only
``Basic256Sha256`` SignAndEncrypt with a client certificate they trust; and plain
``RegisterServer`` calls that put many lightweight descriptions on a discovery server. Each
server lives in the test's own event loop (a real asyncua server costs ~1 s and tens of MB);
``python -m tests.harness.opcua_servers`` runs one in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncua import ua
from asyncua.client.client import Client
from asyncua.crypto import cert_gen
from asyncua.crypto.truststore import TrustStore
from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions
from asyncua.server.server import Server
from cryptography.x509.oid import ExtendedKeyUsageOID

NAMESPACE_URI = "urn:edgeplug:test"  # the first namespace a server registers: index 2
VALUE_NAME = "Temperature"
VALUE_IDENTIFIER = "Thermometer_Temperature"  # Akri's example broker reads ns=2;s=<this>
VALUE = 21.5
REGISTRATION_PERIOD_S = 60  # asyncua re-registers this often; the tests never wait on it
CLIENT_APPLICATION_URI = "urn:edgeplug:test:client"
REGISTER_TIMEOUT_S = 10.0

logging.getLogger("asyncua").setLevel(logging.ERROR)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Certificates:
    """A server's and a client's certificate (DER) and key (PEM), as OPC-UA wants them."""

    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


async def make_certificates(directory: Path, *, server_uri: str) -> Certificates:
    """Self-signed application certificates with their URIs in subjectAltName."""
    host = socket.gethostname()
    certs = Certificates(directory / "server.der", directory / "server-key.pem",
                         directory / "client" / "client.der", directory / "client-key.pem")
    certs.client_cert.parent.mkdir(parents=True, exist_ok=True)
    await cert_gen.setup_self_signed_certificate(
        certs.server_key, certs.server_cert, server_uri, host,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], {})
    await cert_gen.setup_self_signed_certificate(
        certs.client_key, certs.client_cert, CLIENT_APPLICATION_URI, host,
        [ExtendedKeyUsageOID.CLIENT_AUTH], {})
    return certs


class ServerIdentity:
    """What a test server is known by (name, port, URL, application URI) and how it is set up
    (a discovery server, registered to one, secured): the same for the asyncua ``TestServer``
    and the open62541 ``Open62541Server``. ``stop`` and ``start`` again keep its URL."""

    def __init__(self, name: str, *, port: int | None = None, application_uri: str | None = None,
                 discovery: bool = False, register_to: str | None = None,
                 secure_with: Certificates | None = None, host: str = "127.0.0.1") -> None:
        self.name = name
        self.port = port or free_port()
        self.url = f"opc.tcp://{host}:{self.port}/"
        self.application_uri = application_uri or f"urn:edgeplug:test:{name}"
        self._discovery = discovery
        self._register_to = register_to
        self._secure_with = secure_with


class TestServer(ServerIdentity):
    """One real asyncua server on ``127.0.0.1:port`` (``async with`` starts and stops it)."""

    __test__ = False  # not a pytest class
    _server: Server | None = None

    async def __aenter__(self) -> TestServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> TestServer:
        server = Server()
        await server.init()
        server.set_endpoint(self.url)
        server.set_server_name(self.name)
        await server.set_application_uri(self.application_uri)
        if self._discovery:
            server.application_type = ua.ApplicationType.DiscoveryServer
        if self._secure_with is not None:
            certs = self._secure_with
            server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
            await server.load_certificate(str(certs.server_cert))
            await server.load_private_key(str(certs.server_key))
            store = TrustStore([certs.client_cert.parent], [])
            await store.load()
            server.set_certificate_validator(CertificateValidator(
                CertificateValidatorOptions.TRUSTED_VALIDATION
                | CertificateValidatorOptions.PEER_CLIENT, store))
        index = await server.register_namespace(NAMESPACE_URI)
        await server.nodes.objects.add_variable(
            f"ns={index};s={VALUE_IDENTIFIER}", VALUE_NAME, VALUE)
        await server.start()
        self._server = server
        if self._register_to is not None:
            await server.register_to_discovery(self._register_to, period=REGISTRATION_PERIOD_S)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop()

    async def set_state(self, state: ua.ServerState) -> None:
        """Write ``ServerStatus.State`` as a server going into maintenance would."""
        assert self._server is not None, "server not running"
        node = self._server.nodes.server_state
        await node.write_value(state, ua.VariantType.Int32)

    def register_locally(self, descriptions: Sequence[ua.RegisteredServer]) -> None:
        """Put descriptions straight into this discovery server's table (a hostile-size answer)."""
        assert self._server is not None, "server not running"
        for description in descriptions:
            self._server.iserver.register_server(description)


def description(index: int, *, url: str, kind: ua.ApplicationType = ua.ApplicationType.Server,
                name: str | None = None) -> ua.RegisteredServer:
    """A lightweight server description such as a device registers for itself."""
    registered = ua.RegisteredServer()
    registered.ServerUri = f"urn:edgeplug:registered:{index}"
    registered.ProductUri = "urn:edgeplug:registered"
    registered.ServerNames = [ua.LocalizedText(name or f"registered-{index}")]
    registered.ServerType = kind
    registered.DiscoveryUrls = [url]
    registered.IsOnline = True
    return registered


async def register(discovery_url: str, descriptions: Sequence[ua.RegisteredServer]) -> None:
    """RegisterServer over the wire, one call per description, as real servers do."""
    client = Client(discovery_url, timeout=REGISTER_TIMEOUT_S)
    await client.connect_sessionless()
    try:
        for item in descriptions:
            await client.uaclient.register_server(item)
    finally:
        await client.disconnect_sessionless()


async def deregister(discovery_url: str, *, application_uri: str, url: str) -> None:
    """``RegisterServer`` with ``IsOnline=false``: what a server sends its discovery server as
    it shuts down (the asyncua discovery server ignores it; open62541's drops the record)."""
    item = description(0, url=url)
    item.ServerUri = application_uri
    item.IsOnline = False
    await register(discovery_url, [item])


async def _serve(args: argparse.Namespace) -> None:
    server = await TestServer(args.name, port=args.port, register_to=args.register_to).start()
    print(f"ready {server.url}", flush=True)
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run one asyncua test server until killed")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--register-to")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
