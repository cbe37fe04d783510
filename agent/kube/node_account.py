"""This node's own identity for reading the Secrets and ConfigMaps its Configurations name.

``NodeAccount`` creates the ServiceAccount ``node-<node>`` if missing and keeps a Node-bound token
for it in a file only this process reads, renewed before it expires. Why: deploy/README.md,
"Secrets and ConfigMaps".
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import User
from lightkube.resources.core_v1 import Node, ServiceAccount

from agent.kube.client import counted_client, is_conflict, with_user
from agent.settings import current

log = logging.getLogger(__name__)

#: The account of node N: ``node-<N>`` (a node name longer than 248 characters has none).
ACCOUNT_PREFIX: Final = "node-"
RENEW_AT: Final = 0.75


class NodeAccountUnavailable(Exception):
    """The account cannot be made or minted."""


def account_name(node: str) -> str:
    return f"{ACCOUNT_PREFIX}{node}"


class NodeAccount:
    """The node's account: ``run`` makes it and keeps its token current, ``client`` reads as
    it once ``ready`` is set; ``close`` at the end."""

    def __init__(self, own: AsyncClient, *, base: KubeConfig, namespace: str, node: str) -> None:
        self._own = own
        self._namespace = namespace
        self._account = account_name(node)
        self._folder = Path(tempfile.mkdtemp(prefix="edgeplug-node-account-"))
        self._token_file = self._folder / "token"
        self._expires = datetime.now(UTC)
        self._node = node
        self._node_uid: str | None = None
        #: Set once the first token is there: reads before it would go without one.
        self.ready = asyncio.Event()
        self.client = counted_client(with_user(base, User(token_file=str(self._token_file))))

    async def start(self) -> None:
        """Read the Node's uid, make the account if missing, and get its first token."""
        found = await self._own.get(Node, self._node)
        self._node_uid = found.metadata.uid if found.metadata else None
        try:
            await self._own.create(cast(ServiceAccount, ServiceAccount.from_dict({
                "metadata": {"name": self._account, "namespace": self._namespace,
                             "labels": {"app.kubernetes.io/part-of": "edgeplug"}},
                "automountServiceAccountToken": False})))
            log.info("made this node's account %s/%s", self._namespace, self._account)
        except ApiError as error:
            if not is_conflict(error):
                raise NodeAccountUnavailable(
                    f"cannot make {self._namespace}/{self._account}: {error.status.message}"
                ) from error
        await self._renew()

    async def run(self) -> None:
        """``start``, retried until it works, then renew the token forever."""
        while True:
            try:
                await self.start()
                break
            except Exception as error:  # the API server away, a refusal: keep trying
                message = error.status.message if isinstance(error, ApiError) else str(error)
                log.error("this node's account for Secret reads is unavailable (%s); Secrets"
                          " and ConfigMaps Configurations name cannot be read; retrying in"
                          " %.0f s", message, current().api.node_account_retry_s)
                await asyncio.sleep(current().api.node_account_retry_s)
        await self._renew_forever()

    async def _renew_forever(self) -> None:
        while True:
            left = (self._expires - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(max(left - current().api.node_token_s * (1 - RENEW_AT), 0.0))
            try:
                await self._renew()
            except Exception as error:  # the API server away: the token has a quarter left
                log.warning("renewing this node's account token failed (%s); retrying", error)
                await asyncio.sleep(current().api.node_account_retry_s)

    async def close(self) -> None:
        await self.client.close()
        self._token_file.unlink(missing_ok=True)
        self._folder.rmdir()

    async def _renew(self) -> None:
        if self._node_uid is None:
            raise NodeAccountUnavailable(f"node {self._node} has no uid")
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "metadata": {"name": self._account, "namespace": self._namespace},
                   "spec": {"expirationSeconds": current().api.node_token_s,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Node",
                                               "name": self._node, "uid": self._node_uid}}}
        answer = await self._own.create(
            cast(Any, ServiceAccount.Token.from_dict(request)), self._account,
            namespace=self._namespace)
        token, expires = answer.status.token, answer.status.expirationTimestamp
        fd = os.open(self._token_file.with_suffix(".new"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token)
        os.replace(self._token_file.with_suffix(".new"), self._token_file)
        self._expires = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
        self.ready.set()
