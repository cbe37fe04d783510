"""The Reconciler: turns what the controller sees into writes (brokers, services, status, nodes).

``Reconciler.instance`` brings one Instance's brokers and Service to what it wants;
``configuration``, ``configuration_deleted`` and ``status_soon`` run the Configuration's step
(``controller.brokers.configuration_step``); both write through
``controller.brokers.broker_writes``. Why each step is idempotent and reads no API:
docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from typing import Any, Final

from controller import naming
from controller.brokers import broker_claims, nodes, render, services
from controller.brokers.admission_report import AdmissionReporter
from controller.brokers.broker_writes import BrokerWrites
from controller.brokers.configuration_step import ConfigurationStep, Unselected
from controller.brokers.plans import BrokerPolicy, Deletion, Plan, plan_objects, plan_pods
from controller.kube.client import Kube
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings
from controller.state.records import ConfigurationRecord, InstanceRecord
from controller.state.view import ClusterView, EventSink
from crds.configuration import Configuration
from crds.instance import Instance

log = logging.getLogger(__name__)

#: Broker identities (name, spec hash) remembered, keyed by Configuration generation, Instance
#: and node; the cache is emptied when it grows past this (about 300 bytes an entry).
IDENTITY_CACHE_MAX: Final = 200_000

REASON_INSTANCE_GONE: Final = "InstanceDeleted"


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
        timing = settings.brokers
        self.policy = BrokerPolicy(pending_grace_s=timing.pending_grace_s,
                                   restart_backoff_base_s=timing.restart_backoff_base_s,
                                   restart_backoff_max_s=timing.restart_backoff_max_s)
        self.events = events
        self.metrics = metrics or ControllerMetrics()
        self.admissions = AdmissionReporter(kube=kube, metrics=self.metrics)
        self.writes = BrokerWrites(kube=kube, events=events, metrics=self.metrics,
                                   admissions=self.admissions, settings=timing)
        self.restarts = self.writes.restarts
        self.rejections = self.writes.rejections
        self.nodes = nodes.NodeJanitor(kube=kube, not_ready_grace_s=timing.node_not_ready_grace_s,
                                       missing_grace_s=timing.node_missing_grace_s)
        self._identities: dict[tuple[str, int, str, str, str, str, int], tuple[str, str]] = {}
        self.unselected: Unselected = {}
        self.configurations = ConfigurationStep(writes=self.writes, settings=settings,
                                                unselected=self.unselected)

    # -- one Instance ------------------------------------------------------------------------

    async def instance(
        self, view: ClusterView, namespace: str, name: str, *, configuration: str = ""
    ) -> float | None:
        """Brings one Instance's brokers and service to what it wants; returns the seconds
        until it should run again (a backoff or grace coming due), or None. The caller runs one
        step per Instance at a time (``controller.engine.workqueue``). An Instance that is gone has
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
            await self.writes.apply(config, namespace, pods, kind="Pod")
            await self.writes.apply(config, namespace, jobs, kind="Job")
            await self.writes.apply(config, namespace, svcs, kind="Service")
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
        grace = self.settings.brokers.orphan_instance_grace_s
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
            rendered.get(stub["metadata"]["name"]) or render.render_broker_pod(
                configuration=cfg, instance=inst, node=node_of[stub["metadata"]["name"]]
            )
            for stub in pod_plan.create
        ]
        plan.extend(pod_plan)
        desired_jobs: dict[str, dict[str, Any]] = {}
        if cfg.spec.broker_job_spec is not None and inst.spec.nodes:
            job = render.render_broker_job(configuration=cfg, instance=inst)
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
            template = render.render_claim_template(configuration=cfg, instance=inst)
            await self.writes.apply(config, inst.namespace, Plan(create=[template]),
                              kind=broker_claims.KIND)
        await self.writes.apply(config, inst.namespace, plan, kind="Pod", instance=inst)
        await self.writes.apply(config, inst.namespace, job_plan, kind="Job")
        await self.writes.apply(config, inst.namespace, svc_plan, kind="Service")
        if plan.create and self.writes.recently_refused(cfg):
            plan.wait(self.settings.brokers.refusal_retry_s)
        return plan.retry_after_s

    def _broker_problems(self, cfg: Configuration) -> list[str]:
        return render.validate_broker_spec(cfg, device_classes=self.settings.dra.enabled)

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
            pod = render.render_broker_pod(configuration=cfg, instance=inst, node=node)
            meta = pod["metadata"]
            found = (str(meta["name"]), str(meta["annotations"][naming.ANNOTATION_SPEC_HASH]))
            rendered[found[0]] = pod
            if len(self._identities) >= IDENTITY_CACHE_MAX:
                self._identities.clear()  # rare: stale keys of gone Instances or generations
            self._identities[key] = found
        return found

    # -- one Configuration (controller.brokers.configuration_step) -------------------------------

    async def configuration(self, view: ClusterView, namespace: str, name: str) -> None:
        """The Configuration's own Service and status (``ConfigurationStep.configuration``)."""
        await self.configurations.configuration(view, namespace, name)

    async def configuration_deleted(self, view: ClusterView, namespace: str, name: str) -> None:
        """Deletes the Instances of a deleted Configuration."""
        await self.configurations.configuration_deleted(view, namespace, name)

    def status_soon(self, view: ClusterView, namespace: str, name: str) -> None:
        """Schedules one status recomputation shortly (coalescing bursts of broker events)."""
        self.configurations.status_soon(view, namespace, name)

    async def rejected_pod(self, view: ClusterView, namespace: str, name: str) -> None:
        """A user's pod the kubelet rejected at admission: an Event on what it asked for."""
        pod = view.rejected_pod(namespace, name)
        if pod is not None:
            await self.admissions.user_pod(view, pod)

    async def node_deleted(self, view: ClusterView, node: str) -> None:
        await self.nodes.node_deleted(view, node)
