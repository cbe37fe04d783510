"""The reconcile step of one Configuration: its Service, its status, and its end.

``ConfigurationStep.configuration`` brings a Configuration's own Service and status to what its
brokers show (``status_soon`` coalesces bursts of broker events into one write);
``configuration_deleted`` deletes its Instances. The per-Instance broker step is
``controller.brokers.reconciler``; both apply plans through ``controller.brokers.broker_writes``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from controller import naming
from controller.brokers import render, services, status
from controller.brokers.broker_writes import BrokerWrites
from controller.brokers.plans import plan_objects
from controller.dra import shared_allocation
from controller.settings import ControllerSettings
from controller.state.records import ConfigurationRecord
from controller.state.view import ClusterView

log = logging.getLogger(__name__)


#: (namespace, Configuration) → Instance → the nodes of its spec.nodes that the
#: Configuration's nodeSelector does not select (no broker there; in its status).
Unselected = dict[tuple[str, str], dict[str, tuple[str, ...]]]


def _now() -> datetime:
    return datetime.now(UTC)


class ConfigurationStep:
    """The Configuration-level step; ``unselected`` is shared with the Instance step."""

    def __init__(
        self, *, writes: BrokerWrites, settings: ControllerSettings, unselected: Unselected,
    ) -> None:
        self.writes = writes
        self.kube = writes.kube
        self.settings = settings
        self.metrics = writes.metrics
        self.events = writes.events
        self.unselected = unselected
        self.invalid_reported: dict[tuple[str, str], int] = {}
        self._status_pending: set[tuple[str, str]] = set()
        self._status_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def configuration(self, view: ClusterView, namespace: str, name: str) -> None:
        """What belongs to the Configuration itself: its service, its status, and the release
        of a finalizer an older version of the controller left on it. (Its Instances are
        reconciled one by one; the caller queues them.)"""
        config = view.configuration(namespace, name)
        if config is None:
            return
        finalizers = list((config.body.get("metadata") or {}).get("finalizers") or [])
        if naming.FINALIZER in finalizers:
            remaining = [f for f in finalizers if f != naming.FINALIZER]
            await self.kube.set_configuration_finalizers(namespace, name, remaining)
            log.info("released the %s finalizer on Configuration %s/%s", naming.FINALIZER,
                     namespace, name)
        await self.configuration_service_and_status(view, namespace, name)

    async def configuration_deleted(self, view: ClusterView, namespace: str, name: str) -> None:
        """Deletes the Instances of a deleted Configuration (their brokers and services follow
        through owner references); the Configuration service goes through its own."""
        for record in view.instances_of(namespace, name):
            await self.kube.delete_instance(namespace, record.instance.name)
        self.writes.refusals.pop((namespace, name), None)
        self.unselected.pop((namespace, name), None)
        self.metrics.forget_configuration(namespace, name)

    def _counts(self, view: ClusterView, config: ConfigurationRecord) -> status.BrokerCounts:
        cfg = config.configuration
        instances, desired, ready = view.pod_broker_counts(cfg.namespace, cfg.name)
        unselected = self.unselected.get((cfg.namespace, cfg.name), {})
        if cfg.spec.broker_pod_spec is not None:
            desired -= sum(len(nodes) for nodes in unselected.values())
            return status.BrokerCounts(instances=instances, desired=max(desired, 0), ready=ready)
        desired = ready = 0
        if cfg.spec.broker_job_spec is not None:
            for record in view.instances_of(cfg.namespace, cfg.name):
                nodes = record.instance.spec.nodes
                if len(unselected.get(record.instance.name, ())) < len(nodes):
                    desired += 1
                    ready += any(
                        j.ready for j in view.broker_jobs(cfg.namespace, record.instance.name)
                    )
        return status.BrokerCounts(instances=instances, desired=desired, ready=ready)

    async def configuration_service_and_status(
        self, view: ClusterView, namespace: str, name: str
    ) -> None:
        config = view.configuration(namespace, name)
        if config is None:
            return
        cfg = config.configuration
        counts = self._counts(view, config)
        self.metrics.set_brokers(namespace, name, counts.desired, counts.ready)
        problems = render.validate_broker_spec(cfg, device_classes=self.settings.dra.enabled)
        svc = services.render_configuration_service(configuration=cfg)
        wanted = svc is not None and counts.desired > 0 and not problems
        desired = {svc["metadata"]["name"]: svc} if svc is not None and wanted else {}
        actual = {
            s.name: s.spec_hash
            for s in view.services(namespace, name)
            if s.component == naming.COMPONENT_CONFIGURATION_SERVICE
        }
        await self.writes.apply(
            config, namespace,
            plan_objects(desired=desired, actual=actual, update_in_place=True), kind="Service",
        )
        refusal = self.writes.refusals.get((namespace, name))
        current = config.body.get("status") or {}
        self._report_invalid(config, problems)
        new = status.desired_status(
            generation=cfg.generation,
            counts=counts,
            has_broker_spec=cfg.spec.has_broker,
            spec_problems=problems,
            refusal=refusal[1] if refusal and refusal[0] == cfg.generation else None,
            current=current,
            now=_now(),
            unselected=self.unselected.get((namespace, name), {}),
        )
        if not self.settings.dra.enabled:
            # No DeviceClasses, so nothing maps extended resources: the device plugins allocate
            # the devices, and the status says so (with --dra, DeviceClasses writes it).
            asked = cfg.spec.allocator
            decision = shared_allocation.decide(
                asked, missing=shared_allocation.CONTROLLER_WITHOUT_DRA)
            new.update(shared_allocation.mode_fields(decision))
            new["conditions"].append(shared_allocation.condition(
                decision, generation=cfg.generation, current=current, now=_now()))
        if status.needs_write(current, new):
            await self.kube.apply_configuration_status(namespace, name, new)

    def _report_invalid(self, config: ConfigurationRecord, problems: list[str]) -> None:
        """One Warning Event per generation of a Configuration with an invalid broker spec."""
        cfg = config.configuration
        key = (cfg.namespace, cfg.name)
        if not problems:
            self.invalid_reported.pop(key, None)
        elif self.invalid_reported.get(key) != cfg.generation:
            self.invalid_reported[key] = cfg.generation
            log.warning("Configuration %s/%s: invalid broker spec: %s", cfg.namespace, cfg.name,
                        "; ".join(problems))
            self.events(config.body, warning=True, reason="InvalidBrokerSpec",
                        message="; ".join(problems))

    def status_soon(self, view: ClusterView, namespace: str, name: str) -> None:
        """Schedules one status recomputation shortly (coalescing bursts of broker events)."""
        key = (namespace, name)
        if key in self._status_pending:
            return
        self._status_pending.add(key)

        async def later() -> None:
            try:
                await asyncio.sleep(self.settings.brokers.status_debounce_s)
                # One status write in flight per Configuration: while the API server is slow,
                # writes queue behind each other instead of piling up (each one is stale).
                async with self._status_locks.setdefault(key, asyncio.Lock()):
                    self._status_pending.discard(key)
                    await self.configuration_service_and_status(view, namespace, name)
            except Exception as error:  # a background task: log it, the next pass retries
                log.warning("status of Configuration %s/%s not written: %s", namespace, name,
                            error)
            finally:
                self._status_pending.discard(key)

        task = asyncio.get_running_loop().create_task(later())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
