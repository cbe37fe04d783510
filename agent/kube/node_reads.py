"""The agent's reads of what concerns its node alone (its pods, the claims the kubelet asks it to
prepare), made as the kubelet when the kubelet's client certificate is given.

``node_reads`` builds a ``NodeReads`` whose ``client`` follows the kubelet's certificate rotation.
Why and the trade-off: deploy/README.md, "What a node's agent can do".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import User

from agent.kube.client import counted_client, with_user

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubeletCertificate:
    """The kubelet's client certificate and key (one PEM file holds both when ``key`` is
    None, as the kubelet's rotated ``kubelet-client-current.pem`` does)."""

    cert: Path
    key: Path | None = None

    def stamp(self) -> tuple[tuple[int, int, int], ...]:
        """What changes when the kubelet rotates the files (links followed)."""
        found = []
        for path in (self.cert, self.key or self.cert):
            info = os.stat(path)
            found.append((info.st_dev, info.st_ino, info.st_mtime_ns))
        return tuple(found)


def kubelet_config(base: KubeConfig, certificate: KubeletCertificate) -> KubeConfig:
    """The cluster of ``base`` (server and CA, the agent's own), with the kubelet as user."""
    return with_user(base, User(client_cert=str(certificate.cert),
                                client_key=str(certificate.key or certificate.cert)))


class NodeReads:
    """The client for this node's own reads: the kubelet's when its certificate is given
    (``as_kubelet``), else the agent's own (``NodeReads(own)``)."""

    def __init__(self, own: AsyncClient) -> None:
        self._own = own
        self._kubelet: tuple[KubeConfig, KubeletCertificate] | None = None
        self._client: AsyncClient | None = None
        self._stamp: tuple[tuple[int, int, int], ...] = ()
        #: Who reads, for what an error says.
        self.identity = "the agent's own token"

    @classmethod
    def as_kubelet(cls, own: AsyncClient, *, base: KubeConfig,
                   certificate: KubeletCertificate, node_name: str) -> NodeReads:
        reads = cls(own)
        reads._kubelet = (base, certificate)
        reads.identity = f"system:node:{node_name} (the kubelet's certificate)"
        return reads

    async def client(self) -> AsyncClient:
        """The client to read with now (a new one after the kubelet rotated its files)."""
        if self._kubelet is None:
            return self._own
        base, certificate = self._kubelet
        stamp = certificate.stamp()
        if self._client is None or stamp != self._stamp:
            if self._client is not None:
                log.info("the kubelet's client certificate changed; reading with the new one",
                         extra={"certificate": str(certificate.cert)})
                await self._client.close()
            self._client = counted_client(kubelet_config(base, certificate))
            self._stamp = stamp
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def node_reads(*, own: AsyncClient, base: KubeConfig, node_name: str,
               cert: Path | None, key: Path | None) -> NodeReads:
    """``NodeReads`` as the settings ask; a certificate asked for but missing is said once,
    and the reads then go with the agent's own token (which the default rights lack)."""
    if cert is None:
        log.info("this node's pods and claims are read with the agent's own token "
                 "(KUBELET_CLIENT_CERT is empty)")
        return NodeReads(own)
    missing = [str(p) for p in (cert, key) if p is not None and not p.exists()]
    if missing:
        log.error("the kubelet's client certificate is missing: this node's pods and claims "
                  "are read with the agent's own token, which deploy/manifests and deploy/dra "
                  "do not grant, so those reads are refused until KUBELET_CLIENT_CERT names "
                  "the file (or is empty and the token is granted them: deploy/README.md)",
                  extra={"missing": missing})
        return NodeReads(own)
    log.info("this node's pods and claims are read as the kubelet",
             extra={"certificate": str(cert), "node": node_name})
    return NodeReads.as_kubelet(own, base=base, certificate=KubeletCertificate(cert, key),
                                node_name=node_name)
