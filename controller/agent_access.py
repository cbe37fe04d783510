"""The agent reads only the Secrets and ConfigMaps that Configurations name: Roles kept here.

Why this exists: a node's agent resolves ``discoveryProperties`` from Secrets and ConfigMaps
(``valueFrom``). A cluster-wide grant to read them hands every Secret of the cluster to whoever
steals a node's token. RBAC can grant reading objects by name (``resourceNames``), but the names
come from Configurations, which change; so the controller keeps, in every namespace whose
Configurations' properties reference something, one Role ``edgeplug-agent-properties`` listing
exactly the referenced Secrets and ConfigMaps (get and watch, by name) and one RoleBinding of it
to the agent's ServiceAccount, and deletes both when nothing there is referenced any more.

What a Configuration may reference: Secrets and ConfigMaps of its own namespace only. A
reference naming another namespace grants nothing (a warning names it; the agent is refused the
read and says so on the Configuration's status), and the API server refuses such a
Configuration in the first place (deploy/manifests/configuration-policy.yaml): whoever may write
Configurations in one namespace must not make the agents read a Secret of another. Nothing is
granted in a system namespace (kube-system, kube-public, kube-node-lease, the agent's own),
which deploy/manifests/controller-policy.yaml refuses the controller too.

Safety: the controller holds no read of Secrets or ConfigMaps. It writes the Role with rules it
does not hold through RBAC's ``escalate`` verb and binds it through ``bind``, both granted for
the one name ``edgeplug-agent-properties`` (RBAC checks them against the name in the request's
URL: the server-side applies below name it; so does the list, by a ``metadata.name`` field
selector), and controller-policy.yaml confines what those two objects may say: get and watch on
named Secrets and ConfigMaps, bound to the agent's ServiceAccount alone. A rule with an empty
``resourceNames`` means "all objects", so a kind with no referenced name gets no rule at all
(``role_body``), and the policy refuses one too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast

from lightkube import AsyncClient

from controller import agent_roles
from controller.watching import follow_forever
from crds.configuration import Configuration, ValueSourceKind
from crds.resources import ConfigurationResource

log = logging.getLogger(__name__)

ROLE_NAME = "edgeplug-agent-properties"
FIELD_MANAGER = "edgeplug-controller/agent-access"
AGENT_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
#: Wait before watching again after the Configuration watch broke.
RETRY_S = 5.0
#: Verbs the agent needs on each referenced object: read it, and watch it by name.
VERBS = ("get", "watch")
_RESOURCES = {ValueSourceKind.SECRET: "secrets", ValueSourceKind.CONFIG_MAP: "configmaps"}
#: Namespaces the agent is granted no reads in, beside its own (controller-policy.yaml's list).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})

#: namespace -> resource ("secrets", "configmaps") -> names
References = dict[str, dict[str, set[str]]]


def references_of(obj: Mapping[str, Any]) -> References:
    """What one Configuration's ``discoveryProperties`` read, by namespace; a Configuration that
    does not parse references nothing (its agent cannot run it either)."""
    try:
        cfg = Configuration.from_object(obj)
    except (KeyError, TypeError, ValueError) as error:
        meta = obj.get("metadata") or {}
        log.warning("Configuration %s/%s does not parse (%s); it grants no reads",
                    meta.get("namespace"), meta.get("name"), error)
        return {}
    found: References = {}
    for prop in cfg.spec.discovery_handler.discovery_properties:
        source = prop.value_from
        if source is None:
            continue
        if source.namespace and source.namespace != cfg.namespace:
            log.warning("Configuration %s/%s: property %s names %s %s/%s of another namespace;"
                        " a Configuration may reference only its own namespace's, so the agent"
                        " is granted no read of it", cfg.namespace, cfg.name, prop.name,
                        source.kind, source.namespace, source.name)
            continue
        found.setdefault(cfg.namespace, {}).setdefault(_RESOURCES[source.kind], set()).add(
            source.name)
    return found


def merged(parts: Iterable[References]) -> References:
    out: References = {}
    for part in parts:
        for namespace, kinds in part.items():
            for resource, names in kinds.items():
                out.setdefault(namespace, {}).setdefault(resource, set()).update(names)
    return out


def role_body(namespace: str, kinds: Mapping[str, set[str]]) -> dict[str, Any]:
    """The Role granting exactly ``kinds``' names; never a rule without names (that is all)."""
    rules = [
        {"apiGroups": [""], "resources": [resource], "verbs": list(VERBS),
         "resourceNames": sorted(names)}
        for resource, names in sorted(kinds.items()) if names
    ]
    return agent_roles.role_body(ROLE_NAME, namespace, rules)


