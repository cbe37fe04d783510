"""An HTTP server on loopback that answers ONVIF SOAP requests with recorded camera replies.

The corpus under ``tests/data/onvif/soap`` holds the shapes real cameras'
replies take (reconstructed from public sources, see its README). This server plays them back
to the handler's real SOAP client: each request's operation (the first element of its SOAP
Body) names the file ``<Operation>.xml``; the camera's address in a reply
(``http://192.0.2.10/``) becomes the server's own, so XAddrs point back here. ``locked``
makes it refuse every request without a WS-Security header the way a given camera does
(HTTP status, body file, content type), as cameras that lock even GetSystemDateAndTime do.

A camera of its own (``corpus``: a folder of the corpus searched before the generic camera's
files) answers with its replies; ``answers`` serves another recorded reply to one profile's
request (a camera faulting GetStreamUri for some profiles); ``cuts`` serves a recorded reply
cut at a byte offset (a reply lost mid-way, as a dropped connection or a full buffer leaves
it). ``{ProfileToken}`` in a reply stands for the token the request named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from aiohttp import web
from lxml import etree

CORPUS = Path(__file__).resolve().parents[1] / "data" / "onvif" / "soap"
CAMERA_BASE = "http://192.0.2.10/"
NS_WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
SOAP_TYPE = "application/soap+xml; charset=utf-8"
DIGEST_CHALLENGE = 'Digest realm="IP Camera", nonce="0123456789abcdef", qop="auth"'


@dataclass(frozen=True)
class Refusal:
    """How a camera refuses an unauthenticated request."""

    status: int
    file: str
    content_type: str = SOAP_TYPE


def recorded(name: str, corpus: Path = CORPUS) -> bytes:
    """The recorded bytes of one reply, as the corpus holds them."""
    return (corpus / name).read_bytes()


@dataclass
class ReplayCamera:
    port: int
    locked: Refusal | None = None
    #: where the replies are looked for, first folder first
    corpus: tuple[Path, ...] = (CORPUS,)
    #: operation -> the byte offset its recorded reply is cut at
    cuts: dict[str, int] = field(default_factory=dict)
    #: (operation, ProfileToken of the request) -> the reply served instead of the usual one
    answers: dict[tuple[str, str], Refusal] = field(default_factory=dict)
    #: operations asked, in order, with whether they were signed
    asked: list[tuple[str, bool]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def xaddr(self) -> str:
        return f"{self.base}onvif/device_service"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/onvif/{service}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        root = etree.fromstring(await request.read(), parser=parser)
        body = next(child for child in root if etree.QName(child).localname == "Body")
        operation = etree.QName(body[0]).localname
        signed = root.find(f".//{{{NS_WSSE}}}Security") is not None
        self.asked.append((operation, signed))
        if self.locked is not None and not signed:
            return self._file(self.locked.file, self.locked.status, self.locked.content_type)
        token = next((el.text or "" for el in body.iter() if isinstance(el.tag, str)
                      and etree.QName(el).localname == "ProfileToken"), "")
        answer = self.answers.get((operation, token))
        if answer is not None:
            return self._file(answer.file, answer.status, answer.content_type, token=token)
        return self._file(f"{operation}.xml", 200, SOAP_TYPE, token=token,
                          cut=self.cuts.get(operation))

    def _file(
        self, name: str, status: int, content_type: str, *, token: str = "",
        cut: int | None = None,
    ) -> web.Response:
        folder = next((path for path in self.corpus if (path / name).exists()), CORPUS)
        data = recorded(name, folder)[:cut]
        text = data.decode("utf-8", errors="surrogateescape").replace(CAMERA_BASE, self.base)
        text = text.replace("{ProfileToken}", escape(token))
        headers = {"Content-Type": content_type}
        if status == 401 and content_type.startswith("text/html"):
            headers["WWW-Authenticate"] = DIGEST_CHALLENGE
        body = text.encode("utf-8", errors="surrogateescape")
        return web.Response(status=status, body=body, headers=headers)
