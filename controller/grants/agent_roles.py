"""Write and remove one of the per-namespace Roles the controller keeps for the agents, and follow
the Nodes' labels their grants depend on.

``grant`` and ``revoke`` name the Role in every call (RBAC lets the controller touch only its two
names); ``follow_node_labels``, ``namespaces_holding``. The Roles: deploy/README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
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


def account_subject(account: tuple[str, str]) -> dict[str, str]:
    """A binding's subject for the ServiceAccount ``(namespace, name)``."""
    return {"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}


def binding_body(name: str, namespace: str, subjects: Sequence[dict[str, str]]
                 ) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: MANAGER}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": list(subjects),
    }


async def grant(client: AsyncClient, name: str, namespace: str, rules: Sequence[dict[str, Any]],
                *, subjects: Sequence[dict[str, str]], field_manager: str) -> bool:
    """Apply the Role ``name`` with ``rules`` and its binding to ``subjects``; False (logged)
    when the API server refuses (a namespace being deleted: its Configurations go too)."""
    try:
        await client.apply(cast(Role, Role.from_dict(role_body(name, namespace, rules))),
                           field_manager=field_manager, force=True)
        await client.apply(
            cast(RoleBinding, RoleBinding.from_dict(binding_body(name, namespace, subjects))),
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


#: Node name → its labels.
NodeLabels = dict[str, dict[str, str]]


async def follow_node_labels(client: AsyncClient, nodes: NodeLabels,
                             changed: Callable[[], None]) -> None:
    """Keep ``nodes`` equal to the cluster's Nodes' labels, calling ``changed`` on each change.
    The watch starts with every Node (ADDED); a Node not seen yet only narrows a grant."""
    async for op, node in client.watch(Node):
        name = node.metadata.name if node.metadata else None
        if not name:
            continue
        if op == "DELETED":
            nodes.pop(name, None)
        else:
            labels = dict(node.metadata.labels or {}) if node.metadata else {}
            if nodes.get(name) == labels:
                continue
            nodes[name] = labels
        changed()


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
