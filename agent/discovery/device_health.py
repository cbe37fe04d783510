"""Tell users when a device this node serves is present but unhealthy, and when it recovers.

``HealthReporter.report`` writes ``status.unhealthy.<node>`` (and a shared device's first verdict
with ``status.reported.<node>``) and one Event per change; ``unreport`` takes the mark back before
the node leaves (docs/architecture.md, "The agent's discovery modules").
"""

from __future__ import annotations

import logging
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.discovery.events import emit_event
from agent.kube.client import InstanceResource, field_manager, is_not_found
from crds.api import INSTANCE_KIND
from crds.instance import STATUS_REPORTED
from discovery_handlers.contract import HEALTHY, Health

log = logging.getLogger(__name__)

REASON_UNHEALTHY = "DeviceUnhealthy"
REASON_HEALTHY = "DeviceHealthy"
REASON_WARNING = "DeviceWarning"


class HealthReporter:
    """Health verdicts of one Configuration's Instances on this node, reported on change."""

    def __init__(self, *, client: AsyncClient, node_name: str, namespace: str) -> None:
        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._reported: dict[str, Health] = {}
        self._warned: dict[str, str] = {}

    def forget(self, instance: str) -> None:
        self._reported.pop(instance, None)
        self._warned.pop(instance, None)

    def first_verdict_due(self, instance: str, *, shared: bool) -> bool:
        """Whether ``report`` will write this shared device's first verdict (its
        ``status.reported`` mark): nothing was written for it yet."""
        return shared and instance not in self._reported

    async def warn(self, instance: str, warning: str) -> None:
        """One Warning Event each time a device's warning changes to a new one."""
        if self._warned.get(instance, "") == warning:
            return
        if warning:
            try:
                await emit_event(
                    self._client, node=self._node, kind=INSTANCE_KIND, name=instance,
                    namespace=self._namespace, uid="", reason=REASON_WARNING,
                    message=f"node {self._node}: {warning}", warning=True,
                )
            except Exception as error:  # the next publish or resync tries again
                log.warning("could not post a warning for Instance %s: %s", instance, error)
                return
        self._warned[instance] = warning

    async def report(self, instance: str, health: Health, *, shared: bool = False) -> None:
        """Write ``health`` for ``instance`` if it differs from what was last written (for a
        shared device, also the first time, with this node's ``status.reported`` mark)."""
        last = self._reported.get(instance)
        if last is None and not shared:
            last = HEALTHY  # absent from status.unhealthy is healthy
        if last == health:
            return
        status: dict[str, Any] = {
            "unhealthy": {self._node: None if health.healthy else health.reason}}
        if shared:
            status[STATUS_REPORTED] = {self._node: True}
        try:
            written = await self._client.patch(
                InstanceResource.Status, instance, {"status": status}, namespace=self._namespace,
                patch_type=PatchType.MERGE, field_manager=field_manager(self._node),
            )
            if last is None and health.healthy:  # a first verdict, not a change: no Event
                self._reported[instance] = health
                return
            uid = str(getattr(written.metadata, "uid", "") or "")
            if health.healthy:
                message = f"device healthy again on node {self._node}"
            else:
                message = f"device unhealthy on node {self._node}: {health.reason}"
            await emit_event(
                self._client, node=self._node, kind=INSTANCE_KIND, name=instance,
                namespace=self._namespace, uid=uid,
                reason=REASON_HEALTHY if health.healthy else REASON_UNHEALTHY,
                message=message, warning=not health.healthy,
            )
        except ApiError as error:
            if is_not_found(error):
                return
            log.warning("could not report health of Instance %s: %s", instance, error)
            return
        except Exception as error:  # connection errors: the next publish or resync retries
            log.warning("could not report health of Instance %s: %s", instance, error)
            return
        self._reported[instance] = health
        log.log(
            logging.INFO if health.healthy else logging.WARNING,
            "device %s", "healthy" if health.healthy else f"unhealthy: {health.reason}",
            extra={"instance": f"{self._namespace}/{instance}", "node": self._node},
        )

    async def unreport(self, instance: str) -> None:
        """Take this node's ``status.reported`` mark off a shared Instance it is leaving: a
        node that joins again counts for its slice only once it has said again. Raises on API
        errors but a missing Instance (the leave is retried)."""
        self.forget(instance)
        try:
            await self._client.patch(
                InstanceResource.Status, instance,
                {"status": {STATUS_REPORTED: {self._node: None}}}, namespace=self._namespace,
                patch_type=PatchType.MERGE, field_manager=field_manager(self._node))
        except ApiError as error:
            if not is_not_found(error):
                raise
