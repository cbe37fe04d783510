"""Before a Configuration's discovery starts on this node: wait until the node may offer it.

``wait_until_granted`` asks RBAC (``may_offer``, a SelfSubjectAccessReview) until the controller's
grant is there (docs/architecture.md, "The agent's discovery modules"; deploy/README.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

from agent.settings import current
from crds.offers import EVERY_NODE, OFFER_GROUP, OFFER_RESOURCE, OFFER_VERB, offer_name

log = logging.getLogger(__name__)



async def may_offer(client: AsyncClient, namespace: str, configuration: str, node: str) -> bool:
    """Whether RBAC lets this identity offer ``configuration``'s devices on ``node``."""
    for name in (offer_name(configuration, node), offer_name(configuration, EVERY_NODE)):
        review = await client.create(cast(Any, SelfSubjectAccessReview.from_dict({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {
                "group": OFFER_GROUP, "resource": OFFER_RESOURCE, "verb": OFFER_VERB,
                "namespace": namespace, "name": name}}})))
        if review.status is not None and review.status.allowed:
            return True
    return False


async def wait_until_granted(client: AsyncClient, namespace: str, configuration: str,
                             node: str) -> None:
    """Return once ``node`` may offer the Configuration's devices (at once, mostly)."""
    started = time.monotonic()
    wait, warned = current().api.offer_first_wait_s, False
    while True:
        try:
            if await may_offer(client, namespace, configuration, node):
                if wait > current().api.offer_first_wait_s:
                    log.info("offer of %s/%s granted after %.1f s", namespace, configuration,
                             time.monotonic() - started)
                return
        except ApiError as error:  # the API server away: ask again
            log.debug("access review failed: %s", error.status.message)
        if not warned and time.monotonic() - started > current().api.offer_warn_after_s:
            log.warning("node %s may not offer the devices of %s/%s yet (the controller grants"
                        " it for a Configuration whose nodeSelector selects the node);"
                        " discovery starts once it does", node, namespace, configuration)
            warned = True
        await asyncio.sleep(wait)
        wait = min(wait * 2, current().api.offer_max_wait_s)
