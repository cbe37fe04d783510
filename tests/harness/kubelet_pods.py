"""The emulated kubelet's pod side: watch the node's pods, admit them with devices, report them.

A pod that asks for an extended resource only gets its device after the kubelet
admits it: picks free healthy device ids, asks the plugin (GetPreferredAllocation when offered,
Allocate) for each container, then starts the containers in order (PreStartContainer when asked,
CDI names resolved by the runtime), or rejects the pod with
``UnexpectedAdmissionError`` when that fails. ``PodManager`` does the same for the pods the real
scheduler binds to the emulated node, one pod at a time in watch order (as the kubelet admits
pods serially), records what each Allocate returned, and confirms deletions as a kubelet does.
Given a DRA manager (``tests.harness.kubelet_dra``), it prepares a pod's claims before its
containers start and has the runtime resolve their CDI ids too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc.aio
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.models.core_v1 import Container
from lightkube.resources.core_v1 import Pod
from lightkube.types import OnErrorAction, OnErrorResult
from lightkube.utils.quantity import parse_quantity

from tests.harness.aio_process import cancel_and_wait
from tests.harness.cdi import CdiEdits
from tests.harness.kubelet_cdi import (
    CREATE_CONTAINER_CONFIG_ERROR,
    ContainerCreateError,
    resolve_cdi,
)
from tests.harness.kubelet_devices import (
    DeviceManager,
    PluginEndpoint,
    PluginGone,
    cancelled_by_caller,
)
from tests.harness.kubelet_dra import ClaimUse, DraManager, PrepareError
from tests.harness.kubelet_records import ContainerAllocation, is_extended_resource_name

log = logging.getLogger(__name__)

#: A pod arriving while its resource's plugin is (re)connecting waits this long for it
#: before it is rejected (the plugin re-registers right after an emulated kubelet restart).
PLUGIN_WAIT_S = 10.0
PLUGIN_WAIT_POLL_S = 0.05
#: Pause before re-opening a failed pod watch, growing with consecutive failures up to the max.
WATCH_RETRY_S = 0.2
WATCH_RETRY_MAX_S = 5.0
#: How often the node's pods are listed to release pods whose deletion a broken watch missed.
RESYNC_INTERVAL_S = 30.0
#: Attempts (with WATCH_RETRY_S pauses) at writing a pod's status before giving up on it.
STATUS_ATTEMPTS = 5
FIELD_MANAGER = "edgeplug-node-emulator"
ADMISSION_ERROR = "UnexpectedAdmissionError"


class AdmissionError(Exception):
    """The kubelet cannot give a pod its devices; the pod fails."""


@dataclass
class PodRecord:
    namespace: str
    name: str
    uid: str
    containers: tuple[str, ...]
    allocations: list[ContainerAllocation] = field(default_factory=list)
    claims: list[ClaimUse] = field(default_factory=list)  # prepared by the DRA manager
    #: What the runtime injected into each container that uses a claim (by container name).
    claim_edits: dict[str, CdiEdits] = field(default_factory=dict)
    live: bool = True  # admitted and not deleted: holds its devices
    seen_at: float = 0.0  # event-loop time the watch first delivered the pod


def _retry_watch(_error: Exception, count: int) -> OnErrorResult:
    return OnErrorResult(OnErrorAction.RETRY, sleep=min(WATCH_RETRY_S * count, WATCH_RETRY_MAX_S))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def extended_requests(container: Container) -> Iterator[tuple[str, int]]:
    """(resource, count) for each extended resource a container asks for (limits win)."""
    resources = container.resources
    if resources is None:
        return
    wanted = {**(resources.requests or {}), **(resources.limits or {})}
    for name, quantity in sorted(wanted.items()):
        if is_extended_resource_name(name):
            count = parse_quantity(str(quantity))
            if count is not None and int(count) > 0:
                yield name, int(count)


class PodManager:
    """Admits the pods bound to one node and remembers their device allocations."""

    def __init__(self, *, client: AsyncClient, node_name: str, devices: DeviceManager,
                 cdi_spec_dirs: Sequence[Path] | None = None,
                 dra: DraManager | None = None) -> None:
        """``dra``: the DRA manager that prepares pods' claims (None: claims are ignored)."""
        self._client = client
        self._dra = dra
        self.node_name = node_name
        self._devices = devices
        self.cdi_spec_dirs = cdi_spec_dirs  # None: a runtime with CDI disabled
        self.records: dict[str, PodRecord] = {}  # by pod uid
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> newest uid
        self._tasks: list[asyncio.Task[None]] = []
        self._unprepares: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name=f"pods of {self.node_name}"),
            asyncio.create_task(self._resync(), name=f"pod resync of {self.node_name}"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks, *self._unprepares)
        self._tasks = []

    # -- queries ---------------------------------------------------------------------------

    def record(self, namespace: str, name: str) -> PodRecord | None:
        uid = self._by_name.get((namespace, name))
        return self.records.get(uid) if uid is not None else None

    def live_records(self) -> list[PodRecord]:
        return [record for record in self.records.values() if record.live]

    def held_ids(self, resource_name: str) -> set[str]:
        return {
            device
            for record in self.live_records()
            for allocation in record.allocations
            if allocation.resource_name == resource_name
            for device in allocation.device_ids
        }

    # -- the watch -------------------------------------------------------------------------

    async def _watch(self) -> None:
        failures = 0
        while True:  # lightkube re-opens the watch itself; this outer loop is for the rest
            try:
                stream = self._client.watch(Pod, namespace=ALL_NS,
                                            fields={"spec.nodeName": self.node_name},
                                            on_error=_retry_watch)
                async for event, pod in stream:
                    failures = 0
                    try:
                        await self._handle(event, pod)
                    except asyncio.CancelledError:
                        if cancelled_by_caller():
                            raise
                        # A cancellation that is not ours (a call whose channel closed under
                        # it) must not end admission for good: log it, take the next event.
                        log.exception("node %s: handling %s of a pod was cancelled",
                                      self.node_name, event)
                    except Exception:
                        log.exception("node %s: handling %s of a pod failed", self.node_name,
                                      event)
            except asyncio.CancelledError:
                if cancelled_by_caller():
                    raise
                log.exception("node %s: the pod watch was cancelled; re-opening it",
                              self.node_name)
            except Exception:
                log.exception("node %s: the pod watch broke; re-opening it", self.node_name)
            failures += 1
            await asyncio.sleep(min(WATCH_RETRY_S * failures, WATCH_RETRY_MAX_S))

    async def _resync(self) -> None:
        """Release pods that are gone although no DELETED event said so (a watch gap)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(RESYNC_INTERVAL_S)
            started = loop.time()
            try:
                present = {
                    pod.metadata.uid
                    async for pod in self._client.list(Pod, namespace=ALL_NS,
                                                       fields={"spec.nodeName": self.node_name})
                    if pod.metadata is not None
                }
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node %s: listing pods for a resync failed", self.node_name)
                continue
            for uid, record in self.records.items():
                if record.live and uid not in present and record.seen_at < started:
                    log.info("node %s: pod %s/%s vanished unseen", self.node_name,
                             record.namespace, record.name)
                    record.live = False

    async def _handle(self, event: str, pod: Pod) -> None:
        meta = pod.metadata
        assert meta is not None
        assert meta.uid is not None
        assert meta.name is not None
        namespace = meta.namespace or "default"
        if event == "DELETED":
            self._release(meta.uid)
            return
        if meta.deletionTimestamp is not None:
            # Containers "stop" at once; confirm the deletion as the kubelet does.
            self._release(meta.uid)
            with contextlib.suppress(ApiError):
                await self._client.delete(Pod, meta.name, namespace=namespace, grace_period=0)
            return
        if meta.uid in self.records:
            return
        assert pod.spec is not None
        record = PodRecord(namespace=namespace, name=meta.name, uid=meta.uid,
                           containers=tuple(c.name for c in pod.spec.containers),
                           seen_at=asyncio.get_running_loop().time())
        self.records[meta.uid] = record
        self._by_name[(namespace, meta.name)] = meta.uid
        phase = pod.status.phase if pod.status is not None else None
        if phase in ("Succeeded", "Failed"):
            record.live = False
            return
        if phase == "Running":
            return  # admitted by an earlier emulator: its devices are unknown to this one
        await self._admit(pod, record)

    def _release(self, uid: str) -> None:
        record = self.records.get(uid)
        if record is not None and record.live:
            record.live = False
            log.info("node %s: pod %s/%s released its devices", self.node_name,
                     record.namespace, record.name)
            self._unprepare_unused(record)

    def _unprepare_unused(self, released: PodRecord) -> None:
        """Unprepare the released pod's claims that no live pod uses any more."""
        if self._dra is None or not released.claims:
            return
        used = {u.claim.uid for r in self.live_records() for u in r.claims}
        unused = {u.claim.uid: u.claim for u in released.claims if u.claim.uid not in used}
        if unused:
            task = asyncio.create_task(self._dra.unprepare(unused.values()))
            self._unprepares.add(task)
            task.add_done_callback(self._unprepares.discard)

    # -- admission -------------------------------------------------------------------------

    async def _admit(self, pod: Pod, record: PodRecord) -> None:
        try:
            record.allocations = await self._allocate(pod)
        except Exception as error:  # AdmissionError, or anything a broken plugin provoked
            record.live = False
            log.warning("node %s: rejecting pod %s/%s: %s", self.node_name, record.namespace,
                        record.name, error, exc_info=not isinstance(error, AdmissionError))
            await self._patch_status(record, {
                "phase": "Failed", "reason": ADMISSION_ERROR,
                "message": f"Pod was rejected: {error}",
            })
            return
        try:
            if self._dra is not None:
                record.claims = await self._dra.prepare(pod)
            record.allocations = await self._start_containers(pod, record)
        except PrepareError as error:
            # A kubelet would leave the pod ContainerCreating and retry (an Event says why);
            # failing it at once lets tests see it.
            record.live = False
            log.warning("node %s: pod %s/%s: %s", self.node_name, record.namespace,
                        record.name, error)
            await self._patch_status(record, {
                "phase": "Failed", "reason": "FailedPrepareDynamicResources",
                "message": str(error)})
            return
        except ContainerCreateError as error:
            # A kubelet would leave the pod Pending and retry; failing it at once lets tests
            # and controllers see it.
            record.live = False
            log.warning("node %s: pod %s/%s: container %s: %s", self.node_name,
                        record.namespace, record.name, error.container, error)
            await self._patch_status(record, {
                "phase": "Failed", "reason": error.reason, "message": str(error),
                "containerStatuses": [{
                    "name": error.container, "image": "", "imageID": "", "ready": False,
                    "restartCount": 0, "state": {"waiting": {
                        "reason": error.reason, "message": str(error)}}}],
            })
            return
        await self._patch_status(record, self._running_status(pod))

    async def _allocate(self, pod: Pod) -> list[ContainerAllocation]:
        assert pod.spec is not None
        allocations: list[ContainerAllocation] = []
        app_held: dict[str, set[str]] = {}  # devices of this pod's app containers so far
        ordered = [(c, True) for c in pod.spec.initContainers or []]
        ordered += [(c, False) for c in pod.spec.containers]
        for container, is_init in ordered:
            for resource, count in extended_requests(container):
                if not self._devices.knows(resource):
                    continue  # not a device-plugin resource: the kubelet leaves it alone
                endpoint = await self._wait_for_plugin(resource)
                taken = self.held_ids(resource) | app_held.get(resource, set())
                # Init containers run before app containers, so their devices are reusable.
                available = [d for d in endpoint.healthy_ids() if d not in taken]
                if len(available) < count:
                    raise AdmissionError(
                        f"Allocate failed due to requested number of devices unavailable for "
                        f"{resource}. Requested: {count}, Available: {len(available)}, "
                        "which is unexpected")
                chosen = await self._choose(endpoint, available, count)
                allocations.append(await self._call_plugin(endpoint, container.name, chosen,
                                                           is_init=is_init))
                if not is_init:
                    app_held.setdefault(resource, set()).update(chosen)
        return allocations

    async def _start_containers(self, pod: Pod, record: PodRecord) -> list[ContainerAllocation]:
        """Start each container in pod order, as the kubelet does after admission: its
        PreStartContainer calls (GetDeviceRunContainerOptions), then the runtime resolves its
        CDI names (its device plugins' and its claims'). Returns the allocations with the
        runtime's CDI edits; the claims' edits go in ``record.claim_edits``."""
        assert pod.spec is not None
        started: list[ContainerAllocation] = []
        for container in [*(pod.spec.initContainers or []), *pod.spec.containers]:
            mine = [a for a in record.allocations if a.container == container.name]
            for allocation in mine:
                await self._pre_start(allocation)
            claimed = [i for u in record.claims if u.container == container.name
                       for i in u.cdi_ids]
            names = [name for a in mine for name in a.cdi_devices] + claimed
            edits = await resolve_cdi(container.name, names, self.cdi_spec_dirs)
            started += [dataclasses.replace(a, cdi_edits=edits) for a in mine]
            if claimed and edits is not None:
                record.claim_edits[container.name] = edits
        return started

    async def _pre_start(self, allocation: ContainerAllocation) -> None:
        endpoint = self._devices.endpoint(allocation.resource_name)
        if endpoint is None:
            raise ContainerCreateError(
                allocation.container, "endpoint not found in cache for a registered resource: "
                f"{allocation.resource_name}", reason=CREATE_CONTAINER_CONFIG_ERROR)
        if not endpoint.pre_start_required:
            return
        try:
            await endpoint.pre_start(list(allocation.device_ids))
        except (grpc.aio.AioRpcError, PluginGone) as error:
            raise ContainerCreateError(
                allocation.container,
                f"device plugin PreStartContainer rpc failed with err: {error}",
                reason=CREATE_CONTAINER_CONFIG_ERROR) from error

    async def _wait_for_plugin(self, resource: str) -> PluginEndpoint:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PLUGIN_WAIT_S
        while True:
            endpoint = self._devices.endpoint(resource)
            if endpoint is not None and endpoint.streaming:
                return endpoint
            if loop.time() >= deadline:
                raise AdmissionError(f"Allocate failed due to no plugin serving {resource}, "
                                     "which is unexpected")
            await asyncio.sleep(PLUGIN_WAIT_POLL_S)

    async def _choose(self, endpoint: PluginEndpoint, available: Sequence[str],
                      count: int) -> list[str]:
        if endpoint.preferred_allocation_available:
            try:
                preferred = await endpoint.preferred(available=available, size=count)
            except (grpc.aio.AioRpcError, PluginGone, ValueError) as error:
                log.warning("%s: GetPreferredAllocation failed, choosing myself: %s",
                            endpoint.resource_name, error)
            else:
                valid = len(set(preferred)) == count == len(preferred)
                if valid and set(preferred) <= set(available):
                    return preferred
                log.warning("%s: ignoring invalid preferred allocation %s", endpoint.resource_name,
                            preferred)
        return list(available[:count])

    async def _call_plugin(self, endpoint: PluginEndpoint, container: str, device_ids: list[str],
                           *, is_init: bool) -> ContainerAllocation:
        try:
            response = await endpoint.allocate(device_ids)
        except grpc.aio.AioRpcError as error:
            raise AdmissionError(f"Allocate failed due to rpc error: code = {error.code().name} "
                                 f"desc = {error.details()}, which is unexpected") from error
        except PluginGone as error:
            raise AdmissionError(f"Allocate failed due to rpc error: code = Canceled "
                                 f"desc = {error}, which is unexpected") from error
        except ValueError as error:
            raise AdmissionError(f"Allocate failed due to {error}, which is unexpected") from error
        return ContainerAllocation(
            resource_name=endpoint.resource_name,
            device_ids=tuple(device_ids),
            envs=dict(response.envs),
            mounts=tuple((m.container_path, m.host_path, m.read_only) for m in response.mounts),
            devices=tuple((d.container_path, d.host_path, d.permissions) for d in response.devices),
            cdi_devices=tuple(c.name for c in response.cdi_devices),
            annotations=dict(response.annotations),
            container=container,
            init_container=is_init,
        )

    # -- status ----------------------------------------------------------------------------

    def _running_status(self, pod: Pod) -> dict[str, Any]:
        assert pod.spec is not None
        assert pod.metadata is not None
        now = _now()
        uid = pod.metadata.uid

        def container_status(container: Container, state: dict[str, Any],
                             ready: bool) -> dict[str, Any]:
            return {"name": container.name, "image": container.image or "", "imageID": "",
                    "containerID": f"emulated://{uid}/{container.name}", "ready": ready,
                    "started": ready, "restartCount": 0, "state": state}

        running = {"running": {"startedAt": now}}
        done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                               "finishedAt": now}}
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": now}
                      for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady",
                                   "Ready")]
        return {
            "phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": now,
            "conditions": conditions,
            "containerStatuses": [container_status(c, running, True) for c in pod.spec.containers],
            "initContainerStatuses": [container_status(c, done, False)
                                      for c in pod.spec.initContainers or []],
        }

    async def _patch_status(self, record: PodRecord, status: dict[str, Any]) -> None:
        for attempt in range(1, STATUS_ATTEMPTS + 1):
            try:
                await self._client.patch(Pod.Status, record.name, {"status": status},
                                         namespace=record.namespace, field_manager=FIELD_MANAGER)
                return
            except ApiError as error:
                if error.status.code == 404:
                    record.live = False  # deleted meanwhile
                    return
                if attempt == STATUS_ATTEMPTS:
                    raise
                log.warning("node %s: writing status of %s/%s failed (%s); retrying",
                            self.node_name, record.namespace, record.name, error)
            await asyncio.sleep(WATCH_RETRY_S * attempt)
