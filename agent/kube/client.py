"""The agent's one seam to the Kubernetes API: lightkube client construction and error helpers.

``load_config``, ``with_user``, ``counted_client``, ``field_manager``, and ``is_not_found`` /
``is_conflict`` / ``is_forbidden`` for the statuses callers treat as "not there", "lost a race" or
"refused". Why lightkube: docs/architecture.md, "Design choices".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User

from agent.metrics import PROCESS
from crds.resources import ConfigurationResource as ConfigurationResource
from crds.resources import InstanceResource as InstanceResource

HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def field_manager(node_name: str) -> str:
    """The server-side-apply field manager of this node's agent."""
    return f"edgeplug-agent-{node_name}"


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """``kubeconfig``, or in-cluster (service account) when it is None."""
    if kubeconfig is not None:
        return KubeConfig.from_file(str(kubeconfig))
    return KubeConfig.from_service_account()


def with_user(base: KubeConfig, user: User) -> KubeConfig:
    """The cluster of ``base`` (server and CA, the agent's own), with another ``user``."""
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
        user=user)


def counted_client(config: KubeConfig) -> AsyncClient:
    """A client of ``config`` whose 429 and 5xx answers count in edgeplug_api_errors_total."""
    client = AsyncClient(config)
    PROCESS.hook(client)
    return client


def is_not_found(error: ApiError) -> bool:
    return error.status.code == HTTP_NOT_FOUND


def is_conflict(error: ApiError) -> bool:
    return error.status.code == HTTP_CONFLICT


def is_forbidden(error: ApiError) -> bool:
    return error.status.code == HTTP_FORBIDDEN


def as_dict(obj: Any) -> dict[str, Any]:
    """The plain-dict form of a lightkube object (generic resources are dicts already)."""
    result: dict[str, Any] = obj.to_dict()
    return result
