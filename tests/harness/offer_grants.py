"""The controller's grants to the agents (controller/grants/agent_access.py: the offers of
controller/grants/offer_grants.py and the nodes' named reads), run on the controller's own token
in a thread of their own, for tests whose agents run with their own token but no controller: the
agents' Instance and ResourceSlice policies refuse a node's writes for any Configuration no
grant names, as they do in a cluster.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from lightkube import AsyncClient, Client, KubeConfig
from lightkube.resources.authorization_v1 import SubjectAccessReview

from controller.grants.agent_access import AgentAccess
from crds.offers import EVERY_NODE, OFFER_GROUP, OFFER_RESOURCE, OFFER_VERB, offer_name
from tests.harness.controlplane import ControlPlane
from tests.harness.service_accounts import (
    AGENT_ACCOUNT,
    CONTROLLER_ACCOUNT,
    SYSTEM_NAMESPACE,
    apply_manifests,
    mint,
)

#: How long a grant may take to reach RBAC's view (a watch event, a write, the authorizer's cache).
GRANT_DEADLINE_S = 30.0
POLL_S = 0.1
AGENT_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{AGENT_ACCOUNT}"


@contextmanager
def offer_grants(cp: ControlPlane, folder: Path) -> Iterator[None]:
    """Keep the grants while the block runs (the controller's RBAC and policies applied)."""
    apply_manifests(cp, ("namespace.yaml", "controller-rbac.yaml", "controller-policy.yaml"))
    controller = mint(cp, namespace=SYSTEM_NAMESPACE, account=CONTROLLER_ACCOUNT,
                      path=folder / "offer-grants-controller")
    loop = asyncio.new_event_loop()
    stopped = threading.Event()

    async def keep() -> None:
        client = AsyncClient(KubeConfig.from_file(str(controller.kubeconfig)))
        try:
            await AgentAccess(client, account=(SYSTEM_NAMESPACE, AGENT_ACCOUNT)).run()
        finally:
            await client.close()

    task = loop.create_task(keep())

    def serve() -> None:
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()
            stopped.set()

    thread = threading.Thread(target=serve, name="offer-grants", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(task.cancel)
        stopped.wait(GRANT_DEADLINE_S)


def may_offer(cp: ControlPlane, namespace: str, configuration: str, node: str) -> bool:
    """Whether RBAC lets the agent offer ``configuration``'s devices on ``node`` (by name, or
    every node)."""
    client = Client(KubeConfig.from_file(str(cp.kubeconfig)))
    for name in (offer_name(configuration, node), offer_name(configuration, EVERY_NODE)):
        review = client.create(cast(SubjectAccessReview, SubjectAccessReview.from_dict({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": AGENT_USER,
                     "groups": ["system:serviceaccounts",
                                f"system:serviceaccounts:{SYSTEM_NAMESPACE}",
                                "system:authenticated"],
                     "resourceAttributes": {"group": OFFER_GROUP, "resource": OFFER_RESOURCE,
                                            "verb": OFFER_VERB, "namespace": namespace,
                                            "name": name}}})))
        if review.status is not None and review.status.allowed:
            return True
    return False


def wait_offer(cp: ControlPlane, namespace: str, configuration: str, node: str, *,
               granted: bool = True) -> None:
    """Until RBAC says the agent may (``granted``) or may not offer them."""
    deadline = time.monotonic() + GRANT_DEADLINE_S
    while may_offer(cp, namespace, configuration, node) != granted:
        assert time.monotonic() < deadline, (
            f"offer of {namespace}/{configuration} on {node} not "
            f"{'granted' if granted else 'withdrawn'} within {GRANT_DEADLINE_S:.0f} s")
        time.sleep(POLL_S)  # polling RBAC's answer with a deadline, not a synchronisation sleep
