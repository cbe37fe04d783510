"""The kopf face of the controller: indices and thin handlers that call the reconciler.

Why this exists: kopf does the watching, the in-memory indexing, the peering between replicas
(only the active one runs handlers; the others are paused) and the posting of Events. Each index
keeps just what the reconciler needs (small records, not whole objects), and kopf starts the
handlers only once every index holds the initial listing, so a restarted replica sees every
existing broker before it creates any. Handlers are ``on.event`` only: no annotations written
on the objects and no finalizer (a finalizer would make deleting a Configuration hang while the
controller is down). The net under missed events, backoffs and grace periods is one resync loop
(``controller.resync``), started and stopped here with the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Final

import kopf

from controller import naming
from controller.converge import Reconciler
from controller.nodes import NodeHealth
from controller.reconcile import ObservedPod, parse_time
from controller.resync import Peering, Resync
from controller.view import ConfigurationRecord, InstanceRecord, OwnedObject
from crds.api import CONFIGURATION_PLURAL, GROUP, INSTANCE_PLURAL, VERSION
from crds.configuration import Configuration
from crds.instance import Instance

_Labels = Mapping[str, Any]  # str or kopf.PRESENT
_MANAGED: Final[_Labels] = {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
# Broker pods carry the target-node label; a broker Job's pods do not (they are the Job's).
_BROKER_POD_LABELS: Final[_Labels] = {**_MANAGED, naming.LABEL_TARGET_NODE: kopf.PRESENT}
_BROKER_JOB_LABELS: Final[_Labels] = {**_MANAGED, naming.LABEL_COMPONENT: naming.COMPONENT_BROKER}
_SERVICE_LABELS: Final[_Labels] = {**_MANAGED, naming.LABEL_CONFIGURATION: kopf.PRESENT}


def _values(index: Any, key: object) -> list[Any]:
    store = index.get(key)
    return list(store) if store is not None else []


class IndexView:
    """A :class:`controller.converge.ClusterView` over kopf's live indices."""

    def __init__(self, indices: Mapping[str, Any]) -> None:
        self._i = indices

    def configuration(self, namespace: str, name: str) -> ConfigurationRecord | None:
        found = _values(self._i["ep_configurations"], (namespace, name))
        return found[0] if found else None

    def instance(self, namespace: str, name: str) -> InstanceRecord | None:
        found = _values(self._i["ep_instances"], (namespace, name))
        return found[0] if found else None

    def instances_of(self, namespace: str, configuration: str) -> list[InstanceRecord]:
        names = _values(self._i["ep_instances_by_configuration"], (namespace, configuration))
        records = (self.instance(namespace, name) for name in names)
        return [record for record in records if record is not None]

    def instances_on(self, node: str) -> list[tuple[str, str]]:
        return _values(self._i["ep_instances_by_node"], node)

    def broker_pods(self, namespace: str, instance: str) -> list[ObservedPod]:
        return _values(self._i["ep_broker_pods"], (namespace, instance))

    def broker_jobs(self, namespace: str, instance: str) -> list[OwnedObject]:
        return _values(self._i["ep_broker_jobs"], (namespace, instance))

    def services(self, namespace: str, configuration: str) -> list[OwnedObject]:
        return _values(self._i["ep_services"], (namespace, configuration))

    def node(self, name: str) -> NodeHealth | None:
        found = _values(self._i["ep_nodes"], name)
        return found[0] if found else None

    def pod_broker_counts(self, namespace: str, configuration: str) -> tuple[int, int, int]:
        key = (namespace, configuration)
        nodes = self._i["ep_node_counts_by_configuration"].get(key)
        ready = self._i["ep_ready_brokers_by_configuration"].get(key)
        return (
            len(nodes) if nodes is not None else 0,
            sum(nodes) if nodes is not None else 0,
            len(ready) if ready is not None else 0,
        )

    def configurations(self) -> list[tuple[str, str]]:
        """The (namespace, name) of every Configuration in the index."""
        return [key for key in self._i["ep_configurations"] if isinstance(key, tuple)]


def _owned(body: Mapping[str, Any], *, ready: bool = False) -> OwnedObject:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return OwnedObject(
        name=str(meta.get("name", "")),
        spec_hash=str((meta.get("annotations") or {}).get(naming.ANNOTATION_SPEC_HASH, "")),
        component=str(labels.get(naming.LABEL_COMPONENT, "")),
        instance=str(labels.get(naming.LABEL_INSTANCE, "")),
        ready=ready,
    )


