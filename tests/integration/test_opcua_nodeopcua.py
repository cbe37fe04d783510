"""opcua checks against a real node-opcua server (its own Node.js process) offering Basic256Sha256
SignAndEncrypt: a trusted client certificate is healthy; an untrusted one is refused with a
ServiceFault inside the secured OpenSecureChannel reply (``BadSecurityChecksFailed``), which
asyncua cannot read (it raises ``AssertionError``): the server is still listed, unhealthy, saying
so, and the warning names its URL. A server that does not answer at all (stopped: connection
refused; a peer that accepts and stays silent: timed out) is still unreachable and not listed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from discovery_handlers.contract import Secret
from discovery_handlers.opcua import client, handler
from discovery_handlers.opcua.client import STEP_CHANNEL
from discovery_handlers.opcua.details import OpcuaDetails
from tests.harness.opcua_hostile import HostilePeer
from tests.harness.opcua_nodeopcua import PRODUCT_URI, NodeOpcuaServer
from tests.harness.opcua_servers import Certificates, free_port, make_certificates
from tests.harness.opcua_watch import DeviceWatch

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 2.0
FAST = f"discoveryIntervalSeconds: 0.2\ntimeoutSeconds: {TIMEOUT_S}\n"
POLICY = "security:\n  policy: Basic256Sha256\n  mode: SignAndEncrypt\n"
UNTRUSTED = (f"{STEP_CHANNEL}: BadSecurityChecksFailed "
             "(the server may not trust the client certificate)")


@dataclass
class Secured:
    server: NodeOpcuaServer  # trusts certs' client certificate only
    certs: Certificates
    other: Certificates  # a client certificate the server does not trust


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    where = tmp_path_factory.mktemp("node-opcua-certs")
    certs = await make_certificates(where / "ours", server_uri="urn:edgeplug:test:node-opcua")
    other = await make_certificates(where / "other", server_uri="urn:other")
    server = NodeOpcuaServer("node-opcua", application_uri="urn:edgeplug:test:node-opcua",
                             secure_with=certs)
    await server.start()
    try:
        yield Secured(server, certs, other)
    finally:
        await server.close()


def details(url: str, certs: Certificates) -> OpcuaDetails:
    return handler.parse_details(
        f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n{FAST}{POLICY}", {
            "clientCertificate": Secret(certs.client_cert.read_bytes()),
            "clientPrivateKey": Secret(certs.client_key.read_bytes())})


async def test_trusted_certificate_is_healthy(secured: Secured) -> None:
    url = secured.server.url
    async with DeviceWatch(details(url, secured.certs)) as watch:
        devices = await watch.until(lambda d: url in d, what=f"{url} listed")
    device = devices[url]
    assert (device.health.healthy, device.health.reason) == (True, "")
    assert device.properties["OPCUA_PRODUCT_URI"] == PRODUCT_URI  # node-opcua's, not another's


async def test_untrusted_certificate_is_listed_unhealthy_saying_so(
    secured: Secured, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery_handlers.opcua")
    url = secured.server.url
    async with DeviceWatch(details(url, secured.other)) as watch:
        devices = await watch.until(lambda d: url in d, what=f"{url} listed")
    device = devices[url]
    assert (device.health.healthy, device.health.reason) == (False, UNTRUSTED)
    assert f"{url}: unhealthy: {UNTRUSTED}" in caplog.text, caplog.text


async def test_a_server_that_does_not_answer_is_still_unreachable(secured: Secured) -> None:
    security = details(secured.server.url, secured.other).security
    nothing = f"opc.tcp://127.0.0.1:{free_port()}"  # a port nothing listens on
    with pytest.raises(client.Unreachable) as refused:
        await client.check(nothing, limit_s=TIMEOUT_S, security=security)
    assert str(refused.value) == "connection refused"
    silent = await HostilePeer("silent").start()
    try:
        with pytest.raises(client.Unreachable) as silence:
            await client.check(silent.url, limit_s=TIMEOUT_S, security=security)
        assert str(silence.value) == "timed out"
    finally:
        await silent.stop()
