"""opcua checks against secured open62541 servers (the ``o6`` build, each its own process):
Basic256Sha256 SignAndEncrypt with a trusted client certificate from a Secret (healthy) and with
an untrusted one (present, unhealthy, saying so); and a ``secureOnly`` server, which refuses
every unencrypted connection, the GetEndpoints that fetches its certificate included: the
unhealthy reason names that step, not the secure channel after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from discovery_handlers.contract import Secret, warnings_of
from discovery_handlers.opcua import handler
from discovery_handlers.opcua.client import STEP_CHANNEL, STEP_ENDPOINTS
from discovery_handlers.opcua.details import OpcuaDetails
from tests.harness.opcua_open62541 import Open62541Server
from tests.harness.opcua_servers import Certificates, make_certificates
from tests.harness.opcua_watch import DeviceWatch

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = "discoveryIntervalSeconds: 0.2\ntimeoutSeconds: 2\n"
POLICY = "security:\n  policy: Basic256Sha256\n  mode: SignAndEncrypt\n"


@dataclass
class Secured:
    lds: Open62541Server  # both servers register here (FindServers needs no encryption)
    certs: Certificates
    other: Certificates  # a client certificate neither server trusts
    open: Open62541Server  # Basic256Sha256 endpoints beside security None
    secure_only: Open62541Server  # no unencrypted connection at all


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    where = tmp_path_factory.mktemp("open62541-certs")
    certs = await make_certificates(where / "ours", server_uri="urn:edgeplug:test:secure")
    other = await make_certificates(where / "other", server_uri="urn:other")
    lds = await Open62541Server("lds", discovery=True).start()
    servers = [Open62541Server(name, application_uri="urn:edgeplug:test:secure",
                               secure_with=certs, secure_only=only, register_to=lds.url)
               for name, only in (("secure", False), ("secure-only", True))]
    try:
        await asyncio.gather(*(s.start() for s in servers))
        yield Secured(lds, certs, other, *servers)
    finally:
        for server in [*servers, lds]:
            await server.close()


def details(url: str, certs: Certificates | None) -> OpcuaDetails:
    text = f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n{FAST}"
    if certs is None:
        return handler.parse_details(text, {})
    return handler.parse_details(text + POLICY, {
        "clientCertificate": Secret(certs.client_cert.read_bytes()),
        "clientPrivateKey": Secret(certs.client_key.read_bytes())})


async def health_of(lds: str, url: str, certs: Certificates | None) -> tuple[bool, str]:
    async with DeviceWatch(details(lds, certs)) as watch:
        devices = await watch.until(lambda d: url in d, what=f"{url} listed")
    return devices[url].health.healthy, devices[url].health.reason


async def test_trusted_certificate_healthy_untrusted_refused(secured: Secured) -> None:
    url = secured.open.url
    assert await health_of(secured.lds.url, url, secured.certs) == (True, "")
    # open62541 refuses an untrusted certificate at the secure channel (asyncua: at the session)
    healthy, reason = await health_of(secured.lds.url, url, secured.other)
    assert not healthy
    assert reason == (f"{STEP_CHANNEL}: BadSecurityChecksFailed "
                      "(the server may not trust the client certificate)"), reason
    # open62541 offers security None beside the secured endpoints (asyncua's test server does not)
    assert await health_of(secured.lds.url, url, None) == (True, "")


async def test_secure_only_server_names_the_refused_step(secured: Secured) -> None:
    url = secured.secure_only.url
    healthy, reason = await health_of(secured.lds.url, url, secured.certs)
    assert not healthy
    assert reason == f"{STEP_ENDPOINTS}: BadSecurityPolicyRejected", reason
    # no security asked: the channel itself is refused
    healthy, reason = await health_of(secured.lds.url, url, None)
    assert not healthy
    assert reason == f"{STEP_CHANNEL}: BadSecurityPolicyRejected", reason


async def test_secure_only_server_is_no_discovery_url(secured: Secured) -> None:
    """FindServers runs over security None, so a secureOnly server asked directly answers no
    list: it is a discovery URL that does not answer, and that is a warning, not silence."""
    url = secured.secure_only.url
    async with DeviceWatch(details(url, secured.certs)) as watch:
        devices = await watch.until(lambda d: True, what="a first list")
        [warning] = warnings_of(watch.lists[-1])
    assert devices == {}
    assert warning.startswith(f"discovery URL {url}: FindServers failed "
                              "(BadSecurityPolicyRejected)"), warning
