"""The names by which the controller grants a node leave to offer a Configuration's devices.

``offer_name`` names ``<configuration>/<node>`` (or ``*``) of the RBAC-only resource
``nodeoffers.edgeplug.io``; the grants and why: deploy/README.md.
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
