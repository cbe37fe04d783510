"""The ONVIF benchmark's floor: what the simulated cameras take to answer a bare client.

The handler's time to a complete list of 200 cameras means little on a shared
machine without the time the simulator itself needs to answer the same questions. This process
(run in the handler's namespace, ``python -m tests.harness.onvif_floor CONFIG.json`` with
``{"cameras": N, "within_s": S}``) sends one WS-Discovery Probe to the IPv4 group from the
handler's address, collects ProbeMatches until N distinct cameras answered, and asks each one
``GetDeviceInformation`` over plain HTTP (as many at once as the handler's scanner allows). It
prints one JSON line: ``probe_s`` (Probe sent → the N-th ProbeMatch), ``seconds`` (Probe sent →
the last answer) and ``answered``. No retries, no parsing beyond finding each camera's address.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import uuid as uuid_module
from typing import Any

import aiohttp
from lxml import etree

from discovery_handlers.onvif.scanner import MAX_CONCURRENT_CHECKS
from tests.harness.onvif_camera import GROUP_V4, NS_A, NS_D, NS_SOAP, WSD_PORT
from tests.harness.onvif_netns import HANDLER_V4

NS_TDS = "http://www.onvif.org/ver10/device/wsdl"
GET_DEVICE_INFORMATION = (
    f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{NS_SOAP}" '
    f'xmlns:tds="{NS_TDS}"><s:Body><tds:GetDeviceInformation/></s:Body></s:Envelope>'
).encode()


def probe(message_id: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{NS_SOAP}" '
        f'xmlns:a="{NS_A}" xmlns:d="{NS_D}"><s:Header><a:MessageID>{message_id}</a:MessageID>'
        "<a:To>urn:schemas-xmlsoap-org:ws:2005:04:discovery</a:To>"
        f"<a:Action>{NS_D}/Probe</a:Action></s:Header><s:Body><d:Probe/></s:Body></s:Envelope>"
    ).encode()


def first_xaddr(data: bytes) -> str | None:
    """The first XAddr of a ProbeMatches datagram."""
    root = etree.fromstring(data, parser=etree.XMLParser(resolve_entities=False, no_network=True))
    found = root.findtext(f".//{{{NS_D}}}XAddrs")
    return found.split()[0] if found else None


async def collect_matches(count: int, within_s: float) -> tuple[float, list[str]]:
    """Send one Probe; the seconds to the ``count``-th distinct camera and their addresses."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(HANDLER_V4))
    sock.bind((HANDLER_V4, 0))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    xaddrs: set[str] = set()
    started = time.monotonic()
    try:
        await loop.sock_sendto(sock, probe(f"urn:uuid:{uuid_module.uuid4()}"),
                               (GROUP_V4, WSD_PORT))
        async with asyncio.timeout(within_s):
            while len(xaddrs) < count:
                data = await loop.sock_recv(sock, 65536)
                xaddr = first_xaddr(data)
                if xaddr:
                    xaddrs.add(xaddr)
    finally:
        sock.close()
    return time.monotonic() - started, sorted(xaddrs)


async def describe_all(xaddrs: list[str]) -> int:
    """GetDeviceInformation on every camera; how many answered 200."""
    connector = aiohttp.TCPConnector(limit=MAX_CONCURRENT_CHECKS)
    headers = {"Content-Type": "application/soap+xml; charset=utf-8"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(url: str) -> bool:
            async with session.post(url, data=GET_DEVICE_INFORMATION, headers=headers) as reply:
                await reply.read()
                return reply.status == 200

        return sum(await asyncio.gather(*(one(url) for url in xaddrs)))


async def main(config: dict[str, Any]) -> None:
    started = time.monotonic()
    probe_s, xaddrs = await collect_matches(int(config["cameras"]), float(config["within_s"]))
    answered = await describe_all(xaddrs)
    print(json.dumps({"probe_s": probe_s, "seconds": time.monotonic() - started,
                      "answered": answered}), flush=True)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        asyncio.run(main(json.load(handle)))
