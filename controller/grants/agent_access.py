"""The agents' per-namespace Roles: what each node may read, and offer, kept here.

``AgentAccess.run`` keeps ``edgeplug-agent-properties`` (the Secrets and ConfigMaps that
Configurations name, readable by the selected nodes' own accounts) and ``edgeplug-agent-offers`` in
every namespace that needs them. Why, and what confines them: deploy/README.md, "Secrets and
ConfigMaps".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, cast

from lightkube import AsyncClient

from controller.grants import agent_roles, offer_grants
from controller.kube.watching import follow_forever
from controller.settings import GrantsSettings
from crds.configuration import Configuration, ValueSourceKind
from crds.resources import ConfigurationResource
from crds.selectors import LabelSelector

log = logging.getLogger(__name__)

ROLE_NAME = "edgeplug-agent-properties"
FIELD_MANAGER = "edgeplug-controller/agent-access"
AGENT_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
OFFERS_FIELD_MANAGER = "edgeplug-controller/offer-grants"
#: The account of node N in the node-accounts namespace (agent/node_account.py).
NODE_ACCOUNT_PREFIX = "node-"
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
    return configuration_references(cfg)


def configuration_references(cfg: Configuration) -> References:
    """What ``cfg``'s ``discoveryProperties`` read: only its own namespace's objects."""
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


def readers(selectors: Iterable[LabelSelector | None], nodes: Mapping[str, Mapping[str, str]],
            node_accounts: str) -> list[dict[str, str]]:
    """Who reads what a namespace's Configurations name (``selectors``: theirs): every node's
    own account (the ServiceAccounts group of ``node_accounts``) when one selects every node,
    else the accounts ``node-<node>`` of the known Nodes their selectors select."""
    chosen = list(selectors)
    if any(selector is None for selector in chosen):
        return [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                 "name": f"system:serviceaccounts:{node_accounts}"}]
    selected = sorted(node for node, labels in nodes.items()
                      if any(s is not None and s.matches(labels) for s in chosen))
    return [agent_roles.account_subject((node_accounts, f"{NODE_ACCOUNT_PREFIX}{node}"))
            for node in selected]


class AgentAccess:
    """Keeps the agents' per-namespace Roles equal to what Configurations and Nodes say: the
    named reads (``edgeplug-agent-properties``, bound to the accounts of the nodes that need
    them) and the offers (``controller.grants.offer_grants``, bound to the agent's account)."""

    def __init__(self, client: AsyncClient, *,
                 account: tuple[str, str] = (AGENT_NAMESPACE, AGENT_ACCOUNT),
                 node_accounts: str = f"{AGENT_NAMESPACE}-nodes",
                 settings: GrantsSettings | None = None) -> None:
        self._settings = settings or GrantsSettings()
        self._client = client
        self._account = account
        self._node_accounts = node_accounts
        self._configurations: dict[tuple[str, str], Configuration] = {}
        self._nodes: agent_roles.NodeLabels = {}
        self._granted: dict[str, tuple[References, list[dict[str, str]]]] = {}
        self._offered: dict[str, set[str]] = {}
        self._refused = SYSTEM_NAMESPACES | {account[0]}
        self._warned: set[str] = set()
        self._changed = asyncio.Event()
        self._listed = False
        self._full = True

    async def run(self) -> None:
        """Forever: follow Configurations and Nodes, and write what changed."""
        await asyncio.gather(
            follow_forever(self._follow, what="agent access", retry_s=self._settings.retry_s),
            follow_forever(lambda: agent_roles.follow_node_labels(
                self._client, self._nodes, self._changed.set),
                what="agent access (nodes)", retry_s=self._settings.retry_s),
            self._write_forever(),
        )

    async def _follow(self) -> None:
        seen: dict[tuple[str, str], Configuration] = {}
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            _put(seen, _as_dict(obj))
        self._configurations, self._listed, self._full = seen, True, True
        self._changed.set()
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            if op == "DELETED":
                self._configurations.pop(_key(data), None)
            else:
                _put(self._configurations, data)
            self._changed.set()

    async def _write_forever(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(self._settings.coalesce_s)
            self._changed.clear()
            if not self._listed:
                continue
            try:
                await self.sync(full=self._full)
                self._full = False
            except Exception as error:  # the API server away: keep serving, retry
                log.warning("agent access: write failed (%s); retrying", error)
                await asyncio.sleep(self._settings.retry_s)
                self._full = True
                self._changed.set()

    async def sync(self, *, full: bool = True) -> None:
        """Write what changed since the last sync; ``full`` also rewrites every wanted Role and
        deletes those found in the cluster that nothing asks for (left by an earlier run)."""
        configurations = list(self._configurations.values())
        await self._sync_reads(configurations, full=full)
        await self._sync_offers(configurations, full=full)

    async def _sync_reads(self, configurations: list[Configuration], *, full: bool) -> None:
        wanted = self._grantable(merged(
            {cfg.namespace: kinds} for cfg in configurations
            for kinds in [configuration_references(cfg).get(cfg.namespace)] if kinds))
        stale = set(self._granted) - set(wanted)
        if full:
            stale |= await agent_roles.namespaces_holding(self._client, ROLE_NAME) - set(wanted)
        granted: dict[str, tuple[References, list[dict[str, str]]]] = {}
        for namespace, kinds in wanted.items():
            subjects = readers(
                (c.spec.node_selector for c in configurations
                 if c.namespace == namespace and configuration_references(c)),
                self._nodes, self._node_accounts)
            want = ({namespace: kinds}, subjects)
            if not full and self._granted.get(namespace) == want:
                granted[namespace] = want
            elif await agent_roles.grant(self._client, ROLE_NAME, namespace,
                                         role_body(namespace, kinds)["rules"],
                                         subjects=subjects, field_manager=FIELD_MANAGER):
                log.info("nodes may read %s in %s (%d node account(s) or all)",
                         {r: len(n) for r, n in kinds.items()}, namespace, len(subjects))
                granted[namespace] = want
        for namespace in stale:
            await agent_roles.revoke(self._client, ROLE_NAME, namespace)
            log.info("no node reads anything in %s any more", namespace)
        self._granted = granted

    async def _sync_offers(self, configurations: list[Configuration], *, full: bool) -> None:
        want = offer_grants.wanted(configurations, self._nodes)
        stale = set(self._offered) - set(want)
        if full:
            stale |= await agent_roles.namespaces_holding(
                self._client, offer_grants.ROLE_NAME) - set(want)
        offered: dict[str, set[str]] = {}
        for namespace, names in want.items():
            if not full and self._offered.get(namespace) == names:
                offered[namespace] = names
            elif await agent_roles.grant(
                    self._client, offer_grants.ROLE_NAME, namespace, offer_grants.rules(names),
                    subjects=[agent_roles.account_subject(self._account)],
                    field_manager=OFFERS_FIELD_MANAGER):
                log.info("nodes may offer %d Configuration/node name(s) in %s", len(names),
                         namespace)
                offered[namespace] = set(names)
        for namespace in stale:
            await agent_roles.revoke(self._client, offer_grants.ROLE_NAME, namespace)
        self._offered = offered

    def _grantable(self, wanted: References) -> References:
        """``wanted`` without the system namespaces, each left out with one warning."""
        for namespace in sorted(set(wanted) & self._refused - self._warned):
            log.warning("agent access: Configurations in %s reference Secrets or ConfigMaps;"
                        " the agent is granted no reads in a system namespace (run"
                        " Configurations in an application namespace)", namespace)
            self._warned.add(namespace)
        return {ns: kinds for ns, kinds in wanted.items() if ns not in self._refused}


def _put(store: dict[tuple[str, str], Configuration], data: Mapping[str, Any]) -> None:
    key = _key(data)
    try:
        store[key] = Configuration.from_object(data)
    except (KeyError, TypeError, ValueError) as error:
        # Its agents cannot run it either: it grants no read and no offer.
        log.warning("Configuration %s/%s does not parse (%s); it grants nothing",
                    key[0], key[1], error)
        store.pop(key, None)


def _key(data: Mapping[str, Any]) -> tuple[str, str]:
    meta = data.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _as_dict(obj: Any) -> dict[str, Any]:
    return cast(dict[str, Any], obj.to_dict())
