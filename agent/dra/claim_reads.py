"""Where the DRA plugin reads the claims the kubelet asks it to prepare: as the kubelet, with
the kubelet's own client certificate, or with the agent's token.

Why this exists: ``NodePrepareResources`` names a claim (namespace, name, uid) and nothing of
its allocation, so the plugin must read it. RBAC can grant the agent's token ``get`` on claims
only cluster-wide; the Node authorizer lets a kubelet get exactly the claims of the pods bound
to its node, which are the ones it asks for. So with ``KUBELET_CLIENT_CERT`` the reads go as
``system:node:<node>``, and the agent's token needs no claim right at all (deploy/README.md,
"What a node's agent can do", has the trade-off). A kubelet rotates its certificate by
pointing ``kubelet-client-current.pem`` at a new file; each read looks whether the file
changed and, if so, reads with a client of the new one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.generic_resource import create_namespaced_resource

from agent.kube import as_dict, counted_client

log = logging.getLogger(__name__)

ResourceClaimResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)


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
    single = base.get()
    if single is None:
        raise ValueError("the agent's kubeconfig names no current context")
    cluster = single.cluster
    ca = cluster.certificate_auth
    return KubeConfig.from_one(
        cluster=Cluster(server=cluster.server,
                        certificate_auth=str(single.abs_file(ca)) if ca else None,
                        certificate_auth_data=cluster.certificate_auth_data,
                        insecure=cluster.insecure),
        user=User(client_cert=str(certificate.cert),
                  client_key=str(certificate.key or certificate.cert)))


class ClaimReads:
    """Reads one claim by name, as the kubelet when its certificate is given, else with the
    agent's own client."""

    def __init__(self, *, own: AsyncClient, base: KubeConfig | None = None,
                 kubelet: KubeletCertificate | None = None, node_name: str = "") -> None:
        self._own = own
        self._base = base
        self._kubelet = kubelet
        self._client: AsyncClient | None = None
        self._stamp: tuple[tuple[int, int, int], ...] = ()
        self.identity = (f"system:node:{node_name} (the kubelet's certificate)"
                         if kubelet is not None else "the agent's own token")

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as the API server has it; its ``ApiError`` (a refusal too) passes up."""
        client = await self._current()
        return as_dict(await client.get(ResourceClaimResource, name, namespace=namespace))

    async def _current(self) -> AsyncClient:
        if self._kubelet is None or self._base is None:
            return self._own
        stamp = self._kubelet.stamp()
        if self._client is None or stamp != self._stamp:
            if self._client is not None:
                log.info("the kubelet's client certificate changed; reading claims with the "
                         "new one", extra={"certificate": str(self._kubelet.cert)})
                await self._client.close()
            self._client = counted_client(kubelet_config(self._base, self._kubelet))
            self._stamp = stamp
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def claim_reads(*, own: AsyncClient, base: KubeConfig, node_name: str,
                cert: Path | None, key: Path | None) -> ClaimReads:
    """``ClaimReads`` as the settings ask; a certificate asked for but missing is said once,
    and claims are then read with the agent's own token (which the default rights lack)."""
    if cert is None:
        log.info("claims are read with the agent's own token (KUBELET_CLIENT_CERT is empty)")
        return ClaimReads(own=own)
    missing = [str(p) for p in (cert, key) if p is not None and not p.exists()]
    if missing:
        log.error("the kubelet's client certificate is missing: claims are read with the "
                  "agent's own token, which deploy/dra does not grant, so each prepare fails "
                  "with the API server's refusal until KUBELET_CLIENT_CERT names the file "
                  "(or is empty and the token is granted claim reads: deploy/README.md)",
                  extra={"missing": missing})
        return ClaimReads(own=own)
    log.info("claims are read as the kubelet", extra={"certificate": str(cert),
                                                        "node": node_name})
    return ClaimReads(own=own, base=base, kubelet=KubeletCertificate(cert, key),
                      node_name=node_name)
