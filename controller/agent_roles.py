"""Write and remove one of the per-namespace Roles the controller keeps for the agent.

The controller keeps two such Roles, each with a RoleBinding of the same name to the agent's
ServiceAccount: ``edgeplug-agent-properties`` (``controller.agent_access``: the Secrets and
ConfigMaps Configurations name) and ``edgeplug-agent-offers`` (``controller.offer_grants``:
which nodes may offer which Configuration's devices). RBAC lets the controller touch only
those two names, so every call here names its Role (server-side apply to the Role's own URL,
a list by a ``metadata.name`` field selector).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

log = logging.getLogger(__name__)

MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "edgeplug-controller"


def role_body(name: str, namespace: str, rules: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGER}},
        "rules": list(rules),
    }


def binding_body(name: str, namespace: str, *, account: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGER}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}],
    }


async def grant(client: AsyncClient, name: str, namespace: str, rules: Sequence[dict[str, Any]],
                *, account: tuple[str, str], field_manager: str) -> bool:
    """Apply the Role ``name`` with ``rules`` and its binding to ``account``; False (logged)
    when the API server refuses (a namespace being deleted: its Configurations go too)."""
    try:
        await client.apply(cast(Role, Role.from_dict(role_body(name, namespace, rules))),
                           field_manager=field_manager, force=True)
        await client.apply(
            cast(RoleBinding, RoleBinding.from_dict(binding_body(name, namespace,
                                                                 account=account))),
            field_manager=field_manager, force=True)
    except ApiError as error:
        log.warning("cannot write Role %s in %s: %s", name, namespace, error.status.message)
        return False
    return True


async def revoke(client: AsyncClient, name: str, namespace: str) -> None:
    """Delete the binding, then the Role ``name`` in ``namespace`` (already gone is fine)."""
    for kind in (RoleBinding, Role):
        try:
            await client.delete(kind, name, namespace=namespace)
        except ApiError as error:
            if error.status.code != 404:
                log.warning("cannot delete %s %s in %s: %s", kind.__name__, name, namespace,
                            error.status.message)


async def namespaces_holding(client: AsyncClient, name: str) -> set[str]:
    """The namespaces where a Role ``name`` of the controller's exists (listed by name: RBAC
    lets the controller list no other)."""
    found: set[str] = set()
    async for role in client.list(Role, namespace="*", fields={"metadata.name": name},
                                  labels={MANAGED_BY: MANAGER}):
        namespace = role.metadata.namespace if role.metadata else None
        if namespace:
            found.add(namespace)
    return found
