"""A process of simulated ONVIF cameras: WS-Discovery target service plus SOAP services.

It stands in for real IP cameras on a real network. Its WS-Discovery side
answers Probes (multicast on ``239.255.255.250:3702`` and ``[ff02::c]:3702``, or unicast on
any port) with one ProbeMatches per camera, and sends Hello and Bye to the multicast groups as
cameras appear and leave. Its SOAP side is ``onvif_camera_soap``. ``hostile`` adds answers a
broken or malicious peer would send: malformed XML, entity bombs, external entities, 64 KiB
datagrams, and ProbeMatches for message ids nobody sent.

Run as ``python -m tests.harness.onvif_camera CONFIG.json`` (inside a network namespace for
multicast); it prints ``READY`` once listening and takes JSON commands on stdin, one a line:
``{"cmd": "hello"|"bye"|"silence"|"revive"|"fault"|"fault_operations"|"add"|"stats", ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import sys
import uuid as uuid_module
from dataclasses import asdict
from typing import Any

from lxml import etree

from tests.harness.onvif_camera_soap import CameraSpec, Profile, SoapServer

NS_SOAP = "http://www.w3.org/2003/05/soap-envelope"
NS_A = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
NS_D = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
NS_DN = "http://www.onvif.org/ver10/network/wsdl"
GROUP_V4 = "239.255.255.250"
GROUP_V6 = "ff02::c"
WSD_PORT = 3702
#: Longest random delay before a ProbeMatch (WS-Discovery's APP_MAX_DELAY is 0.5 s; shorter
#: here so tests may use a short discoveryTimeoutSeconds).
DEFAULT_MAX_DELAY_S = 0.2
HOSTILE_KINDS = ("malformed", "bomb", "xxe", "oversized", "other_id")


def _envelope(header: str, body: str, *, relates_to: str | None = None) -> bytes:
    relates = f"<a:RelatesTo>{relates_to}</a:RelatesTo>" if relates_to else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{NS_SOAP}" '
        f'xmlns:a="{NS_A}" xmlns:d="{NS_D}" xmlns:dn="{NS_DN}"><s:Header>'
        f"<a:MessageID>urn:uuid:{uuid_module.uuid4()}</a:MessageID>{relates}{header}"
        f"</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def _match_body(camera: CameraSpec, element: str) -> str:
    # deliberately odd spacing between scopes and a second XAddr, as real cameras send
    scopes = "  \n\t".join(camera.scopes)
    xaddrs = f"{camera.xaddr} http://127.0.0.254:1/unreachable"
    return (
        f"<d:{element}><a:EndpointReference><a:Address>urn:uuid:{camera.uuid}</a:Address>"
        f"</a:EndpointReference><d:Types>dn:NetworkVideoTransmitter</d:Types>"
        f"<d:Scopes> {scopes} </d:Scopes><d:XAddrs>{xaddrs}</d:XAddrs>"
        f"<d:MetadataVersion>{camera.metadata_version}</d:MetadataVersion></d:{element}>"
    )


def probe_matches(camera: CameraSpec, relates_to: str) -> bytes:
    body = f"<d:ProbeMatches>{_match_body(camera, 'ProbeMatch')}</d:ProbeMatches>"
    return _envelope(f"<a:Action>{NS_D}/ProbeMatches</a:Action>", body, relates_to=relates_to)


def hello(camera: CameraSpec) -> bytes:
    return _envelope(f"<a:Action>{NS_D}/Hello</a:Action>", _match_body(camera, "Hello"))


def bye(camera: CameraSpec) -> bytes:
    body = (
        f"<d:Bye><a:EndpointReference><a:Address>urn:uuid:{camera.uuid}</a:Address>"
        "</a:EndpointReference></d:Bye>"
    )
    return _envelope(f"<a:Action>{NS_D}/Bye</a:Action>", body)


def hostile_datagrams(kind: str, relates_to: str, decoy: CameraSpec) -> bytes:
    """What a broken or malicious responder sends instead of a ProbeMatches."""
    if kind == "malformed":
        return b"<s:Envelope><unclosed>" + b"\xff\xfe" * 10
    if kind == "bomb":
        entities = "".join(
            f'<!ENTITY e{i} "{("&e" + str(i - 1) + ";") * 10 if i else "boom"}">'
            for i in range(10)
        )
        return f'<?xml version="1.0"?><!DOCTYPE d [{entities}]><d>&e9;</d>'.encode()
    if kind == "xxe":
        return (
            b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            + probe_matches(decoy, relates_to).split(b"?>", 1)[1].replace(
                b"</a:Address>", b"&x;</a:Address>"
            )
        )
    if kind == "oversized":
        padding = "<d:Scopes>" + "x" * (64 * 1024 - 1200) + "</d:Scopes>"
        matches = probe_matches(decoy, relates_to)
        return matches.replace(b"<d:Types>", padding.encode() + b"<d:Types>")
    if kind == "other_id":
        return probe_matches(decoy, f"urn:uuid:{uuid_module.uuid4()}")
    raise ValueError(kind)


def probe_id(data: bytes) -> str | None:
    """The MessageID of a Probe for video transmitters (or for anything), else None."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    try:
        root = etree.fromstring(data, parser=parser)
    except etree.XMLSyntaxError:
        return None
    if root.find(f"{{{NS_SOAP}}}Body/{{{NS_D}}}Probe") is None:
        return None
    found = root.findtext(f"{{{NS_SOAP}}}Header/{{{NS_A}}}MessageID")
    return str(found) if found else None


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, simulator: CameraProcess) -> None:
        self.simulator = simulator
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        message_id = probe_id(data)
        if message_id is None or self.transport is None:
            return
        self.simulator.probes_seen += 1
        loop = asyncio.get_running_loop()
        spread = self.simulator.max_delay_s
        for camera in self.simulator.cameras.values():
            if not camera.silent:
                # each answer after a random delay, as WS-Discovery asks (APP_MAX_DELAY)
                reply = probe_matches(camera, message_id)
                loop.call_later(random.uniform(0, spread), self._send, reply, addr)
        decoy = self.simulator.decoy
        for kind in self.simulator.hostile:
            self.transport.sendto(hostile_datagrams(kind, message_id, decoy), addr)


    def _send(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)


