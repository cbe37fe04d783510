"""Which nodes may offer which Configuration's devices: names in a Role the API server checks.

A node's agent may list its node in an Instance, or publish a device in its ResourceSlices,
only for a Configuration whose ``nodeSelector`` selects that node. The agents' admission
policies (deploy/manifests/agent-instance-policy.yaml, deploy/dra/agent-resourceslice-policy.yaml)
ask RBAC, through the policy's ``authorizer``, whether the agent may offer it by the names
of ``crds.offers`` (the node is the one bound into the agent's token). This module says
what they are; ``controller.agent_access`` writes them: per namespace with Configurations,
one Role and RoleBinding ``edgeplug-agent-offers`` to the agent's ServiceAccount, listing
``<name>/*`` for a Configuration without a ``nodeSelector`` and ``<name>/<node>`` for each
Node its selector matches. RBAC refuses by default, so a Configuration the controller has not
seen yet, or a node it does not select, is refused at write. deploy/README.md says what this
covers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from crds.configuration import Configuration
from crds.offers import EVERY_NODE, OFFER_GROUP, OFFER_RESOURCE, OFFER_VERB, offer_name

ROLE_NAME: Final = "edgeplug-agent-offers"


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
