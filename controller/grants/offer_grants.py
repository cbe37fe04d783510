"""Which nodes may offer which Configuration's devices: names in a Role the API server checks.

``offers_of``, ``wanted`` and ``rules`` compute the ``edgeplug-agent-offers`` Role's names
(``crds.offers``); ``controller.grants.agent_access`` writes it. What this covers: deploy/README.md.
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