class CameraProcess:
    """Cameras served by this process: WS-Discovery sockets plus one SOAP server."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.cameras = {c["index"]: _spec(c) for c in config["cameras"]}
        self.multicast: bool = config.get("multicast", True)
        self.wsd_bind: str = config.get("wsd_bind", "")
        self.wsd_port: int = config.get("wsd_port", WSD_PORT)
        self.hostile: list[str] = config.get("hostile", [])
        self.decoy = _spec({"index": 9999, "uuid": str(uuid_module.uuid4()), "host": "10.0.0.1"})
        self.http_port: int = config.get("http_port", 8080)
        self.probes_seen = 0
        self.max_delay_s: float = config.get("max_delay_s", DEFAULT_MAX_DELAY_S)
        self._soap = SoapServer(self.cameras, port=self.http_port)
        self._transports: list[asyncio.DatagramTransport] = []
        self._raw: list[socket.socket] = []

    async def start(self) -> None:
        await self._soap.start()
        loop = asyncio.get_running_loop()
        self._raw = self._wsd_sockets()
        for sock in self._raw:
            transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
            self._transports.append(transport)

    def _wsd_sockets(self) -> list[socket.socket]:
        interfaces = [(i, n) for i, n in socket.if_nameindex() if n != "lo"]
        v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        v4.bind((self.wsd_bind or "0.0.0.0", self.wsd_port))
        sockets = [v4]
        if not self.multicast:
            return sockets
        for index, _ in interfaces:
            with contextlib.suppress(OSError):
                v4.setsockopt(
                    socket.IPPROTO_IP,
                    socket.IP_ADD_MEMBERSHIP,
                    struct.pack("4s4si", socket.inet_aton(GROUP_V4), b"\0" * 4, index),
                )
        v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        v6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6.bind(("::", self.wsd_port))
        for index, _ in interfaces:
            with contextlib.suppress(OSError):
                v6.setsockopt(
                    socket.IPPROTO_IPV6,
                    socket.IPV6_JOIN_GROUP,
                    struct.pack("16sI", socket.inet_pton(socket.AF_INET6, GROUP_V6), index),
                )
        sockets.append(v6)
        return sockets

    def announce(self, message: bytes) -> None:
        """Send a Hello or Bye to both multicast groups on every interface."""
        for sock in self._raw if self.multicast else []:
            for index, _ in [(i, n) for i, n in socket.if_nameindex() if n != "lo"]:
                with contextlib.suppress(OSError):
                    if sock.family == socket.AF_INET:
                        sock.setsockopt(
                            socket.IPPROTO_IP,
                            socket.IP_MULTICAST_IF,
                            struct.pack("4s4si", b"\0" * 4, b"\0" * 4, index),
                        )
                        sock.sendto(message, (GROUP_V4, WSD_PORT))
                    else:
                        sock.sendto(message, (GROUP_V6, WSD_PORT, 0, index))

    def command(self, line: dict[str, Any]) -> dict[str, Any]:
        cmd = line["cmd"]
        if cmd == "add":
            camera = _spec(line["camera"])
            self.cameras[camera.index] = camera
            self.announce(hello(camera))
            return {"ok": True}
        if cmd == "stats":
            return {"probes_seen": self.probes_seen}
        camera = next(c for c in self.cameras.values() if c.uuid == line["uuid"])
        if cmd == "hello":
            camera.silent = False
            self.announce(hello(camera))
        elif cmd == "bye":
            camera.silent = True
            self.announce(bye(camera))
        elif cmd == "silence":
            camera.silent = True
        elif cmd == "revive":
            camera.silent = False
        elif cmd == "fault":
            camera.fault = line["fault"]
        elif cmd == "fault_operations":
            camera.faulted_operations = list(line["operations"])
        else:
            raise ValueError(cmd)
        return {"ok": True}

    async def close(self) -> None:
        for transport in self._transports:
            transport.close()
        await self._soap.close()


def _spec(raw: dict[str, Any]) -> CameraSpec:
    fields = dict(raw)
    fields["profiles"] = [Profile(**p) for p in raw.get("profiles", [])]
    return CameraSpec(**fields)


def spec_json(camera: CameraSpec) -> dict[str, Any]:
    return asdict(camera)


async def _main(config: dict[str, Any]) -> None:
    process = CameraProcess(config)
    await process.start()
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            if line.strip():
                print(json.dumps(process.command(json.loads(line))), flush=True)
    finally:
        await process.close()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as handle:
        asyncio.run(_main(json.load(handle)))