def _instance_record(body: Mapping[str, Any]) -> InstanceRecord:
    return InstanceRecord(
        instance=Instance.from_object(body),
        created_at=parse_time((body.get("metadata") or {}).get("creationTimestamp")),
    )


def _is_deleted(event: Mapping[str, Any]) -> bool:
    return event.get("type") == "DELETED"


#: Broker pod phases in which a watch event asks nothing of the planner (failed or finished
#: brokers are restarted, deleted ones recreated: those events do go to it).
_LIVE_PHASES: Final = frozenset({"Pending", "Running"})


def _needs_no_plan(event: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    meta = body.get("metadata") or {}
    phase = (body.get("status") or {}).get("phase")
    return not _is_deleted(event) and not meta.get("deletionTimestamp") and phase in _LIVE_PHASES


def register(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, *, peering: Peering | None = None
) -> None:
    """Registers the controller's indices, handlers and resync loop in ``registry``; with
    ``peering``, the loop resyncs only where this replica is the active one."""
    cfgs = (GROUP, VERSION, CONFIGURATION_PLURAL)
    insts = (GROUP, VERSION, INSTANCE_PLURAL)
    loop_task: list[asyncio.Task[None]] = []

    def handling(kw: Mapping[str, Any]) -> None:
        """Starts the resync loop at the first handler call: kopf runs handlers only once every
        index holds its initial listing, and the loop inherits this call's context, in which
        kopf's Event queue is set (a task started elsewhere could not post Events)."""
        if loop_task:
            return
        view = IndexView({key: kw[key] for key in kw if key.startswith("ep_")})
        resync = Resync(
            reconciler=reconciler, view=lambda: view, configurations=view.configurations,
            peering=peering, interval_s=reconciler.settings.resync_interval_s,
        )
        loop_task.append(asyncio.get_running_loop().create_task(resync.run()))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    # -- indices -----------------------------------------------------------------------------
    # ``async`` although they never await: kopf runs a plain function in a thread pool, a
    # thread hand-off per object event (tens of thousands at scale) for microseconds of work.

    @kopf.index(*cfgs, id="ep_configurations", registry=registry)
    async def ep_configurations(body: kopf.Body, **_: Any) -> dict[object, ConfigurationRecord]:
        raw = dict(body)
        meta = raw.get("metadata") or {}
        slim = {
            "apiVersion": raw.get("apiVersion"),
            "kind": raw.get("kind"),
            "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
            "status": raw.get("status") or {},
        }
        record = ConfigurationRecord(Configuration.from_object(raw), slim)
        return {(meta.get("namespace"), meta.get("name")): record}

    @kopf.index(*insts, id="ep_instances", registry=registry)
    async def ep_instances(body: kopf.Body, **_: Any) -> dict[object, InstanceRecord]:
        record = _instance_record(dict(body))
        return {(record.instance.namespace, record.instance.name): record}

    @kopf.index(*insts, id="ep_instances_by_configuration", registry=registry)
    async def ep_instances_by_configuration(body: kopf.Body, **_: Any) -> dict[object, str]:
        # Names only: the records live once, in ep_instances.
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        key = (meta.get("namespace"), spec.get("configurationName"))
        return {key: str(meta.get("name"))}

    @kopf.index(*insts, id="ep_node_counts_by_configuration", registry=registry)
    async def ep_node_counts_by_configuration(body: kopf.Body, **_: Any) -> dict[object, int]:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        key = (meta.get("namespace"), spec.get("configurationName"))
        return {key: len(spec.get("nodes") or [])}

    @kopf.index(*insts, id="ep_instances_by_node", registry=registry)
    async def ep_instances_by_node(body: kopf.Body, **_: Any) -> dict[object, tuple[str, str]]:
        inst = Instance.from_object(dict(body))
        return {node: (inst.namespace, inst.name) for node in inst.spec.nodes}

    @kopf.index("pods", id="ep_broker_pods", labels=_BROKER_POD_LABELS, registry=registry)
    async def ep_broker_pods(body: kopf.Body, **_: Any) -> dict[object, ObservedPod]:
        raw = dict(body)
        meta = raw.get("metadata") or {}
        instance = (meta.get("labels") or {}).get(naming.LABEL_INSTANCE)
        return {(meta.get("namespace"), instance): ObservedPod.from_object(raw)}

    @kopf.index("pods", id="ep_ready_brokers_by_configuration", labels=_BROKER_POD_LABELS,
                registry=registry)
    async def ep_ready_brokers_by_configuration(body: kopf.Body, **_: Any) -> dict[object, str]:
        raw = dict(body)
        pod = ObservedPod.from_object(raw)
        if not pod.ready or pod.deleting:
            return {}
        meta = raw.get("metadata") or {}
        configuration = (meta.get("labels") or {}).get(naming.LABEL_CONFIGURATION)
        return {(meta.get("namespace"), configuration): pod.name}

    @kopf.index("batch", "v1", "jobs", id="ep_broker_jobs", labels=_BROKER_JOB_LABELS,
                registry=registry)
    async def ep_broker_jobs(body: kopf.Body, **_: Any) -> dict[object, OwnedObject]:
        raw = dict(body)
        status = raw.get("status") or {}
        ready = bool(status.get("succeeded") or status.get("ready"))
        record = _owned(raw, ready=ready)
        return {((raw.get("metadata") or {}).get("namespace"), record.instance): record}

    @kopf.index("services", id="ep_services", labels=_SERVICE_LABELS, registry=registry)
    async def ep_services(body: kopf.Body, **_: Any) -> dict[object, OwnedObject]:
        raw = dict(body)
        meta = raw.get("metadata") or {}
        configuration = (meta.get("labels") or {}).get(naming.LABEL_CONFIGURATION)
        return {(meta.get("namespace"), configuration): _owned(raw)}

    @kopf.index("nodes", id="ep_nodes", registry=registry)
    async def ep_nodes(body: kopf.Body, **_: Any) -> dict[object, NodeHealth]:
        health = NodeHealth.from_object(dict(body))
        return {health.name: health}

    # -- the resync loop ---------------------------------------------------------------------

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        for task in loop_task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        loop_task.clear()

    # -- handlers ----------------------------------------------------------------------------

    @kopf.on.event(*cfgs, registry=registry)
    async def configuration_event(**kw: Any) -> None:
        handling(kw)
        view, namespace, name = IndexView(kw), kw["namespace"], kw["name"]
        if _is_deleted(kw["event"]):
            await reconciler.configuration_deleted(view, namespace, name)
        else:
            await reconciler.configuration_changed(view, namespace, name)

    @kopf.on.event(*insts, registry=registry)
    async def instance_event(**kw: Any) -> None:
        handling(kw)
        view, namespace, name = IndexView(kw), kw["namespace"], kw["name"]
        if _is_deleted(kw["event"]):
            configuration = str((kw["body"].get("spec") or {}).get("configurationName", ""))
            await reconciler.instance_deleted(view, namespace, name, configuration)
        else:
            await reconciler.instance(view, namespace, name)

    @kopf.on.event("pods", labels=_BROKER_POD_LABELS, registry=registry)
    async def broker_pod_event(**kw: Any) -> None:
        view, namespace = IndexView(kw), kw["namespace"]
        instance = kw["labels"][naming.LABEL_INSTANCE]
        if _needs_no_plan(kw["event"], kw["body"]) and view.instance(namespace, instance):
            # A live broker moved on (scheduled, started, became ready): only the counts in
            # the status can change. Grace periods are the resync's.
            configuration = str(kw["labels"].get(naming.LABEL_CONFIGURATION, ""))
            reconciler.status_soon(view, namespace, configuration)
            return
        await reconciler.instance(view, namespace, instance)

    @kopf.on.event("batch", "v1", "jobs", labels=_BROKER_JOB_LABELS, registry=registry)
    async def broker_job_event(**kw: Any) -> None:
        instance = kw["labels"][naming.LABEL_INSTANCE]
        await reconciler.instance(IndexView(kw), kw["namespace"], instance)

    @kopf.on.event("nodes", registry=registry)
    async def node_event(**kw: Any) -> None:
        handling(kw)
        if _is_deleted(kw["event"]):
            await reconciler.node_deleted(IndexView(kw), kw["name"])
