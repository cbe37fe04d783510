"""Which nodes may offer which Configuration's devices: names in a Role the API server checks.

A node's agent may list its node in an Instance, or publish a device in its ResourceSlices,
only for a Configuration whose ``nodeSelector`` selects that node. The agents' admission
policies (deploy/manifests/agent-instance-policy.yaml, deploy/dra/agent-resourceslice-policy.yaml)
ask RBAC, through the policy's ``authorizer``, whether the agent may offer it by the names
of ``crds.offers`` (the node is the one bound into the agent's token). This module keeps
them: per namespace with Configurations, one Role and RoleBinding ``edgeplug-agent-offers``
to the agent's ServiceAccount, listing ``<name>/*`` for a Configuration without a
``nodeSelector`` and ``<name>/<node>`` for each Node its selector matches. RBAC refuses by
default, so a Configuration the controller has not seen yet, or a node it does not select,
is refused at write. deploy/README.md says what this covers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from controller import agent_roles
from controller.watching import follow_forever
from crds.configuration import Configuration
from crds.offers import EVERY_NODE, OFFER_GROUP, OFFER_RESOURCE, OFFER_VERB, offer_name
from crds.resources import ConfigurationResource

log = logging.getLogger(__name__)

ROLE_NAME: Final = "edgeplug-agent-offers"
FIELD_MANAGER: Final = "edgeplug-controller/offer-grants"
#: Wait before watching again after a watch broke.
RETRY_S: Final = 5.0
#: A burst of changes (a fleet's Nodes listed at start) is written once, this long after its
#: first change.
COALESCE_S: Final = 0.05


def offers_of(cfg: Configuration, nodes: Mapping[str, Mapping[str, str]]) -> set[str]:
    """The names ``cfg`` grants: every node, or each known Node (name → labels) it selects."""
    selector = cfg.spec.node_selector
    if selector is None:
        return {offer_name(cfg.name, EVERY_NODE)}
    return {offer_name(cfg.name, node) for node, labels in nodes.items()
            if selector.matches(labels)}


def wanted(configurations: Iterable[Configuration],
           nodes: Mapping[str, Mapping[str, str]]) -> dict[str, set[str]]:
    """Namespace → the offer names its Role lists (namespaces with none left out)."""
    out: dict[str, set[str]] = {}
    for cfg in configurations:
        names = offers_of(cfg, nodes)
        if names:
            out.setdefault(cfg.namespace, set()).update(names)
    return out


def rules(names: Iterable[str]) -> list[dict[str, Any]]:
    return [{"apiGroups": [OFFER_GROUP], "resources": [OFFER_RESOURCE], "verbs": [OFFER_VERB],
             "resourceNames": sorted(names)}]


class OfferGrants:
    """Keeps every namespace's offer Role equal to what its Configurations select."""

    def __init__(self, client: AsyncClient, *, account: tuple[str, str]) -> None:
        self._client = client
        self._account = account
        self._configurations: dict[tuple[str, str], Configuration] = {}
        self._nodes: dict[str, dict[str, str]] = {}
        self._granted: dict[str, set[str]] = {}
        self._changed = asyncio.Event()
        self._configurations_listed = False
        self._full = True

    async def run(self) -> None:
        """Forever: follow Configurations and Nodes, and write what changed."""
        await asyncio.gather(
            follow_forever(self._follow_configurations, what="offer grants", retry_s=RETRY_S),
            follow_forever(self._follow_nodes, what="offer grants (nodes)", retry_s=RETRY_S),
            self._write_forever(),
        )

    async def _follow_configurations(self) -> None:
        seen: dict[tuple[str, str], Configuration] = {}
        async for obj in self._client.list(ConfigurationResource, namespace="*"):
            _put(seen, _as_dict(obj))
        self._configurations = seen
        self._configurations_listed = True
        self._full = True
        self._changed.set()
        async for op, obj in self._client.watch(ConfigurationResource, namespace="*"):
            data = _as_dict(obj)
            if op == "DELETED":
                meta = data.get("metadata") or {}
                self._configurations.pop((str(meta.get("namespace")), str(meta.get("name"))),
                                         None)
            else:
                _put(self._configurations, data)
            self._changed.set()

    async def _follow_nodes(self) -> None:
        # The watch starts with every Node (ADDED). A Node not seen yet only narrows a grant.
        async for op, node in self._client.watch(Node):
            name = node.metadata.name if node.metadata else None
            if not name:
                continue
            if op == "DELETED":
                self._nodes.pop(name, None)
            else:
                labels = dict(node.metadata.labels or {}) if node.metadata else {}
                if self._nodes.get(name) == labels:
                    continue
                self._nodes[name] = labels
            self._changed.set()

    async def _write_forever(self) -> None:
        while True:
            await self._changed.wait()
            await asyncio.sleep(COALESCE_S)
            self._changed.clear()
            if not self._configurations_listed:
                continue
            try:
                await self.sync(full=self._full)
                self._full = False
            except Exception as error:  # the API server away: keep serving, retry
                log.warning("offer grants: write failed (%s); retrying", error)
                await asyncio.sleep(RETRY_S)
                self._full = True
                self._changed.set()

    async def sync(self, *, full: bool) -> None:
        """Write the Roles that changed; ``full`` also rewrites every wanted one and deletes
        those found in the cluster that no Configuration asks for (left by an earlier run)."""
        want = wanted(self._configurations.values(), self._nodes)
        stale = set(self._granted) - set(want)
        if full:
            stale |= await agent_roles.namespaces_holding(self._client, ROLE_NAME) - set(want)
        granted: dict[str, set[str]] = {}
        for namespace, names in want.items():
            if not full and self._granted.get(namespace) == names:
                granted[namespace] = names
            elif await agent_roles.grant(self._client, ROLE_NAME, namespace, rules(names),
                                         account=self._account, field_manager=FIELD_MANAGER):
                log.info("nodes may offer %d Configuration/node name(s) in %s", len(names),
                         namespace)
                granted[namespace] = set(names)
        for namespace in stale:
            await agent_roles.revoke(self._client, ROLE_NAME, namespace)
        self._granted = granted


def _put(store: dict[tuple[str, str], Configuration], data: Mapping[str, Any]) -> None:
    meta = data.get("metadata") or {}
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    try:
        store[key] = Configuration.from_object(data)
    except (KeyError, TypeError, ValueError) as error:
        # Its agents cannot run it either; it grants nothing.
        log.warning("Configuration %s/%s does not parse (%s); no node may offer its devices",
                    key[0], key[1], error)
        store.pop(key, None)


def _as_dict(obj: Any) -> dict[str, Any]:
    return cast(dict[str, Any], obj.to_dict())
