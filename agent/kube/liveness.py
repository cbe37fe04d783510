"""This node's liveness Lease, renewed while the agent runs (with DRA on).

The controller watches these Leases and, once one is not renewed within its grace, stops
offering the node's devices to the scheduler (docs/dra.md, "When a node's agent is gone"):
the scheduler must not bind pods to a node whose claims no agent would prepare. One merge
patch of ``spec.renewTime`` per renewal; the Lease is created when missing, and left in
place when the agent stops (a restart within the grace changes nothing).
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import UTC, datetime
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.types import PatchType

from agent.kube.client import field_manager, is_conflict, is_not_found
from crds import agent_liveness

log = logging.getLogger(__name__)

#: The Lease says it lasts this many renewal intervals (``leaseDurationSeconds``): the
#: controller takes the node for gone no sooner than that.
DURATION_RENEWALS: Final = 3


def _now() -> str:
    """A MicroTime, as the API stores ``renewTime``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LivenessLease:
    """Renews ``edgeplug-agent-<node>`` in ``namespace`` every ``renew_s`` until cancelled."""

    def __init__(self, client: AsyncClient, *, node: str, namespace: str,
                 renew_s: float) -> None:
        self._client = client
        self._node = node
        self._namespace = namespace
        self._renew_s = renew_s
        self._name = agent_liveness.lease_name(node)
        self._duration = max(1, math.ceil(renew_s * DURATION_RENEWALS))
        self._failing = ""
        self.renewals = 0  # for tests

    def _spec(self) -> dict[str, Any]:
        return {"holderIdentity": self._node, "leaseDurationSeconds": self._duration,
                "renewTime": _now()}

    async def run(self) -> None:
        if self._name is None:
            log.warning("no liveness Lease: the node name is too long for one; the "
                        "controller never takes this node's agent for gone",
                        extra={"node": self._node})
            return
        while True:
            try:
                await self._renew(self._name)
                self.renewals += 1
                if self._failing:
                    log.info("liveness Lease renewed again", extra={"lease": self._name})
                self._failing = ""
            except Exception as error:  # API away or refusing: said once, retried
                if str(error) != self._failing:
                    log.warning("liveness Lease not renewed (%s); retrying every %.1f s",
                                error, self._renew_s, extra={"lease": self._name})
                self._failing = str(error)
            await asyncio.sleep(self._renew_s)  # the renewal's pace

    async def _renew(self, name: str) -> None:
        try:
            await self._client.patch(Lease, name, {"spec": self._spec()},
                                     namespace=self._namespace, patch_type=PatchType.MERGE)
        except ApiError as error:
            if not is_not_found(error):
                raise
            await self._create(name)

    async def _create(self, name: str) -> None:
        body = cast(Lease, Lease.from_dict({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": self._namespace, "labels": {
                agent_liveness.LABEL_COMPONENT: agent_liveness.COMPONENT}},
            "spec": self._spec() | {"acquireTime": _now()}}))
        try:
            await self._client.create(body, field_manager=field_manager(self._node))
        except ApiError as error:
            if not is_conflict(error):  # made meanwhile (a restart's race): renewed next time
                raise