class AgentAccess:
    """Keeps the agent's per-namespace read Roles equal to what Configurations reference."""

    def __init__(self, client: AsyncClient, *,
                 account: tuple[str, str] = (AGENT_NAMESPACE, AGENT_ACCOUNT)) -> None:
        self._client = client
        self._account = account
        self._by_configuration: dict[tuple[str, str], References] = {}
        self._granted: References = {}
        self._refused = SYSTEM_NAMESPACES | {account[0]}
        self._warned: set[str] = set()

    async def run(self) -> None:
        """Forever: list, grant, then follow the Configuration watch; start over if it breaks."""
        await follow_forever(self._follow, what="agent access", retry_s=RETRY_S)

    async def _follow(self) -> None:
        self._by_configuration.clear()
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            self._by_configuration[_key(data)] = references_of(data)
        await self.sync(full=True)
        # The watch begins with every Configuration again (ADDED): unchanged ones write nothing.
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            if op == "DELETED":
                self._by_configuration.pop(_key(data), None)
            else:
                self._by_configuration[_key(data)] = references_of(data)
            await self.sync(full=False)

    async def sync(self, *, full: bool = True) -> None:
        """Write what changed since the last sync; ``full`` also deletes Roles found in the
        cluster that no Configuration asks for (left by an earlier run)."""
        wanted = self._grantable(merged(self._by_configuration.values()))
        stale = set(self._granted) - set(wanted)
        if full:
            stale |= await agent_roles.namespaces_holding(self._client, ROLE_NAME) - set(wanted)
        for namespace, kinds in wanted.items():
            if full or self._granted.get(namespace) != kinds:
                await self._grant(namespace, kinds)
        for namespace in stale:
            await self._revoke(namespace)
        self._granted = {ns: {r: set(n) for r, n in kinds.items()}
                         for ns, kinds in wanted.items()}

    def _grantable(self, wanted: References) -> References:
        """``wanted`` without the system namespaces, each left out with one warning."""
        for namespace in sorted(set(wanted) & self._refused - self._warned):
            log.warning("agent access: Configurations in %s reference Secrets or ConfigMaps;"
                        " the agent is granted no reads in a system namespace (run"
                        " Configurations in an application namespace)", namespace)
            self._warned.add(namespace)
        return {ns: kinds for ns, kinds in wanted.items() if ns not in self._refused}

    async def _grant(self, namespace: str, kinds: Mapping[str, set[str]]) -> None:
        if await agent_roles.grant(self._client, ROLE_NAME, namespace,
                                   role_body(namespace, kinds)["rules"], account=self._account,
                                   field_manager=FIELD_MANAGER):
            log.info("agent may read %s in %s",
                     {r: len(n) for r, n in kinds.items()}, namespace)

    async def _revoke(self, namespace: str) -> None:
        await agent_roles.revoke(self._client, ROLE_NAME, namespace)
        log.info("agent reads nothing in %s any more", namespace)


def _key(data: Mapping[str, Any]) -> tuple[str, str]:
    meta = data.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _as_dict(obj: Any) -> dict[str, Any]:
    return cast(dict[str, Any], obj.to_dict())
