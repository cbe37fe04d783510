"""Simulated ONVIF cameras' SOAP side: device and media services over HTTP/1.1, with digest auth.

No camera can be plugged into CI. This stands in for a real ONVIF Profile S
camera's device service (``GetSystemDateAndTime``, ``GetDeviceInformation``,
``GetNetworkInterfaces``, ``GetCapabilities``) and media service (``GetProfiles``,
``GetStreamUri``), speaking SOAP 1.2 as cameras do and checking WS-Security UsernameToken
PasswordDigest the way the ONVIF core specification describes. One asyncio server serves any
number of cameras (one path each), so 200 cameras cost one process. ``fault`` makes a camera
hostile or broken: SOAP faults, garbage, entity bombs, external entities, huge or trickled
replies, silence, or a closed connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
from dataclasses import dataclass, field

from lxml import etree

NS_SOAP = "http://www.w3.org/2003/05/soap-envelope"
NS_WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
NS_WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
NS_TDS = "http://www.onvif.org/ver10/device/wsdl"
NS_TRT = "http://www.onvif.org/ver10/media/wsdl"
NS_TT = "http://www.onvif.org/ver10/schema"
NS_TER = "http://www.onvif.org/ver10/error"
MAX_REQUEST_BYTES = 256 * 1024
HEADER_LIMIT_BYTES = 16 * 1024
TRICKLE_INTERVAL_S = 1.0  # the "trickle" fault sends one byte this often
FAULTS = ("soap_fault", "garbage", "bomb", "xxe", "huge", "trickle", "silent", "no_soap")
UNAUTHENTICATED_OPERATIONS = frozenset({"GetSystemDateAndTime"})


@dataclass
class Profile:
    token: str
    name: str
    uri: str  # may carry user:password@, as some cameras do


@dataclass
class CameraSpec:
    """One simulated camera; ``index`` names its path ``/onvif/<index>/``."""

    index: int
    uuid: str
    host: str  # the address its XAddrs name
    port: int = 8080
    scopes: list[str] = field(default_factory=list)
    mac: str = "02:00:00:00:00:01"
    manufacturer: str = "SimCam"
    model: str = "SC-1"
    firmware: str = "1.0.0"
    profiles: list[Profile] = field(default_factory=list)
    username: str | None = None  # None: no authentication required
    password: str = ""
    #: demands credentials even for GetSystemDateAndTime (ONVIF says it must be open; some
    #: deployed cameras and third-party implementations lock it too)
    clock_auth: bool = False
    fault: str | None = None  # one of FAULTS
    #: operations answered with a SOAP fault (as a firmware that lacks one does), the rest as usual
    faulted_operations: list[str] = field(default_factory=list)
    silent: bool = False  # answers neither probes nor SOAP (unplugged)
    metadata_version: int = 1

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/onvif/{self.index}"

    @property
    def xaddr(self) -> str:
        return f"{self.base}/device_service"


def envelope(body: str, *, extra_ns: str = "") -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<s:Envelope xmlns:s="{NS_SOAP}" xmlns:tds="{NS_TDS}" xmlns:trt="{NS_TRT}" '
        f'xmlns:tt="{NS_TT}" xmlns:ter="{NS_TER}"{extra_ns}><s:Body>{body}</s:Body></s:Envelope>'
    ).encode()


def fault(subcode: str, text: str) -> bytes:
    return envelope(
        "<s:Fault><s:Code><s:Value>s:Sender</s:Value>"
        f"<s:Subcode><s:Value>{subcode}</s:Value></s:Subcode></s:Code>"
        f'<s:Reason><s:Text xml:lang="en">{text}</s:Text></s:Reason></s:Fault>'
    )


def digest_ok(security: etree._Element | None, username: str, password: str) -> bool:
    """WS-Security UsernameToken PasswordDigest: Base64(SHA-1(nonce + created + password))."""
    if security is None:
        return False
    token = security.find(f"{{{NS_WSSE}}}UsernameToken")
    if token is None:
        return False
    user = token.findtext(f"{{{NS_WSSE}}}Username")
    given = token.findtext(f"{{{NS_WSSE}}}Password") or ""
    nonce = token.findtext(f"{{{NS_WSSE}}}Nonce") or ""
    created = token.findtext(f"{{{NS_WSU}}}Created") or ""
    try:
        raw_nonce = base64.b64decode(nonce)
    except ValueError:
        return False
    expected = base64.b64encode(
        hashlib.sha1(raw_nonce + created.encode() + password.encode()).digest()
    ).decode()
    return user == username and given == expected


class SoapResponder:
    """Answers one SOAP request for the cameras it knows (by path)."""

    def __init__(self, cameras: dict[int, CameraSpec]) -> None:
        self.cameras = cameras

    def answer(self, camera: CameraSpec, body: bytes) -> tuple[int, bytes]:
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        try:
            root = etree.fromstring(body, parser=parser)
        except etree.XMLSyntaxError:
            return 400, fault("ter:WellFormed", "not XML")
        request = root.find(f"{{{NS_SOAP}}}Body")
        if request is None or len(request) == 0:
            return 400, fault("ter:WellFormed", "no body")
        operation = etree.QName(request[0]).localname
        if camera.fault == "soap_fault" or operation in camera.faulted_operations:
            return 500, fault("ter:ActionNotSupported", "simulated fault")
        open_to_all = operation in UNAUTHENTICATED_OPERATIONS and not camera.clock_auth
        if camera.username is not None and not open_to_all:
            header = root.find(f"{{{NS_SOAP}}}Header")
            security = header.find(f"{{{NS_WSSE}}}Security") if header is not None else None
            if not digest_ok(security, camera.username, camera.password):
                return 400, fault("ter:NotAuthorized", "Sender not Authorized")
        handler = getattr(self, f"_{operation}", None)
        if handler is None:
            return 400, fault("ter:ActionNotSupported", operation)
        return 200, envelope(handler(camera, request[0]))

    def _GetSystemDateAndTime(self, camera: CameraSpec, request: etree._Element) -> str:
        now = dt.datetime.now(dt.UTC)
        return (
            "<tds:GetSystemDateAndTimeResponse><tds:SystemDateAndTime>"
            "<tt:DateTimeType>NTP</tt:DateTimeType><tt:DaylightSavings>false</tt:DaylightSavings>"
            "<tt:UTCDateTime>"
            f"<tt:Time><tt:Hour>{now.hour}</tt:Hour><tt:Minute>{now.minute}</tt:Minute>"
            f"<tt:Second>{now.second}</tt:Second></tt:Time>"
            f"<tt:Date><tt:Year>{now.year}</tt:Year><tt:Month>{now.month}</tt:Month>"
            f"<tt:Day>{now.day}</tt:Day></tt:Date>"
            "</tt:UTCDateTime></tds:SystemDateAndTime></tds:GetSystemDateAndTimeResponse>"
        )

    def _GetDeviceInformation(self, camera: CameraSpec, request: etree._Element) -> str:
        return (
            "<tds:GetDeviceInformationResponse>"
            f"<tds:Manufacturer>{camera.manufacturer}</tds:Manufacturer>"
            f"<tds:Model>{camera.model}</tds:Model>"
            f"<tds:FirmwareVersion>{camera.firmware}</tds:FirmwareVersion>"
            f"<tds:SerialNumber>SN{camera.index:05d}</tds:SerialNumber>"
            "<tds:HardwareID>sim</tds:HardwareID></tds:GetDeviceInformationResponse>"
        )

    def _GetNetworkInterfaces(self, camera: CameraSpec, request: etree._Element) -> str:
        return (
            '<tds:GetNetworkInterfacesResponse><tds:NetworkInterfaces token="eth0">'
            "<tt:Enabled>true</tt:Enabled><tt:Info><tt:Name>eth0</tt:Name>"
            f"<tt:HwAddress>{camera.mac}</tt:HwAddress><tt:MTU>1500</tt:MTU></tt:Info>"
            "</tds:NetworkInterfaces></tds:GetNetworkInterfacesResponse>"
        )

    def _GetCapabilities(self, camera: CameraSpec, request: etree._Element) -> str:
        return (
            "<tds:GetCapabilitiesResponse><tds:Capabilities><tt:Media>"
            f"<tt:XAddr>{camera.base}/media_service</tt:XAddr>"
            "<tt:StreamingCapabilities><tt:RTPMulticast>false</tt:RTPMulticast>"
            "<tt:RTP_TCP>true</tt:RTP_TCP><tt:RTP_RTSP_TCP>true</tt:RTP_RTSP_TCP>"
            "</tt:StreamingCapabilities></tt:Media></tds:Capabilities>"
            "</tds:GetCapabilitiesResponse>"
        )

    def _GetProfiles(self, camera: CameraSpec, request: etree._Element) -> str:
        profiles = "".join(
            f'<trt:Profiles token="{p.token}" fixed="true"><tt:Name>{p.name}</tt:Name>'
            "</trt:Profiles>"
            for p in camera.profiles
        )
        return f"<trt:GetProfilesResponse>{profiles}</trt:GetProfilesResponse>"

    def _GetStreamUri(self, camera: CameraSpec, request: etree._Element) -> str:
        token = request.findtext(f"{{{NS_TRT}}}ProfileToken")
        for profile in camera.profiles:
            if profile.token == token:
                uri = profile.uri.replace("&", "&amp;")
                return (
                    f"<trt:GetStreamUriResponse><trt:MediaUri><tt:Uri>{uri}</tt:Uri>"
                    "<tt:InvalidAfterConnect>false</tt:InvalidAfterConnect>"
                    "<tt:InvalidAfterReboot>false</tt:InvalidAfterReboot>"
                    "<tt:Timeout>PT0S</tt:Timeout></trt:MediaUri></trt:GetStreamUriResponse>"
                )
        return "<trt:GetStreamUriResponse/>"


BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + b"".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'.encode()
        for i in range(1, 10)
    )
    + b']><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body>&lol9;'
    b"</s:Body></s:Envelope>"
)
XXE = (
    b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body>&x;</s:Body>'
    b"</s:Envelope>"
)


class SoapServer:
    """HTTP/1.1 on one port for every camera of this process (keep-alive, Content-Length)."""

    def __init__(self, cameras: dict[int, CameraSpec], *, port: int) -> None:
        self.responder = SoapResponder(cameras)
        self.port = port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, host=None, port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > HEADER_LIMIT_BYTES:
            return False
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }
        length = min(int(headers.get("content-length", "0") or 0), MAX_REQUEST_BYTES)
        body = await reader.readexactly(length)
        camera = self._camera_for(path)
        if camera is None:
            await self._respond(writer, 404, b"no such camera")
            return True
        if camera.silent or camera.fault == "silent":
            await asyncio.Event().wait()  # hold the connection open, answer nothing
        if camera.fault == "no_soap":
            return False
        if camera.fault == "trickle":
            await self._trickle(writer)
            return False
        status, reply = self._hostile_reply(camera) or self.responder.answer(camera, body)
        await self._respond(writer, status, reply)
        return headers.get("connection", "").lower() != "close"

    def _camera_for(self, path: str) -> CameraSpec | None:
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "onvif" and parts[1].isdigit():
            return self.responder.cameras.get(int(parts[1]))
        return None

    @staticmethod
    def _hostile_reply(camera: CameraSpec) -> tuple[int, bytes] | None:
        if camera.fault == "garbage":
            return 200, b"\x00\xffthis is not xml <<<"
        if camera.fault == "bomb":
            return 200, BOMB
        if camera.fault == "xxe":
            return 200, XXE
        if camera.fault == "huge":
            return 200, envelope("<x>" + "A" * (4 * 1024 * 1024) + "</x>")
        return None

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
        writer.write(
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
            "Content-Type: application/soap+xml; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    @staticmethod
    async def _trickle(writer: asyncio.StreamWriter) -> None:
        body = envelope("<tds:GetSystemDateAndTimeResponse/>")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/soap+xml\r\n")
        writer.write(f"Content-Length: {len(body)}\r\n\r\n".encode())
        with contextlib.suppress(ConnectionError):
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(TRICKLE_INTERVAL_S)
