"""Tell users when a device this node serves is present but unhealthy, and when it recovers.

``HealthReporter.report`` writes ``status.unhealthy.<node>`` where it differs from what the
stored Instance says (``seed``: every write's reply), and one Event per change. For a controller
of the previous release it also writes a shared device's first verdict with
``status.reported.<node>``, and ``unreport`` takes that mark back before the node leaves
(docs/architecture.md, "The agent's discovery modules").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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

    def __init__(self, *, client: AsyncClient, node_name: str, namespace: str,
                 marks_reported: Callable[[], bool] = lambda: False) -> None:
        self._client = client
        self._node = node_name
        self._namespace = namespace
        #: Whether a controller of the previous release reads ``status.reported`` marks.
        self._marks_reported = marks_reported
        self._reported: dict[str, Health] = {}
        self._marked: set[str] = set()  # shared Instances with this node's reported mark
        self._warned: dict[str, str] = {}

    def forget(self, instance: str) -> None:
        self._reported.pop(instance, None)
        self._marked.discard(instance)
        self._warned.pop(instance, None)

    def seed(self, instance: str, stored: Mapping[str, Any]) -> None:
        """Take this node's verdict on ``instance`` from the stored object (a write's reply):
        a mark in ``status.unhealthy``, else healthy."""
        reason = ((stored.get("status") or {}).get("unhealthy") or {}).get(self._node)
        self._reported[instance] = Health.unhealthy(str(reason)) if reason else HEALTHY

    def first_verdict_due(self, instance: str, *, shared: bool) -> bool:
        """Whether ``report`` will write this shared device's first verdict with its
        ``status.reported`` mark (a controller of the previous release waits for it)."""
        return shared and self._marks_reported() and instance not in self._marked

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

    async def report(self, instance: str, health: Health, *, shared: bool = False) -> bool:
        """Write ``health`` for ``instance`` if it differs from the stored verdict (absent from
        ``status.unhealthy`` is healthy; ``first_verdict_due``: also the first time); whether
        the API server holds it now."""
        first = self.first_verdict_due(instance, shared=shared)
        last = self._reported.get(instance, HEALTHY)
        if last == health and not first:
            return True
        status: dict[str, Any] = {
            "unhealthy": {self._node: None if health.healthy else health.reason}}
        if first:
            status[STATUS_REPORTED] = {self._node: True}
        try:
            written = await self._client.patch(
                InstanceResource.Status, instance, {"status": status}, namespace=self._namespace,
                patch_type=PatchType.MERGE, field_manager=field_manager(self._node),
            )
            if first:
                self._marked.add(instance)
            if last == health:  # a first verdict, not a change: no Event
                self._reported[instance] = health
                return True
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
            if not is_not_found(error):
                log.warning("could not report health of Instance %s: %s", instance, error)
            return False
        except Exception as error:  # connection errors: the next publish or resync retries
            log.warning("could not report health of Instance %s: %s", instance, error)
            return False
        self._reported[instance] = health
        log.log(
            logging.INFO if health.healthy else logging.WARNING,
            "device %s", "healthy" if health.healthy else f"unhealthy: {health.reason}",
            extra={"instance": f"{self._namespace}/{instance}", "node": self._node},
        )
        return True

    async def unreport(self, instance: str) -> None:
        """Take this node's ``status.reported`` mark off a shared Instance it is leaving, where
        a controller of the previous release reads it: a node that joins again counts for its
        slice there only once it has said again. Raises on API errors but a missing Instance
        (the leave is retried)."""
        marked = instance in self._marked or self._marks_reported()
        self.forget(instance)
        if not marked:
            return
        try:
            await self._client.patch(
                InstanceResource.Status, instance,
                {"status": {STATUS_REPORTED: {self._node: None}}}, namespace=self._namespace,
                patch_type=PatchType.MERGE, field_manager=field_manager(self._node))
        except ApiError as error:
            if not is_not_found(error):
                raise
