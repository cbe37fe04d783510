"""Plain REST calls for the controller's hot writes (create and delete), over aiohttp.

``Rest.request`` and ``Rest.stream`` speak to the API server with lightkube's connection and
credentials; a 401 renews them once. Why not lightkube here: docs/architecture.md, "Design
choices".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import aiohttp
import httpx2 as httpx
import msgspec
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import SingleConfig

from controller.metrics import PROCESS
from controller.settings import ApiSettings

log = logging.getLogger(__name__)

HTTP_UNAUTHORIZED: Final = 401
#: The longest line a watch stream may send (one object); aiohttp's default is 64 KiB.
DEFAULT_LINE_LIMIT: Final = 2**22

_encode = msgspec.json.encode


class _Status(msgspec.Struct):
    message: str = ""
    reason: str = ""


_decode_status = msgspec.json.Decoder(_Status).decode


class ApiFailure(Exception):
    """The API server answered with an error status; ``code`` and its ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP {code}: {message}")
        self.code = code
        self.message = message


def status_message(code: int, body: bytes) -> str:
    """The message of a Kubernetes ``Status`` answer (or the start of whatever came)."""
    try:
        status = _decode_status(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return body[:200].decode(errors="replace") or f"HTTP {code}"
    return status.message or status.reason or f"HTTP {code}"


class Rest:
    """JSON requests to the API server of ``config``, through one pooled aiohttp session."""

    def __init__(
        self, config: SingleConfig, *, connections: int, line_limit: int = DEFAULT_LINE_LIMIT,
        settings: ApiSettings | None = None,
    ) -> None:
        #: The API settings (timeouts, watches' timings) of every caller of this client.
        self.settings = settings or ApiSettings()
        self._config = config
        self._server = config.cluster.server.rstrip("/")
        assert config.user is not None, "a kubeconfig context without a user"
        self._ssl = verify_cluster(config.cluster, config.user, config.abs_file)
        self._auth = user_auth(config.user)
        self._connections = connections
        self._line_limit = line_limit
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_s),
                read_bufsize=self._line_limit,
            )
        return self._session

    async def _credentials(self) -> dict[str, str]:
        if self._auth is None:
            return {}
        request = httpx.Request("GET", self._server)
        flow = self._auth.async_auth_flow(request)
        prepared = await flow.__anext__()
        await flow.aclose()
        found = prepared.headers.get("Authorization")
        return {"Authorization": found} if found else {}

    async def request(
        self, method: str, path: str, *, body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """(status code, body) of one request; connection errors are raised as they come."""
        data = _encode(body) if body is not None else None
        session = self._open()
        for attempt in range(2):
            headers = await self._credentials()
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                async with session.request(method, self._server + path, data=data,
                                           headers=headers, params=params) as response:
                    content = await response.read()
                    code = response.status
            except (aiohttp.ClientError, TimeoutError):
                PROCESS.count_no_answer()
                raise
            PROCESS.count_answer(code)
            # The same line httpx logs, so a log counts every request the controller sends.
            log.info('HTTP Request: %s %s "%d"', method, path, code)
            if code == HTTP_UNAUTHORIZED and attempt == 0:
                self._auth = user_auth(self._config.user)  # re-read a rotated token
                continue
            return code, content
        return code, content

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str], read_timeout_s: float
    ) -> AsyncIterator[tuple[int, aiohttp.StreamReader]]:
        """A streaming GET (a watch): its status code and its body, read line by line."""
        session = self._open()
        headers = await self._credentials()
        timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)
        async with session.get(self._server + path, params=params, headers=headers,
                               timeout=timeout) as response:
            log.info('HTTP Request: GET %s "%d"', path, response.status)
            PROCESS.count_answer(response.status)
            if response.status == HTTP_UNAUTHORIZED:
                self._auth = user_auth(self._config.user)  # re-read a rotated token
            yield response.status, response.content

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
