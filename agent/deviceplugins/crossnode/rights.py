"""Which of the compatibility mode's own rights this agent holds, asked once when it starts.

The cross-node protocol needs two grants the DRA default does not: ``watch`` on pods (the demand
of Pending pods pinned here, ``demand.PendingPods``) and ``patch`` on this Node's ``nodes/status``
(the hand-off gate's count, ``handoff.NodeAllocatable``); ``deploy/compat`` (the chart's
``compat.crossNode``) grants them. ``missing_rights`` asks the API server with one
SelfSubjectAccessReview each (which every authenticated user may create) and returns what is
refused, so that the protocol can say so once and run without it instead of retrying a refused
watch for ever. An answer that cannot be had counts as granted: the calls themselves then tell.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

from agent.kube import watching

log = logging.getLogger(__name__)

#: Where the rights come from, for the log line and the Event.
GRANTED_BY = "kubectl apply -k deploy/compat, or the Helm value compat.crossNode: true"


@dataclass(frozen=True)
class Right:
    verb: str
    resource: str
    subresource: str = ""
    #: What the protocol does without it.
    without: str = ""

    def __str__(self) -> str:
        target = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {target}"


PODS_WATCH = Right("watch", "pods", without="the demand of Pending pods pinned here is read "
                   "only from the controller's count on the Node")
NODE_STATUS = Right("patch", "nodes", "status", without="slots are given away without "
                    "lowering the Node's count first, so a pod bound meanwhile may fail "
                    "admission")


async def missing_rights(client: AsyncClient, node: str) -> list[Right]:
    """The rights of ``PODS_WATCH`` and ``NODE_STATUS`` (on ``node``) the API server refuses
    this agent."""
    missing = []
    for right in (PODS_WATCH, NODE_STATUS):
        review = SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(
            resourceAttributes=ResourceAttributes(
                verb=right.verb, resource=right.resource, group="",
                subresource=right.subresource or None,
                name=node if right is NODE_STATUS else None)))
        try:
            answer = await client.create(review)
        except Exception as error:  # ApiError, or the API server away
            log.info("could not ask whether this agent may %s: %s", right,
                     watching.describe(error))
            continue
        if answer.status is None or not answer.status.allowed:
            missing.append(right)
    return missing
