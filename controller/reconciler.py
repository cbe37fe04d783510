"""The Reconciler: turns what the controller sees into writes (brokers, services, status,
node cleanup).

Why this exists: the engine (``controller/engine.py``) turns watch events into queued keys and
calls the steps here; this module reads the current state through a :class:`ClusterView` (the
watches' in-memory indices, so a reconcile costs no API reads), asks the pure planners
(``brokers``, ``services``, ``plans``, ``status``) what should exist, and applies the difference
through :class:`controller.kube.Kube`. Every step is idempotent, so a key may run twice, a replica
may restart half-way, and two replicas may overlap during a takeover without ever making a
duplicate. A step returns when it wants to run again (a backoff or grace period coming due).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import Any, Final

from controller import broker_claims, brokers, naming, nodes, services, shared_allocation, status
from controller.admission_report import AdmissionReporter
from controller.eventbatch import EventBatcher
from controller.kube import Kube, Refused
from controller.metrics import ControllerMetrics
from controller.plans import (
    ADMISSION_IMMEDIATE_MAX,
    REASON_ADMISSION,
    REASON_FAILED,
    REASON_FINISHED,
    REASON_PENDING,
    Deletion,
    Plan,
    plan_objects,
    plan_pods,
)
from controller.records import ConfigurationRecord, InstanceRecord
from controller.settings import ControllerSettings
from controller.view import ClusterView, EventSink
from crds.configuration import Configuration
from crds.instance import Instance

log = logging.getLogger(__name__)

#: After the API server refused a broker, creations for that Configuration generation are
#: retried this often at most (the refusal is in its status; a spec change retries at once).
REFUSAL_RETRY_S: Final = 30.0
#: An object this replica created is not created again for this long while the watch has not
#: shown it yet (saves a 409 per broker when a resync overtakes the watch during a burst).
RECENT_CREATE_S: Final = 5.0
RECENT_CREATE_PRUNE_AT: Final = 4096
#: Broker identities (name, spec hash) remembered, keyed by Configuration generation, Instance
#: and node; the cache is emptied when it grows past this (about 300 bytes an entry).
IDENTITY_CACHE_MAX: Final = 200_000
#: Status is recomputed at most this often per Configuration after broker events.
STATUS_DEBOUNCE_S: Final = 1.0

REASON_INSTANCE_GONE: Final = "InstanceDeleted"
_RESTART_REASONS: Final = (REASON_FAILED, REASON_FINISHED, REASON_PENDING)


def _now() -> datetime:
    return datetime.now(UTC)


class Reconciler:
    """Process-wide state (backoff counters, last refusals) and the reconcile steps."""

    def __init__(
        self, *, kube: Kube, settings: ControllerSettings, events: EventSink,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.policy = settings.policy
        self.events = events
        self.routine_events = EventBatcher(events)
        self.restarts: dict[tuple[str, str], int] = {}
        #: Rejections at admission of each broker (namespace, pod) since it was last Ready.
        self.rejections: dict[tuple[str, str], int] = {}
        self.metrics = metrics or ControllerMetrics()
        self.admissions = AdmissionReporter(kube=kube, metrics=self.metrics)
        self.refusals: dict[tuple[str, str], tuple[int, str]] = {}
        self._refused_at: dict[tuple[str, str], float] = {}
        self.nodes = nodes.NodeJanitor(kube=kube, not_ready_grace_s=settings.node_not_ready_grace_s)
        self.invalid_reported: dict[tuple[str, str], int] = {}
        self._recent_creates: dict[tuple[str, str, str], float] = {}
        self._identities: dict[tuple[str, int, str, str, str, str, int], tuple[str, str]] = {}
        self._status_pending: set[tuple[str, str]] = set()
        self._status_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: (namespace, Configuration) → Instance → the nodes of its spec.nodes that the
        #: Configuration's nodeSelector does not select (no broker there; in its status).
        self.unselected: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}

    # -- one Instance ------------------------------------------------------------------------

    async def instance(
        self, view: ClusterView, namespace: str, name: str, *, configuration: str = ""
    ) -> float | None:
        """Brings one Instance's brokers and service to what it wants; returns the seconds
        until it should run again (a backoff or grace coming due), or None. The caller runs one
        step per Instance at a time (``controller.workqueue``). An Instance that is gone has
        its brokers removed; ``configuration`` names its Configuration then, if known."""
        record = view.instance(namespace, name)
        if record is None:
            self._forget_unselected(namespace, configuration, name)
            await self._gone(view, namespace, name, configuration)
            return None
        config = view.configuration(namespace, record.instance.spec.configuration_name)
        if config is None:
            return await self._orphan(record)
        wait = await self._instance(view, config, record)
        self.status_soon(view, namespace, config.configuration.name)
        return wait

    async def _gone(self, view: ClusterView, namespace: str, name: str, configuration: str) -> None:
        """Deletes a gone Instance's brokers and service at once; the garbage collector would
        too (owner references), but only after its own discovery and queue delays."""
        why = "its Instance was deleted"
        pods = Plan(delete=[Deletion(p.name, REASON_INSTANCE_GONE, why)
                            for p in view.broker_pods(namespace, name) if not p.deleting])
        jobs = Plan(delete=[Deletion(j.name, REASON_INSTANCE_GONE, why)
                            for j in view.broker_jobs(namespace, name)])
        configuration = configuration or next(
            (p.configuration for p in view.broker_pods(namespace, name)), ""
        )
        svcs = Plan(delete=[
            Deletion(s.name, REASON_INSTANCE_GONE, why)
            for s in view.services(namespace, configuration)
            if s.component == naming.COMPONENT_INSTANCE_SERVICE and s.instance == name
        ])
        config = view.configuration(namespace, configuration) if configuration else None
        if config is not None:
            await self._apply(config, namespace, pods, kind="Pod")
            await self._apply(config, namespace, jobs, kind="Job")
            await self._apply(config, namespace, svcs, kind="Service")
            self.status_soon(view, namespace, configuration)
            return
        for kind, each in (("Pod", pods), ("Job", jobs), ("Service", svcs)):
            for deletion in each.delete:
                if await self.kube.delete(kind, namespace, deletion.name):
                    log.info("deleted orphaned %s %s/%s", kind, namespace, deletion.name)

    async def _orphan(self, record: InstanceRecord) -> float | None:
        """An Instance whose Configuration does not exist: deleted once older than the grace
        (left over from a Configuration deleted while the controller was down)."""
        inst = record.instance
        age = (_now() - record.created_at).total_seconds() if record.created_at else 0.0
        grace = self.settings.orphan_instance_grace_s
        if age < grace:
            return grace - age
        if await self.kube.delete_instance(inst.namespace, inst.name):
            log.info("deleted Instance %s/%s: its Configuration %s is gone",
                     inst.namespace, inst.name, inst.spec.configuration_name)
        return None

    async def _instance(
        self, view: ClusterView, config: ConfigurationRecord, record: InstanceRecord
    ) -> float | None:
        cfg, inst = config.configuration, record.instance
        node_wait = await self.nodes.release_gone_nodes(view, record)
        # Only the nodes the Configuration selects get brokers: spec.nodes is written by the
        # agents, and a node's token may list its node in any shared Instance (the Instance
        # policy cannot see the Configuration), so a node listed but not selected is shown in
        # the status, never obeyed.
        selected = tuple(n for n in inst.spec.nodes if self._selected(view, cfg, n))
        self._note_unselected(cfg, inst, selected)
        if len(selected) != len(inst.spec.nodes):
            inst = dataclasses.replace(inst, spec=dataclasses.replace(inst.spec, nodes=selected))
        if self._broker_problems(cfg):
            return node_wait  # the status says why; running brokers are left as they are
        plan = Plan()
        if node_wait is not None:
            plan.wait(node_wait)
        pods = view.broker_pods(inst.namespace, inst.name)
        for pod in pods:
            if pod.ready:
                self.restarts.pop((inst.namespace, pod.name), None)
                self.rejections.pop((inst.namespace, pod.name), None)
        # What each broker should be, by name and spec hash (remembered: a resync of an
        # unchanged Instance renders nothing); the full pod only for one to create.
        desired_pods: dict[str, dict[str, Any]] = {}
        rendered: dict[str, dict[str, Any]] = {}
        node_of: dict[str, str] = {}
        if cfg.spec.broker_pod_spec is not None:
            for node in inst.spec.nodes:
                name, digest = self._broker_identity(cfg, inst, node, rendered)
                desired_pods[name] = {
                    "metadata": {"name": name, "annotations": {naming.ANNOTATION_SPEC_HASH: digest}}
                }
                node_of[name] = node
        pod_plan = plan_pods(
            desired=desired_pods, actual=pods, now=_now(), policy=self.policy,
            restarts={pod.name: self.restarts.get((inst.namespace, pod.name), 0) for pod in pods},
            admissions={p.name: self.rejections.get((inst.namespace, p.name), 0) for p in pods},
        )
        pod_plan.create = [
            rendered.get(stub["metadata"]["name"]) or brokers.render_broker_pod(
                configuration=cfg, instance=inst, node=node_of[stub["metadata"]["name"]]
            )
            for stub in pod_plan.create
        ]
        plan.extend(pod_plan)
        desired_jobs: dict[str, dict[str, Any]] = {}
        if cfg.spec.broker_job_spec is not None and inst.spec.nodes:
            job = brokers.render_broker_job(configuration=cfg, instance=inst)
            desired_jobs[job["metadata"]["name"]] = job
        jobs = view.broker_jobs(inst.namespace, inst.name)
        job_plan = plan_objects(
            desired=desired_jobs, actual={j.name: j.spec_hash for j in jobs}, update_in_place=False
        )
        wants_brokers = bool(desired_pods or desired_jobs)
        svc = services.render_instance_service(configuration=cfg, instance=inst)
        desired_svcs = {svc["metadata"]["name"]: svc} if svc is not None and wants_brokers else {}
        actual_svcs = {
            s.name: s.spec_hash
            for s in view.services(inst.namespace, cfg.name)
            if s.component == naming.COMPONENT_INSTANCE_SERVICE and s.instance == inst.name
        }
        svc_plan = plan_objects(desired=desired_svcs, actual=actual_svcs, update_in_place=True)
        if broker_claims.uses_claims(cfg) and (pod_plan.create or job_plan.create):
            # The template the new brokers' claims are made from, first (a 409 when it exists).
            template = brokers.render_claim_template(configuration=cfg, instance=inst)
            await self._apply(config, inst.namespace, Plan(create=[template]),
                              kind=broker_claims.KIND)
        await self._apply(config, inst.namespace, plan, kind="Pod", instance=inst)
        await self._apply(config, inst.namespace, job_plan, kind="Job")
        await self._apply(config, inst.namespace, svc_plan, kind="Service")
        if plan.create and self._recently_refused(cfg):
            plan.wait(REFUSAL_RETRY_S)
        return plan.retry_after_s

    def _broker_problems(self, cfg: Configuration) -> list[str]:
        return brokers.validate_broker_spec(cfg, device_classes=self.settings.dra)

    @staticmethod
    def _selected(view: ClusterView, cfg: Configuration, node: str) -> bool:
        """Whether ``cfg``'s nodeSelector selects ``node`` (no selector: every node; a Node
        the controller does not know is not shown selected, so it gets no broker until it is)."""
        selector = cfg.spec.node_selector
        if selector is None:
            return True
        health = view.node(node)
        return health is not None and selector.matches(health.label_map())

    def _note_unselected(self, cfg: Configuration, inst: Instance,
                         selected: tuple[str, ...]) -> None:
        key = (cfg.namespace, cfg.name)
        left_out = tuple(sorted(n for n in inst.spec.nodes if n not in selected))
        noted = self.unselected.get(key, {})
        if noted.get(inst.name, ()) == left_out:
            return
        if left_out:
            log.warning("Instance %s/%s lists node(s) %s, which Configuration %s's nodeSelector "
                        "does not select: no broker there", inst.namespace, inst.name,
                        ", ".join(left_out), cfg.name)
            self.unselected.setdefault(key, {})[inst.name] = left_out
        else:
            self._forget_unselected(cfg.namespace, cfg.name, inst.name)

    def _forget_unselected(self, namespace: str, configuration: str, instance: str) -> None:
        """Drops ``instance``'s entry (every Configuration of ``namespace`` when
        ``configuration`` is unknown: a gone Instance's may be)."""
        keys = ([(namespace, configuration)] if configuration else
                [k for k in self.unselected if k[0] == namespace])
        for key in keys:
            noted = self.unselected.get(key)
            if noted is not None:
                noted.pop(instance, None)
                if not noted:
                    del self.unselected[key]

    def _broker_identity(
        self, cfg: Configuration, inst: Instance, node: str, rendered: dict[str, dict[str, Any]]
    ) -> tuple[str, str]:
        """(name, spec hash) of the broker ``inst`` should have on ``node``; a pod rendered to
        learn them is left in ``rendered``."""
        key = (cfg.uid, cfg.generation, inst.namespace, inst.name, inst.uid, node,
               hash(frozenset(inst.spec.broker_properties.items())))
        found = self._identities.get(key)
        if found is None:
            pod = brokers.render_broker_pod(configuration=cfg, instance=inst, node=node)
            meta = pod["metadata"]
            found = (str(meta["name"]), str(meta["annotations"][naming.ANNOTATION_SPEC_HASH]))
            rendered[found[0]] = pod
            if len(self._identities) >= IDENTITY_CACHE_MAX:
                self._identities.clear()  # rare: stale keys of gone Instances or generations
            self._identities[key] = found
        return found

    async def _apply(
        self, config: ConfigurationRecord, namespace: str, plan: Plan, *, kind: str,
        instance: Instance | None = None,
    ) -> None:
        cfg = config.configuration
        for deletion in plan.delete:
            await self._delete(config, namespace, deletion, kind=kind, instance=instance)
        if plan.create and self._recently_refused(cfg):
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
        if now - self._recent_creates.get(key, -RECENT_CREATE_S) < RECENT_CREATE_S:
            return False
        if len(self._recent_creates) >= RECENT_CREATE_PRUNE_AT:
            self._recent_creates = {
                k: t for k, t in self._recent_creates.items() if now - t < RECENT_CREATE_S
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

    def _recently_refused(self, cfg: Configuration) -> bool:
        key = (cfg.namespace, cfg.name)
        refusal = self.refusals.get(key)
        if refusal is None or refusal[0] != cfg.generation:
            return False
        refused_at = self._refused_at.get(key)
        return refused_at is not None and time.monotonic() - refused_at < REFUSAL_RETRY_S

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

    # -- one Configuration -------------------------------------------------------------------

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
        self.refusals.pop((namespace, name), None)
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
        svc = services.render_configuration_service(configuration=cfg)
        wanted = svc is not None and counts.desired > 0 and not self._broker_problems(cfg)
        desired = {svc["metadata"]["name"]: svc} if svc is not None and wanted else {}
        actual = {
            s.name: s.spec_hash
            for s in view.services(namespace, name)
            if s.component == naming.COMPONENT_CONFIGURATION_SERVICE
        }
        await self._apply(
            config, namespace,
            plan_objects(desired=desired, actual=actual, update_in_place=True), kind="Service",
        )
        refusal = self.refusals.get((namespace, name))
        current = config.body.get("status") or {}
        problems = self._broker_problems(cfg)
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
        if not self.settings.dra:
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
                await asyncio.sleep(STATUS_DEBOUNCE_S)
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

    async def rejected_pod(self, view: ClusterView, namespace: str, name: str) -> None:
        """A user's pod the kubelet rejected at admission: an Event on what it asked for."""
        pod = view.rejected_pod(namespace, name)
        if pod is not None:
            await self.admissions.user_pod(view, pod)

    async def node_deleted(self, view: ClusterView, node: str) -> None:
        await self.nodes.node_deleted(view, node)
