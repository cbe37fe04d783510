"""opcua discovery against real asyncua servers and a real asyncua discovery server on loopback:
found through the discovery server and directly, filtered by application name, gone when
stopped and back under the same id when restarted, unhealthy when not Running, and a server that
accepts only Basic256Sha256 SignAndEncrypt checked with the client certificate from a Secret."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from asyncua import ua

from crds.naming import instance_name
from discovery_handlers.contract import Device, Secret
from discovery_handlers.opcua import handler
from discovery_handlers.opcua.details import OpcuaDetails
from tests.harness.opcua_servers import TestServer, description, make_certificates, register
from tests.harness.opcua_watch import DeviceWatch

# One fleet of real servers serves the module (each costs ~2 s to start on a loaded machine); a
# test that stops or changes a server puts it back before it ends.
pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = "discoveryIntervalSeconds: 0.2\ntimeoutSeconds: 2\n"


def details(*urls: str, extra: str = "", properties: dict[str, Secret] | None = None
            ) -> OpcuaDetails:
    listed = "".join(f"\n      - {u}" for u in urls)
    text = f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls:{listed}\n{FAST}{extra}"
    return handler.parse_details(text, properties or {})


@dataclass
class Fleet:
    lds: TestServer
    alpha: TestServer  # registered to the discovery server
    beta: TestServer  # not registered: only found when asked directly


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet() -> AsyncIterator[Fleet]:
    lds = await TestServer("lds", discovery=True).start()
    alpha = await TestServer("alpha", register_to=lds.url).start()
    beta = await TestServer("beta").start()
    try:
        yield Fleet(lds, alpha, beta)
    finally:
        for server in (alpha, beta, lds):
            await server.stop()


async def test_found_through_discovery_server_and_directly(fleet: Fleet) -> None:
    # a client and a second discovery server registered too: neither is a device
    await register(fleet.lds.url, [
        description(1, url="opc.tcp://127.0.0.1:9/", kind=ua.ApplicationType.Client),
        description(2, url="opc.tcp://127.0.0.1:9/", kind=ua.ApplicationType.DiscoveryServer),
    ])
    # alpha asked directly as well as through the discovery server: one device, not two
    async with DeviceWatch(details(fleet.lds.url, fleet.beta.url, fleet.alpha.url)) as watch:
        devices = await watch.until(lambda d: len(d) == 2, what="alpha and beta")
        first = watch.lists[0]
    assert {d.id for d in first} == {fleet.alpha.url, fleet.beta.url}, \
        "the first list is complete: every URL asked and every server checked"
    alpha = devices[fleet.alpha.url]
    assert dict(alpha.properties) == {
        "OPCUA_DISCOVERY_URL": fleet.alpha.url,
        "OPCUA_APPLICATION_URI": "urn:edgeplug:test:alpha",
        "OPCUA_PRODUCT_URI": "urn:freeopcua.github.io:python:server",
        "OPCUA_APPLICATION_NAME": "alpha",
    }
    assert all(d.health.healthy for d in devices.values())


@pytest.mark.parametrize(("action", "expected"), [("Include", {"alpha"}), ("Exclude", {"beta"})])
async def test_application_names_filter(fleet: Fleet, action: str, expected: set[str]) -> None:
    names = f"applicationNames:\n  action: {action}\n  items: [alpha]\n"
    async with DeviceWatch(details(fleet.lds.url, fleet.beta.url, extra=names)) as watch:
        await watch.until(bool, what="a first list")
        found = {d.properties["OPCUA_APPLICATION_NAME"] for d in watch.lists[0]}
    assert found == expected


def names_of(devices: dict[str, Device]) -> set[str]:
    return {d.properties["OPCUA_APPLICATION_NAME"] for d in devices.values()}


async def test_stopped_server_gone_restarted_back_under_the_same_name(fleet: Fleet) -> None:
    async with DeviceWatch(details(fleet.lds.url, fleet.beta.url)) as watch:
        before = await watch.until(lambda d: names_of(d) == {"alpha", "beta"}, what="both")
        await fleet.alpha.stop()
        await watch.until(lambda d: names_of(d) == {"beta"}, what="alpha gone once stopped")
        await fleet.alpha.start()  # same port, same URL
        after = await watch.until(lambda d: names_of(d) == {"alpha", "beta"}, what="alpha back")
    assert after.keys() == before.keys(), "the same device id, so the same Instance name"
    assert instance_name("opcua", fleet.alpha.url, shared=True, node="any") in {
        instance_name("opcua", device_id, shared=True, node="any") for device_id in after}


async def test_server_not_running_is_unhealthy_then_recovers(fleet: Fleet) -> None:
    async with DeviceWatch(details(fleet.lds.url)) as watch:
        await watch.until(lambda d: fleet.alpha.url in d, what="alpha")
        await fleet.alpha.set_state(ua.ServerState.Suspended)
        devices = await watch.until(
            lambda d: not d[fleet.alpha.url].health.healthy, what="alpha unhealthy")
        assert devices[fleet.alpha.url].health.reason == "server state is Suspended"
        await fleet.alpha.set_state(ua.ServerState.Running)
        await watch.until(lambda d: d[fleet.alpha.url].health.healthy, what="alpha healthy")


async def test_secure_only_server_checked_with_certificate_from_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    certs = await make_certificates(tmp_path, server_uri="urn:edgeplug:test:secure")
    secure = await TestServer("secure", application_uri="urn:edgeplug:test:secure",
                              secure_with=certs).start()
    key = certs.client_key.read_bytes()
    secrets = {"clientCertificate": Secret(certs.client_cert.read_bytes()),
               "clientPrivateKey": Secret(key)}
    policy = "security:\n  policy: Basic256Sha256\n  mode: SignAndEncrypt\n"
    try:
        async with DeviceWatch(details(secure.url)) as anonymous:
            seen = await anonymous.until(bool, what="the secure server, checked anonymously")
        reason = seen[secure.url].health.reason
        assert not seen[secure.url].health.healthy
        assert "no endpoint with security None" in reason, reason
        async with DeviceWatch(details(secure.url, extra=policy, properties=secrets)) as watch:
            devices = await watch.until(bool, what="the secure server, checked with the cert")
        assert devices[secure.url].health.healthy, devices[secure.url].health.reason
        # a certificate the server does not trust: present, unhealthy, and says why
        other = await make_certificates(tmp_path / "other", server_uri="urn:other")
        untrusted = {"clientCertificate": Secret(other.client_cert.read_bytes()),
                     "clientPrivateKey": Secret(other.client_key.read_bytes())}
        async with DeviceWatch(details(secure.url, extra=policy, properties=untrusted)) as watch:
            refused = await watch.until(bool, what="the secure server, refusing the cert")
        assert not refused[secure.url].health.healthy
        assert "refused" in refused[secure.url].health.reason, refused[secure.url].health.reason
    finally:
        await secure.stop()
    body = key.split(b"-----")[2].strip().splitlines()[0].decode()  # a line of the key itself
    assert body not in caplog.text
    assert all(body not in v for v in devices[secure.url].properties.values())
