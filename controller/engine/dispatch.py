"""The controller's engine: watches feed the cache, changes become queued keys, workers reconcile.

``Engine.run`` starts the watches and workers; ``enqueue_all`` queues every key. Which changes
queue work, and when workers act: docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from datetime import UTC, datetime
from typing import Any, Final

from controller import naming
from controller.brokers.nodes import remove_node_from_instance
from controller.brokers.pinned_demand import PinnedDemand, PinnedPod, pinned_pod
from controller.brokers.reconciler import Reconciler
from controller.engine.peering import CLUSTER, ActiveGate
from controller.engine.workqueue import WorkQueue
from controller.kube.rest import Rest
from controller.kube.watching import Kind, Watcher, namespaced_path, selector
from controller.settings import ControllerSettings
from controller.state import decode
from controller.state.index import ClusterState
from controller.state.records import (
    FINISHED_PHASES,
    ConfigurationRecord,
    InstanceRecord,
    NodeHealth,
    ObservedPod,
    OwnedObject,
    RejectedPod,
)
from crds.api import CONFIGURATION_PLURAL, GROUP, INSTANCE_PLURAL, VERSION
from crds.pinning import PINNED_DEMAND_ANNOTATION

log = logging.getLogger(__name__)

#: Reconciles running at once (API writes are bounded separately, in ``controller.kube.client``).
WORKERS: Final = 32

INSTANCE: Final = "instance"
CONFIGURATION: Final = "configuration"
CONFIGURATION_DELETED: Final = "configuration-deleted"
NODE_DELETED: Final = "node-deleted"
REJECTED_POD: Final = "rejected-pod"
#: Work on a node: its pinned-demand annotation (controller.brokers.pinned_demand).
PINNED_DEMAND: Final = "pinned-demand"

WorkKey = tuple[str, str, str]  # (what, namespace, name)
Key = tuple[str, str]

_CRD_PREFIX: Final = f"/apis/{GROUP}/{VERSION}"
_BROKER_POD_SELECTOR: Final = selector(
    {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_TARGET_NODE: None}
)
_BROKER_JOB_SELECTOR: Final = selector(
    {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_COMPONENT: naming.COMPONENT_BROKER}
)
#: Users' pods rejected at admission are Failed; the API server filters on the phase (the
#: decoder then keeps only rejections of pods that ask for extended resources).
_FAILED_POD_FIELDS: Final = "status.phase=Failed"
#: Pending pods the scheduler has not bound yet.
_PENDING_POD_FIELDS: Final = "status.phase=Pending"
_SERVICE_SELECTOR: Final = selector(
    {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_CONFIGURATION: None}
)


def _namespaced(record: Any) -> Key:
    return record.namespace, record.name


def _peering_key(where: str, _record: object) -> str:
    return where


def _node_key(record: NodeHealth) -> str:
    return record.name


def _pinned_key(record: PinnedPod) -> Key:
    return record.namespace, record.name


def _instance_key(record: InstanceRecord) -> Key:
    return record.instance.namespace, record.instance.name


def _configuration_key(record: ConfigurationRecord) -> Key:
    return record.configuration.namespace, record.configuration.name


def _moved(old: InstanceRecord, new: InstanceRecord) -> bool:
    """Whether an Instance changed in a way its brokers follow (slot usage and status do not)."""
    a, b = old.instance, new.instance
    return (a.uid, a.spec.nodes, a.spec.configuration_name) != (
        b.uid, b.spec.nodes, b.spec.configuration_name
    )


class Engine:
    """Watches, cache, queue and workers of one controller replica."""

    def __init__(
        self, *, http: Rest, reconciler: Reconciler, settings: ControllerSettings,
        identity: str,
    ) -> None:
        self.http = http
        self.reconciler = reconciler
        self.settings = settings
        self.cache = ClusterState()
        self.queue: WorkQueue[WorkKey] = WorkQueue(
            retry_first_s=settings.engine.queue_retry_first_s,
            retry_max_s=settings.engine.queue_retry_max_s)
        self.gate = ActiveGate(
            identity=identity, priority=settings.peering.priority,
            clusterwide=settings.clusterwide, standalone=settings.peering.name is None,
            on_active=self._became_active, expiry_margin_s=settings.peering.expiry_margin_s,
        )
        self.watchers: list[Watcher[Any, Any]] = []
        self._deleted_in: dict[Key, str] = {}  # Instance gone → its Configuration
        self._pinned_watchers: list[Watcher[Key, PinnedPod]] = []
        self.pinned = PinnedDemand(
            pods=lambda: [p for w in self._pinned_watchers for p in w.store.values()],
            annotations=lambda: {n.name: n.pinned_demand for n in self.cache.nodes()},
            write=lambda node, text: reconciler.kube.annotate_node(
                node, PINNED_DEMAND_ANNOTATION, text),
        )
        self._started = False
        self._build_watchers()

    # -- watches -------------------------------------------------------------------------------

    def _build_watchers(self) -> None:
        namespaces: tuple[str | None, ...] = self.settings.namespaces or (None,)
        for ns in namespaces:
            self._watch(Kind(
                name=f"configurations@{ns or '*'}", decode=decode.configuration,
                path=namespaced_path(_CRD_PREFIX, CONFIGURATION_PLURAL, ns),
                key=_configuration_key,
            ), self._on_configuration)
            self._watch(Kind(
                name=f"instances@{ns or '*'}", decode=decode.instance,
                path=namespaced_path(_CRD_PREFIX, INSTANCE_PLURAL, ns), key=_instance_key,
            ), self._on_instance)
            self._watch(Kind(
                name=f"broker pods@{ns or '*'}", decode=decode.pod,
                path=namespaced_path("/api/v1", "pods", ns), key=_namespaced,
                label_selector=_BROKER_POD_SELECTOR,
            ), self._on_pod)
            self._watch(Kind(
                name=f"broker jobs@{ns or '*'}", decode=decode.job,
                path=namespaced_path("/apis/batch/v1", "jobs", ns), key=_namespaced,
                label_selector=_BROKER_JOB_SELECTOR,
            ), self._on_job)
            self._watch(Kind(
                name=f"services@{ns or '*'}", decode=decode.service,
                path=namespaced_path("/api/v1", "services", ns), key=_namespaced,
                label_selector=_SERVICE_SELECTOR,
            ), self._on_service)
            pinned: Watcher[Key, PinnedPod] = Watcher(http=self.http, kind=Kind(
                name=f"pinned pods@{ns or '*'}", decode=pinned_pod,
                path=namespaced_path("/api/v1", "pods", ns), key=_pinned_key,
                field_selector=_PENDING_POD_FIELDS,
            ), on_change=self._on_pinned_pod)
            self.watchers.append(pinned)
            self._pinned_watchers.append(pinned)
            self._watch(Kind(
                name=f"rejected pods@{ns or '*'}", decode=decode.rejected_pod,
                path=namespaced_path("/api/v1", "pods", ns), key=_namespaced,
                field_selector=_FAILED_POD_FIELDS,
            ), self._on_rejected_pod)
            if self.settings.peering.name is not None:
                plural = "kopfpeerings" if ns is not None else "clusterkopfpeerings"
                self._watch(Kind(
                    name=f"peering@{ns or '*'}", decode=decode.peering,
                    path=namespaced_path("/apis/kopf.dev/v1", plural, ns),
                    key=functools.partial(_peering_key, ns or CLUSTER),
                    field_selector=f"metadata.name={self.settings.peering.name}",
                ), self._on_peering)
        self._watch(Kind(
            name="nodes", decode=decode.node, path="/api/v1/nodes", key=_node_key,
        ), self._on_node)

    def _watch(self, kind: Kind[Any, Any], on_change: Any) -> None:
        self.watchers.append(Watcher(http=self.http, kind=kind, on_change=on_change))

    def _on_configuration(
        self, key: Key, old: ConfigurationRecord | None, new: ConfigurationRecord | None
    ) -> None:
        self.cache.put_configuration(key, old, new)
        namespace, name = key
        if new is None:
            self.queue.add((CONFIGURATION_DELETED, namespace, name))
            return
        finalizers = (new.body.get("metadata") or {}).get("finalizers") or ()
        # Its own status writes come back as events too: a pass only for a new spec.
        if (old is None or old.configuration.generation != new.configuration.generation
                or naming.FINALIZER in finalizers):
            self.queue.add((CONFIGURATION, namespace, name))

    def _on_instance(
        self, key: Key, old: InstanceRecord | None, new: InstanceRecord | None
    ) -> None:
        self.cache.put_instance(key, old, new)
        namespace, name = key
        if new is None:
            assert old is not None
            self._deleted_in[key] = old.instance.spec.configuration_name
        elif old is not None and not _moved(old, new):
            return
        self.queue.add((INSTANCE, namespace, name))

    def _on_pod(self, key: Key, old: ObservedPod | None, new: ObservedPod | None) -> None:
        self.cache.put_pod(key, old, new)
        pod = new or old
        assert pod is not None
        namespace = key[0]
        work = (INSTANCE, namespace, pod.instance)
        if (new is None or new.deleting or new.phase in FINISHED_PHASES
                or (old is not None and old.spec_hash != new.spec_hash)
                or self.cache.instance(namespace, pod.instance) is None):
            self.queue.add(work)
        elif old is None and new.phase == "Pending" and new.created_at is not None:
            # A new broker: look again when it would have been Pending too long.
            age = (datetime.now(UTC) - new.created_at).total_seconds()
            self.queue.add_after(work, self.settings.brokers.pending_grace_s - age)
        if (old is None or new is None or old.ready != new.ready
                or old.deleting != new.deleting) and self.gate.active(namespace):
            self.reconciler.status_soon(self.cache, namespace, pod.configuration)

    def _on_rejected_pod(
        self, key: Key, old: RejectedPod | None, new: RejectedPod | None
    ) -> None:
        self.cache.put_rejected_pod(key, old, new)
        if new is None:
            assert old is not None
            self.reconciler.admissions.forget(old.uid)
        elif old is None or old.uid != new.uid:
            self.queue.add((REJECTED_POD, *key))

    def _on_job(self, key: Key, old: OwnedObject | None, new: OwnedObject | None) -> None:
        self.cache.put_job(key, old, new)
        job = new or old
        assert job is not None
        self.queue.add((INSTANCE, key[0], job.instance))

    def _on_service(self, key: Key, old: OwnedObject | None, new: OwnedObject | None) -> None:
        self.cache.put_service(key, old, new)
        if old is None or (new is not None and new.spec_hash == old.spec_hash):
            return  # created (by this controller) or unchanged
        if old.component == naming.COMPONENT_INSTANCE_SERVICE:
            self.queue.add((INSTANCE, key[0], old.instance))
        else:
            self.queue.add((CONFIGURATION, key[0], old.configuration))

    def _on_pinned_pod(
        self, key: Key, old: PinnedPod | None, new: PinnedPod | None
    ) -> None:
        for node in PinnedDemand.changed_nodes(old, new):
            self.queue.add((PINNED_DEMAND, "", node))

    def _on_node(self, key: str, old: NodeHealth | None, new: NodeHealth | None) -> None:
        self.cache.put_node(key, old, new)
        if new is not None and (old is None or old.pinned_demand != new.pinned_demand):
            self.queue.add((PINNED_DEMAND, "", key))  # written by hand, or by a past run
        if new is None:
            self.queue.add((NODE_DELETED, "", key))
        elif old is None or old.labels != new.labels:
            # A Node seen first, or relabelled: whether a Configuration's nodeSelector selects
            # it decides whether its Instances' brokers run there (Reconciler._selected).
            for namespace, name in self.cache.instances_on(key):
                self.queue.add((INSTANCE, namespace, name))
        elif not new.ready and (old is None or old.ready):
            # NotReady: each Instance on it works out when the grace ends (and sets a timer).
            for namespace, name in self.cache.instances_on(key):
                self.queue.add((INSTANCE, namespace, name))

    def _on_peering(self, key: str, old: Any, new: Any) -> None:
        self.gate.put(key, old, new)

    # -- work ----------------------------------------------------------------------------------

    def _became_active(self, where: str) -> None:
        if self._started:
            self.enqueue_all(where)

    def enqueue_all(self, where: str | None = None) -> None:
        """Queues every Configuration and Instance (in namespace ``where``; all when None or
        cluster-wide), and every gone Instance that still has brokers."""
        everywhere = where is None or where == CLUSTER
        for namespace, name in self.cache.configurations():
            if everywhere or namespace == where:
                self.queue.add((CONFIGURATION, namespace, name))
        for namespace, name in self.cache.instance_keys():
            if everywhere or namespace == where:
                self.queue.add((INSTANCE, namespace, name))
        for namespace, name in self.cache.rejected_pod_keys():
            if everywhere or namespace == where:
                self.queue.add((REJECTED_POD, namespace, name))
        for node in self.pinned.stale_nodes():
            self.queue.add((PINNED_DEMAND, "", node))
        # Brokers of Instances that are gone: deleted while this replica was standby (it saw
        # the deletion but was not the one to act) or while no controller ran.
        for namespace, name in self.cache.instances_with_brokers():
            if (everywhere or namespace == where) and self.cache.instance(namespace, name) is None:
                self.queue.add((INSTANCE, namespace, name))

    async def _handle(self, key: WorkKey) -> None:
        what, namespace, name = key
        configuration = self._deleted_in.pop((namespace, name), "") if what == INSTANCE else ""
        if what == PINNED_DEMAND:
            if self._active_anywhere():
                await self.pinned.sync(name)
            return
        if what == NODE_DELETED:
            for inst_ns, inst in self.cache.instances_on(name):
                if self.gate.active(inst_ns):
                    await remove_node_from_instance(self.reconciler.kube, inst_ns, inst, name)
            self.reconciler.nodes.missing_since.pop(name, None)
            return
        if not self.gate.active(namespace):
            return  # the replica that is active does it; a takeover queues everything again
        if what == INSTANCE:
            wait = await self.reconciler.instance(
                self.cache, namespace, name, configuration=configuration
            )
            if wait is not None:
                self.queue.add_after(key, wait)
        elif what == CONFIGURATION:
            for record in self.cache.instances_of(namespace, name):
                self.queue.add((INSTANCE, namespace, record.instance.name))
            await self.reconciler.configuration(self.cache, namespace, name)
        elif what == REJECTED_POD:
            await self.reconciler.rejected_pod(self.cache, namespace, name)
        elif what == CONFIGURATION_DELETED and self.cache.configuration(namespace, name) is None:
            await self.reconciler.configuration_deleted(self.cache, namespace, name)

    def _active_anywhere(self) -> bool:
        """Active for some namespace this replica serves (Node annotations are cluster-wide;
        the active replica writes them)."""
        if self.settings.clusterwide:
            return self.gate.active(CLUSTER)
        return any(self.gate.active(ns) for ns in self.settings.namespaces)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.engine.resync_interval_s)
            self.enqueue_all()

    async def run(self) -> None:
        """Runs until cancelled: watches first, workers once every watch has listed."""
        tasks = [asyncio.create_task(w.run(), name=w.kind.name) for w in self.watchers]
        try:
            await asyncio.gather(*(w.synced.wait() for w in self.watchers))
            log.info("every watch has listed: %d Instances, %d broker pods",
                     len(self.cache.instance_keys()), self.cache.pod_count())
            self._started = True
            self.enqueue_all()
            tasks += [asyncio.create_task(self.queue.work(self._handle)) for _ in range(WORKERS)]
            tasks.append(asyncio.create_task(self._resync()))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.queue.close()
            self.gate.close()
