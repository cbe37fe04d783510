"""``edgeplug discover`` against a real asyncua server, as a user runs it: a subprocess, no
cluster. It lists the server with its properties and health, refuses bad details naming the
field (exit 2), and with ``--watch`` shows the server turning unhealthy and back."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from asyncua import ua

from crds.naming import instance_name
from tests.harness.controller_process import configuration_file
from tests.harness.opcua_servers import TestServer

pytestmark = pytest.mark.asyncio(loop_scope="module")
LINE_DEADLINE_S = 30.0  # the first list comes in well under a second


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[TestServer]:
    async with TestServer("press-4") as running:
        yield running


def configuration(path: Path, details: str) -> Path:
    return configuration_file(path, "presses", "opcua", details)


def details(url: str) -> str:
    return (f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n"
            "discoveryIntervalSeconds: 0.2\n")


async def discover(cfg: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "discover", "-f", str(cfg), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def finished(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), LINE_DEADLINE_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_discover_lists_the_server(server: TestServer, tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", details(server.url))
    code, out, err = await finished(await discover(cfg, "-o", "json"))
    assert code == 0, err
    listing: dict[str, Any] = json.loads(out)
    assert listing["shared"] is True
    [device] = listing["devices"]
    assert device["id"] == server.url
    assert device["instance"] == instance_name("presses", server.url, shared=True, node="any")
    assert device["healthy"] is True
    assert device["properties"]["OPCUA_DISCOVERY_URL"] == server.url
    assert device["properties"]["OPCUA_APPLICATION_NAME"] == "press-4"


async def test_discover_refuses_bad_details_naming_the_field(tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", "opcuaDiscoveryMethod:\n  standard:\n"
                                             "    discoveryUrls: ['http://plc:80/']\n")
    code, _, err = await finished(await discover(cfg))
    assert code == 2
    assert "opcuaDiscoveryMethod.standard.discoveryUrls[0]" in err
    assert "opc.tcp://" in err


async def test_discover_watch_shows_a_state_change(server: TestServer, tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", details(server.url))
    process = await discover(cfg, "--watch", "-o", "json")
    stdout = process.stdout
    assert stdout is not None

    async def health() -> list[tuple[bool, str]]:
        line = await asyncio.wait_for(stdout.readline(), LINE_DEADLINE_S)
        return [(d["healthy"], d["reason"]) for d in json.loads(line)["devices"]]

    try:
        assert await health() == [(True, "")]
        await server.set_state(ua.ServerState.Suspended)
        assert await health() == [(False, "server state is Suspended")]
        await server.set_state(ua.ServerState.Running)
        assert await health() == [(True, "")]
    finally:
        process.kill()
        await process.wait()
        await server.set_state(ua.ServerState.Running)
