"""opcua discovery against real servers and a real discovery server (LDS) on loopback, of two
implementations: asyncua (in this process) and open62541 (the C stack many devices embed, as the
``o6`` build, each server its own process). Found through the LDS and directly, filtered by
application name, gone when stopped and back under the same id when restarted, gone when
frozen (open62541) and back when it answers, gone when deregistered from the LDS (open62541), a
warning (not silence) when the LDS stops answering; against asyncua only: unhealthy when not
Running (open62541 computes its state, it cannot be set) and a server that accepts only
Basic256Sha256 SignAndEncrypt (open62541's secured servers: ``test_opcua_open62541_secure.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from asyncua import ua

from crds.naming import instance_name
from discovery_handlers.contract import Device, Secret, warnings_of
from discovery_handlers.opcua import handler
from discovery_handlers.opcua.details import OpcuaDetails
from tests.harness import opcua_open62541
from tests.harness.opcua_open62541 import Open62541Server
from tests.harness.opcua_servers import (
    TestServer,
    deregister,
    description,
    make_certificates,
    register,
)
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


ASYNCUA, OPEN62541 = "asyncua", "open62541"
PRODUCT_URIS = {ASYNCUA: "urn:freeopcua.github.io:python:server",
                OPEN62541: opcua_open62541.PRODUCT_URI}


@dataclass
class Fleet:
    kind: str
    lds: TestServer | Open62541Server
    alpha: TestServer | Open62541Server  # registered to the discovery server
    beta: TestServer | Open62541Server  # not registered: only found when asked directly


async def start_fleet(kind: str) -> Fleet:
    if kind == ASYNCUA:
        lds: TestServer | Open62541Server = await TestServer("lds", discovery=True).start()
        alpha: TestServer | Open62541Server = await TestServer(
            "alpha", register_to=lds.url).start()
        return Fleet(kind, lds, alpha, await TestServer("beta").start())
    lds = await Open62541Server("lds", discovery=True).start()
    alpha, beta = await asyncio.gather(Open62541Server("alpha", register_to=lds.url).start(),
                                       Open62541Server("beta").start())
    return Fleet(kind, lds, alpha, beta)


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=[ASYNCUA, OPEN62541])
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    started = await start_fleet(request.param)
    try:
        yield started
    finally:
        for server in (started.alpha, started.beta, started.lds):
            await server.stop()
            if isinstance(server, Open62541Server):
                await server.close()


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
        "OPCUA_PRODUCT_URI": PRODUCT_URIS[fleet.kind],
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


@pytest.mark.parametrize("fleet", [OPEN62541], indirect=True)
async def test_frozen_server_gone_thawed_back(fleet: Fleet) -> None:
    """A hung server (SIGSTOP: its port open, nothing answering) costs its check the timeout and
    leaves the list; it is back once it answers (open62541 only: asyncua runs in this process)."""
    alpha = fleet.alpha
    assert isinstance(alpha, Open62541Server)
    async with DeviceWatch(details(fleet.lds.url, fleet.beta.url)) as watch:
        await watch.until(lambda d: names_of(d) == {"alpha", "beta"}, what="both")
        alpha.freeze()
        try:
            await watch.until(lambda d: names_of(d) == {"beta"}, what="alpha gone once frozen")
        finally:
            alpha.thaw()
        await watch.until(lambda d: names_of(d) == {"alpha", "beta"}, what="alpha back")


@pytest.mark.parametrize("fleet", [ASYNCUA], indirect=True)
async def test_server_not_running_is_unhealthy_then_recovers(fleet: Fleet) -> None:
    assert isinstance(fleet.alpha, TestServer)
    async with DeviceWatch(details(fleet.lds.url)) as watch:
        await watch.until(lambda d: fleet.alpha.url in d, what="alpha")
        await fleet.alpha.set_state(ua.ServerState.Suspended)
        devices = await watch.until(
            lambda d: not d[fleet.alpha.url].health.healthy, what="alpha unhealthy")
        assert devices[fleet.alpha.url].health.reason == "server state is Suspended"
        await fleet.alpha.set_state(ua.ServerState.Running)
        await watch.until(lambda d: d[fleet.alpha.url].health.healthy, what="alpha healthy")


@pytest.mark.parametrize("fleet", [OPEN62541], indirect=True)
async def test_deregistered_server_leaves_the_list(fleet: Fleet) -> None:
    """open62541's LDS drops a server that deregisters (asyncua's keeps every registration, so
    the test is open62541's); the server itself still runs, and is listed again once it
    registers anew (here by its own open62541 registration client, as it restarts)."""
    alpha = fleet.alpha
    assert isinstance(alpha, Open62541Server)
    async with DeviceWatch(details(fleet.lds.url)) as watch:
        await watch.until(lambda d: names_of(d) == {"alpha"}, what="alpha, registered")
        await deregister(fleet.lds.url, application_uri=alpha.application_uri, url=alpha.url)
        await watch.until(lambda d: not d, what="alpha gone once deregistered")
        await alpha.stop()
        await alpha.start()
        await watch.until(lambda d: names_of(d) == {"alpha"}, what="alpha registered again")


async def silence(fleet: Fleet) -> None:
    """The LDS stops answering: an open62541 LDS hangs (SIGSTOP), the asyncua one stops."""
    if isinstance(fleet.lds, Open62541Server):
        fleet.lds.freeze()
    else:
        await fleet.lds.stop()


async def revive(fleet: Fleet) -> None:
    if isinstance(fleet.lds, Open62541Server):
        fleet.lds.thaw()
        return
    await fleet.lds.start()  # a restarted asyncua LDS forgot alpha; alpha registers again
    again = description(0, url=fleet.alpha.url, name="alpha")
    again.ServerUri = fleet.alpha.application_uri
    again.ProductUri = PRODUCT_URIS[fleet.kind]
    await register(fleet.lds.url, [again])


async def test_silent_discovery_server_is_a_warning_not_silence(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery_handlers.opcua")
    async with DeviceWatch(details(fleet.lds.url)) as watch:
        await watch.until(lambda d: names_of(d) == {"alpha"}, what="alpha")
        assert warnings_of(watch.lists[-1]) == ()
        await silence(fleet)
        try:
            await watch.until(lambda d: not d, what="alpha gone with the silent LDS")
            [warning] = warnings_of(watch.lists[-1])
            assert warning.startswith(f"discovery URL {fleet.lds.url}: FindServers failed ("), \
                warning
            assert "not listed until it answers" in warning
            assert any(r.levelno == logging.WARNING and fleet.lds.url in r.getMessage()
                       for r in caplog.records), "the silent LDS is logged as a warning"
        finally:
            await revive(fleet)
        await watch.until(lambda d: names_of(d) == {"alpha"}, what="alpha back with the LDS")
        assert warnings_of(watch.lists[-1]) == (), "the warning ends when the LDS answers"


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
