"""The pods bound to this node that have not ended, read consistently from the API server.

``pods_bound_here`` is one ``pods list`` with a ``spec.nodeName`` field selector and no
``resourceVersion`` (so every binding written before the call is in it). ``BoundPodsReader``
wraps it for the orphan freer's evidence (``agent.deviceplugins.slots.freeing``): None when the read
fails (the freer then waits out its grace), and for good once the API server refuses it (no kubelet
certificate and no ``pods list`` grant for the token), with one warning. The list goes as the
kubelet where its certificate is given (``agent.kube.node_reads``): the Node authorizer lets it list
exactly this node's pods. Both allocation modes use it for the
devices the kubelet allocates through device plugins (docs/slots.md, C9 and C10).
"""

from __future__ import annotations

import logging
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kube.client import as_dict, is_forbidden
from agent.kube.node_reads import NodeReads

log = logging.getLogger(__name__)

#: Pod phases after which a pod holds nothing and awaits nothing.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


async def pods_bound_here(client: AsyncClient, node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node`` that have not ended, as the API's JSON. A list without
    ``resourceVersion`` is served consistently (as of now): every binding written before the
    call is in it."""
    pods = []
    async for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
        obj = as_dict(pod)
        if (obj.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            pods.append(obj)
    return pods


class BoundPodsReader:
    """``pods_bound_here`` for the orphan freer's per-pod evidence
    (``agent.deviceplugins.slots.freeing``): None when the read fails (the freer then waits out its
    grace), and for good once the API server refuses it (no kubelet certificate, no ``pods list``
    grant), with a warning."""

    def __init__(self, *, reads: NodeReads, node: str) -> None:
        self._reads = reads
        self.node = node
        self.permitted = True

    async def __call__(self) -> list[dict[str, Any]] | None:
        if not self.permitted:
            return None
        try:
            return await pods_bound_here(await self._reads.client(), self.node)
        except ApiError as error:
            if is_forbidden(error):
                self.permitted = False
                log.warning("this agent may not list the pods bound to its node as %s (%s): a "
                            "slot no pod-resources List saw held is freed after the orphan "
                            "grace; give it the kubelet's certificate (KUBELET_CLIENT_CERT) or "
                            "apply deploy/token-reads of this release", self._reads.identity,
                            error.status.message)
            else:
                log.info("reading the pods bound here failed: %s", error)
            return None
