"""What an agent's liveness Lease and the controller's "agent gone" taint are called, shared by
the agent that renews the Lease and the controller that watches it (docs/dra.md, "When a
node's agent is gone").

One ``coordination.k8s.io/v1`` Lease per node, ``edgeplug-agent-<node>`` in the install's
namespace, ``holderIdentity`` the node; the admission policy in deploy/dra lets only that
node's agent write it.
"""

from __future__ import annotations

from typing import Final

from crds import dra

#: A Lease's name is ``LEASE_PREFIX + <node>``.
LEASE_PREFIX: Final = "edgeplug-agent-"
#: The longest Lease name (a DNS subdomain): a longer node name has no Lease, and its node is
#: never taken for gone.
MAX_NAME: Final = 253
#: Label every agent Lease carries, so the controller watches only those.
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
COMPONENT: Final = "edgeplug-agent-liveness"
#: The device taint the controller puts on a gone agent's local pools (``NoSchedule`` only:
#: claims allocated before keep their devices).
TAINT_AGENT_GONE: Final = f"{dra.DRIVER}/agent-gone"


def lease_name(node: str) -> str | None:
    """The Lease of ``node``'s agent (None: the node's name is too long for one)."""
    name = LEASE_PREFIX + node
    return name if len(name) <= MAX_NAME else None


def node_of(lease: str) -> str | None:
    """The node whose agent renews the Lease named ``lease`` (None: not an agent's)."""
    if not lease.startswith(LEASE_PREFIX):
        return None
    return lease[len(LEASE_PREFIX):] or None
