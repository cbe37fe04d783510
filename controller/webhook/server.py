"""The controller's validating admission webhook: an HTTPS server, the keeper of its certificates.

``WebhookServer.run`` serves reviews (``review``) on a small thread pool; ``CertificateKeeper``
makes and renews the Secret the replicas share (``certs``), reloads TLS when it changed and
keeps the webhook configuration's ``caBundle`` current. docs/architecture.md, "The admission
webhook"."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import datetime
import json
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.core_v1 import Secret

from controller.settings import WebhookSettings
from controller.webhook.certs import Names, TlsState, expiry, plan
from controller.webhook.review import HTTP_BAD_REQUEST, review

log = logging.getLogger(__name__)

VALIDATE_PATH: Final = "/validate"
HEALTH_PATH: Final = "/healthz"
#: Threads judging reviews; parsing is short CPU work, a few threads keep bursts flowing.
REVIEW_WORKERS: Final = 2
#: The largest review body read (the API server caps objects at about 1.5 MiB).
MAX_BODY_BYTES: Final = 4 * 2**20
HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
TLS_SECRET_TYPE: Final = "kubernetes.io/tls"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _decoded(secret: Secret) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _encoded(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in data.items()}


class CertificateKeeper:
    """Keeps the Secret, this replica's TLS context and the ``caBundle`` current."""

    def __init__(self, settings: WebhookSettings, client: AsyncClient) -> None:
        self.settings = settings
        self.client = client
        self.names = Names(dns=settings.dns_names, ips=settings.ip_addresses)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loaded: TlsState | None = None
        self._files = tempfile.TemporaryDirectory(prefix="edgeplug-webhook-")

    async def _read(self) -> tuple[Secret | None, TlsState | None]:
        try:
            secret = await self.client.get(Secret, self.settings.secret,
                                           namespace=self.settings.namespace)
        except ApiError as error:
            if int(error.status.code or 0) == HTTP_NOT_FOUND:
                return None, None
            raise
        return secret, TlsState.from_data(_decoded(secret))

    async def _write(self, secret: Secret | None, state: TlsState) -> bool:
        """Stores ``state``; False when another replica wrote first (read again)."""
        data = _encoded(state.to_data())
        try:
            if secret is None:
                await self.client.create(Secret(
                    metadata=ObjectMeta(name=self.settings.secret,
                                        namespace=self.settings.namespace,
                                        labels={"app.kubernetes.io/part-of": "edgeplug"}),
                    type=TLS_SECRET_TYPE, data=data))
            else:
                secret.data = data
                await self.client.replace(secret)
        except ApiError as error:
            if int(error.status.code or 0) == HTTP_CONFLICT:
                return False
            raise
        return True

    async def ensure_secret(self) -> TlsState:
        """The certificates to serve, renewed and stored first when needed."""
        while True:
            secret, current = await self._read()
            wanted = plan(current, self.names, _now())
            if wanted == current:
                return wanted
            if await self._write(secret, wanted):
                log.info("webhook certificates %s; serving certificate valid until %s",
                         "created" if current is None else "renewed", expiry(wanted.cert))
                return wanted

    def load(self, state: TlsState) -> None:
        """New handshakes use ``state``'s certificate from now on."""
        if state == self.loaded:
            return
        cert = Path(self._files.name) / "tls.crt"
        key = Path(self._files.name) / "tls.key"
        key.touch(mode=0o600)
        key.write_bytes(state.key)
        cert.write_bytes(state.cert)
        self.context.load_cert_chain(cert, key)
        key.unlink()
        self.loaded = state

    async def ensure_ca_bundle(self, state: TlsState) -> bool:
        """Sets every webhook's ``caBundle`` in the configuration; False when it is missing."""
        bundle = base64.b64encode(state.ca_bundle()).decode("ascii")
        try:
            config = await self.client.get(ValidatingWebhookConfiguration,
                                           self.settings.configuration)
        except ApiError as error:
            if int(error.status.code or 0) == HTTP_NOT_FOUND:
                log.warning("ValidatingWebhookConfiguration %s not found: the API server will"
                            " not call the webhook until it is installed",
                            self.settings.configuration)
                return False
            raise
        hooks = config.webhooks or []
        if all(hook.clientConfig.caBundle == bundle for hook in hooks):
            return True
        for hook in hooks:
            hook.clientConfig.caBundle = bundle
        try:
            await self.client.replace(config)
        except ApiError as error:
            if int(error.status.code or 0) == HTTP_CONFLICT:
                return False
            raise
        log.info("caBundle of ValidatingWebhookConfiguration %s updated",
                 self.settings.configuration)
        return True

    async def refresh(self) -> bool:
        """One round: Secret, TLS context, caBundle. True when all is current."""
        state = await self.ensure_secret()
        self.load(state)
        return await self.ensure_ca_bundle(state)

    async def keep(self) -> None:
        """Refreshes forever; an API failure is logged and retried, never fatal."""
        while True:
            try:
                done = await self.refresh()
            except Exception as error:
                log.warning("webhook certificates not refreshed (%s); retrying", error)
                done = False
            settings = self.settings
            await asyncio.sleep(settings.cert_check_interval_s if done else settings.retry_s)

    def close(self) -> None:
        self._files.cleanup()


class WebhookServer:
    """The HTTPS endpoint the API server posts AdmissionReviews to."""

    def __init__(self, settings: WebhookSettings, client: AsyncClient) -> None:
        self.settings = settings
        self.keeper = CertificateKeeper(settings, client)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=REVIEW_WORKERS, thread_name_prefix="webhook")
        self._runner: web.AppRunner | None = None

    async def _validate(self, request: web.Request) -> web.Response:
        try:
            body: Any = json.loads(await request.read())
            loop = asyncio.get_running_loop()
            answer = await loop.run_in_executor(self._pool, self._review, body)
        except ValueError as error:  # not JSON, or not an AdmissionReview: say so, keep serving
            log.warning("bad admission request from %s: %s", request.remote, error)
            return web.Response(status=HTTP_BAD_REQUEST, text=f"{error}\n")
        return web.json_response(answer)

    def _review(self, body: Any) -> dict[str, Any]:
        return review(body, allow_unknown_handlers=self.settings.allow_unknown_handlers)

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def start(self) -> None:
        """Gets a certificate (waiting for the API as long as it takes), then listens."""
        while True:
            try:
                self.keeper.load(await self.keeper.ensure_secret())
                break
            except Exception as error:
                log.warning("webhook certificate not ready (%s); retrying", error)
                await asyncio.sleep(self.settings.retry_s)
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(VALIDATE_PATH, self._validate)
        app.router.add_get(HEALTH_PATH, self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.address, self.settings.port,
                           ssl_context=self.keeper.context)
        await site.start()
        log.info("admission webhook serving https://%s:%d%s", self.settings.address,
                 self.settings.port, VALIDATE_PATH)

    async def run(self) -> None:
        """Serves until cancelled; a port that cannot be bound ends it with the error."""
        try:
            await self.start()
            await self.keeper.keep()
        finally:
            if self._runner is not None:
                with contextlib.suppress(Exception):
                    await self._runner.cleanup()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.keeper.close()
