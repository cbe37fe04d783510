"""The controller's writes of a reconcile plan: creates, deletes and patches, with their memory.

``BrokerWrites.apply`` carries out a ``Plan`` for one Configuration (skipping creates the watch
has not shown yet, holding back after the API server refused one), counts restarts and admission
rejections of the brokers it deletes, and posts the Events. How the steps use it:
docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import logging
import time
from typing import Final

from controller.brokers.admission_report import AdmissionReporter
from controller.brokers.eventbatch import EventBatcher
from controller.brokers.plans import (
    ADMISSION_IMMEDIATE_MAX,
    REASON_ADMISSION,
    REASON_FAILED,
    REASON_FINISHED,
    REASON_PENDING,
    Deletion,
    Plan,
)
from controller.kube.client import Kube, Refused
from controller.metrics import ControllerMetrics
from controller.settings import BrokerSettings
from controller.state.records import ConfigurationRecord
from controller.state.view import EventSink
from crds.configuration import Configuration
from crds.instance import Instance

log = logging.getLogger(__name__)

RECENT_CREATE_PRUNE_AT: Final = 4096

_RESTART_REASONS: Final = (REASON_FAILED, REASON_FINISHED, REASON_PENDING)


class BrokerWrites:
    """Applies plans; remembers restarts, admission rejections, refusals and recent creates."""

    def __init__(
        self, *, kube: Kube, events: EventSink, metrics: ControllerMetrics,
        admissions: AdmissionReporter, settings: BrokerSettings,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.events = events
        self.metrics = metrics
        self.admissions = admissions
        self.routine_events = EventBatcher(events, window_s=settings.event_window_s)
        self.restarts: dict[tuple[str, str], int] = {}
        #: Rejections at admission of each broker (namespace, pod) since it was last Ready.
        self.rejections: dict[tuple[str, str], int] = {}
        self.refusals: dict[tuple[str, str], tuple[int, str]] = {}
        self._refused_at: dict[tuple[str, str], float] = {}
        self._recent_creates: dict[tuple[str, str, str], float] = {}

    async def apply(
        self, config: ConfigurationRecord, namespace: str, plan: Plan, *, kind: str,
        instance: Instance | None = None,
    ) -> None:
        cfg = config.configuration
        for deletion in plan.delete:
            await self._delete(config, namespace, deletion, kind=kind, instance=instance)
        if plan.create and self.recently_refused(cfg):
            return
        for obj in plan.create:
            name = obj["metadata"]["name"]
            if not self._may_create(kind, namespace, name):
                continue
            try:
                created = await self.kube.create(obj)
            except Refused as refused:
                self._refused(config, kind=kind, name=name, message=refused.message)
                return
            if created:
                self.refusals.pop((namespace, cfg.name), None)
                log.info("created %s %s/%s", kind, namespace, name)
                self.routine_events.routine(config.body, reason=f"{kind}Created",
                                            verb="created", kind=kind, name=name)
        for obj in plan.update:
            try:
                await self.kube.merge_patch(obj)
            except Refused as refused:
                self._refused(config, kind=kind, name=obj["metadata"]["name"],
                              message=refused.message)

    def _may_create(self, kind: str, namespace: str, name: str) -> bool:
        """False while this replica created ``name`` moments ago (the watch lags behind)."""
        now = time.monotonic()
        key = (kind, namespace, name)
        # Not created again while the watch has not shown it yet (saves a 409 per broker when
        # a resync overtakes the watch during a burst).
        recent_s = self.settings.recent_create_s
        if now - self._recent_creates.get(key, -recent_s) < recent_s:
            return False
        if len(self._recent_creates) >= RECENT_CREATE_PRUNE_AT:
            self._recent_creates = {
                k: t for k, t in self._recent_creates.items() if now - t < recent_s
            }
        self._recent_creates[key] = now
        return True

    async def _delete(
        self, config: ConfigurationRecord, namespace: str, deletion: Deletion, *, kind: str,
        instance: Instance | None = None,
    ) -> None:
        self._recent_creates.pop((kind, namespace, deletion.name), None)
        if not await self.kube.delete(kind, namespace, deletion.name):
            return
        warning = deletion.reason in (REASON_FAILED, REASON_PENDING, REASON_ADMISSION)
        key = (namespace, deletion.name)
        if deletion.reason in _RESTART_REASONS:
            self.restarts[key] = self.restarts.get(key, 0) + 1
        if deletion.reason == REASON_ADMISSION and instance is not None:
            rejections = self.rejections.get(key, 0)
            self.rejections[key] = rejections + 1
            if rejections >= ADMISSION_IMMEDIATE_MAX:  # recreated after a backoff: it grows
                self.restarts[key] = self.restarts.get(key, 0) + 1
            await self.admissions.broker_rejected(
                instance=instance, configuration=config.configuration.name, pod=deletion.name,
                pod_uid=deletion.uid, message=deletion.message,
            )
        log.info("deleted %s %s/%s: %s", kind, namespace, deletion.name, deletion.message)
        if warning:
            self.events(config.body, warning=True, reason=f"{kind}Deleted",
                        message=f"deleted {kind.lower()} {deletion.name}: {deletion.message}")
        else:
            self.routine_events.routine(config.body, reason=f"{kind}Deleted", verb="deleted",
                                        kind=kind, name=deletion.name, detail=deletion.message)

    def recently_refused(self, cfg: Configuration) -> bool:
        key = (cfg.namespace, cfg.name)
        refusal = self.refusals.get(key)
        if refusal is None or refusal[0] != cfg.generation:
            return False
        refused_at = self._refused_at.get(key)
        retry_s = self.settings.refusal_retry_s
        return refused_at is not None and time.monotonic() - refused_at < retry_s

    def _refused(self, config: ConfigurationRecord, *, kind: str, name: str, message: str) -> None:
        cfg = config.configuration
        key = (cfg.namespace, cfg.name)
        self._refused_at[key] = time.monotonic()
        self.metrics.broker_refusals.labels(cfg.namespace, cfg.name).inc()
        if self.refusals.get(key) != (cfg.generation, message):
            self.refusals[key] = (cfg.generation, message)
            log.warning("API server refused %s %s/%s: %s", kind, cfg.namespace, name, message)
            self.events(config.body, warning=True, reason="BrokerRefused",
                        message=f"{kind.lower()} {name} refused: {message}")
