"""The names by which the controller grants a node leave to offer a Configuration's devices.

No object of this kind exists: RBAC grants the agent the verb ``offer`` on the resource
``nodeoffers.edgeplug.io`` named ``<configuration>/<node>`` (or ``<configuration>/*``, every
node) in the Configuration's namespace, and the agents' admission policies ask RBAC about
those names. The controller keeps the grants (``controller.offer_grants``); the agent asks
before it runs a Configuration (``agent.offer_wait``).
"""

from __future__ import annotations

from typing import Final

OFFER_GROUP: Final = "edgeplug.io"
OFFER_RESOURCE: Final = "nodeoffers"
OFFER_VERB: Final = "offer"
#: The node part of a name that grants every node (a Configuration without a nodeSelector).
EVERY_NODE: Final = "*"


def offer_name(configuration: str, node: str) -> str:
    return f"{configuration}/{node}"
