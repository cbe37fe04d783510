"""Keeps this node's ResourceSlices in step with the local devices it serves.

``DraPublisher`` watches this node's Instances and the device table, asks ``agent.dra.slices``
which local pools to publish, and writes the difference: a changed pool is applied one
generation up, then its unneeded slices deleted; an unchanged pool is never written; a slice of
ours deleted by somebody else is written again; a device unhealthy past its Configuration's
eviction grace is tainted ``NoExecute``. Shared pools are the controller's. Why and how:
docs/dra.md, "What is published" and "Unhealthy devices: keep their pods, or move them".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.discovery.node_devices import NodeDeviceTable
from agent.dra import slices
from agent.kube import node_instances, watching
from agent.kube.client import as_dict, field_manager
from agent.settings import current
from crds import dra_features, pool_slices, written_slices
from crds.configuration import Allocator
from crds.instance import Instance
from crds.resources import ResourceSliceResource as ResourceSliceResource
from crds.written_slices import Written, adopt, content_key

log = logging.getLogger(__name__)


#: API writes of one pass in flight at once (pools are independent; one pool's slices are
#: written in order, its stale ones deleted after).
WRITES_IN_FLIGHT: Final = 8


class DraPublisher:
    """Publishes this node's pools; ``run`` until cancelled. ``namespace`` None: all."""

    def __init__(self, *, client: AsyncClient, node_name: str, namespace: str | None,
                 devices: NodeDeviceTable) -> None:
        self._client = client
        self._devices = devices
        self._held: frozenset[str] = frozenset()
        self._node = node_name
        self._namespace = namespace
        self._manager = field_manager(node_name)
        self.features = dra_features.FeatureReport(log)
        self._instances: dict[tuple[str, str], Instance] = {}
        self._written: dict[str, Written] = {}
        self._dirty = asyncio.Event()
        self._relist = asyncio.Event()
        #: While a relist is in flight: the Instances the watch delivered meanwhile.
        self._touched: set[tuple[str, str]] | None = None
        self.writes = 0  # API writes (applies and deletes), for the benchmarks
        self.passes = 0  # reconcile passes completed without error
        self._last_write = float("-inf")  # start of the last pass that wrote
        self._last_write_end = float("-inf")  # and its end
        #: Devices the device table has held while this process ran: one it no longer holds
        #: has left this node (a Configuration deleted, a device gone), not "not known yet".
        self._seen: set[tuple[str, str]] = set()
        self._gate = asyncio.Semaphore(WRITES_IN_FLIGHT)
        #: (namespace, Instance) → when this process first saw the device unhealthy (loop time).
        self._unhealthy_since: dict[tuple[str, str], float] = {}
        self._configuration_of: dict[tuple[str, str], str] = {}
        self._grace_timer: asyncio.TimerHandle | None = None

    def known_instances(self) -> list[Instance]:
        """The Instances this publisher knows of now (for tests and the benchmark)."""
        return list(self._instances.values())

    async def run(self) -> None:
        """Adopt what an earlier run published, then follow Instances until cancelled. The API
        server being away (at start or later) is waited out, never fatal to the agent."""
        failures = 0
        while True:
            try:
                await self._adopt()
                break
            except Exception as error:  # API away or refusing (429 at its start): wait it out
                failures += 1
                log.warning("ResourceSlices of this node not listed yet (%s); retrying",
                            watching.describe(error))
                await asyncio.sleep(watching.retry_delay(failures))
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch())
            group.create_task(self._watch_own_slices())
            group.create_task(self._watch_devices())
            group.create_task(self._reconcile_loop())

    # -- input ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        namespace = self._namespace if self._namespace is not None else "*"
        # Only the Instances labelled for this node; a label that went is no deletion (the
        # Instance as read comes instead, agent.kube.node_instances).
        async for kind, obj in node_instances.watch(
            self._client, self._node, what="Instances (DRA)", namespace=namespace,
            on_restart=self._relist.set,
        ):
            instance = Instance.from_object(obj)
            key = (instance.namespace, instance.name)
            if self._touched is not None:
                self._touched.add(key)
            if kind == "DELETED":
                self._instances.pop(key, None)
                self._seen.discard(key)
            else:
                self._instances[key] = instance
            self._dirty.set()

    async def _watch_own_slices(self) -> None:
        """A slice of ours deleted by someone else (the kubelet wipes a node's slices when it
        starts and a driver has not registered in time; a user) is written again by the next
        pass, with a higher generation."""
        async for kind, obj in watching.watch(
            self._client, ResourceSliceResource, what="own ResourceSlices",
            labels={slices.LABEL_NODE: slices.node_label(self._node)},
        ):
            if kind != "DELETED":
                continue
            body = as_dict(obj)
            pool = body["spec"]["pool"]["name"]
            written = self._written.get(pool)
            if written is not None and body["metadata"]["name"] in written.names:
                # Kept with no content: rewritten at the next pass, one generation higher.
                self._written[pool] = Written(generation=written.generation,
                                              names=written.names, key="")
                log.info("own ResourceSlice deleted by someone else; publishing again",
                         extra={"pool": pool, "slice": body["metadata"]["name"]})
                self._dirty.set()

    async def _watch_devices(self) -> None:
        """A device this node starts serving, or whose health it changes, reaches the slices."""
        version = self._devices.version
        while True:
            version = await self._devices.wait_changed(version)
            self._dirty.set()

    def _served(self) -> slices.Served:
        snapshot = self._devices.snapshot()
        served = {key: None if d.healthy else d.health.reason for key, d in snapshot.items()}
        self._configuration_of = {key: d.configuration for key, d in snapshot.items()}
        self._seen.update(served)
        return served

    def _evicting(self, served: slices.Served) -> frozenset[tuple[str, str]]:
        """The unhealthy devices past their Configuration's eviction grace; the timer is set
        for the nearest grace still running."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key in list(self._unhealthy_since):
            if served.get(key) is None:
                del self._unhealthy_since[key]
        evicting: set[tuple[str, str]] = set()
        nearest: float | None = None
        for key, reason in served.items():
            if reason is None:
                continue
            since = self._unhealthy_since.setdefault(key, now)
            grace = self._devices.eviction_grace(key[0], self._configuration_of.get(key, ""))
            if grace is None:
                continue
            if now >= since + grace:
                evicting.add(key)
            elif nearest is None or since + grace < nearest:
                nearest = since + grace
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        if nearest is not None:
            self._grace_timer = loop.call_at(nearest, self._dirty.set)
        return frozenset(evicting)

    def _left(self, instance: Instance, served: slices.Served) -> bool:
        """This node served the (local) device and no longer does: it is withdrawn now rather
        than when its Instance goes (a deleted Configuration's 200 devices waited on 200
        Instance deletions). A device not served yet stays held (``plan_node``)."""
        key = (instance.namespace, instance.name)
        return key not in served and key in self._seen

    async def _list_instances(self) -> None:
        """Relist (at start, after the watch started over, every ``settings.dra.resync_s``). An
        Instance the watch delivered while the list was in flight stays as the watch has it
        (the list's answer may be older; the watch brings every later change): the answer
        replacing everything dropped an Instance created meanwhile, whose pool then waited for
        its next change, and brought back one deleted meanwhile."""
        namespace = self._namespace if self._namespace is not None else "*"
        before = dict(self._instances)
        self._touched = set()
        try:
            listed: dict[tuple[str, str], Instance] = {}
            async for obj in node_instances.list_instances(self._client, self._node, namespace):
                instance = Instance.from_object(obj)
                listed[(instance.namespace, instance.name)] = instance
            for key, instance in listed.items():
                if key not in self._touched:
                    self._instances[key] = instance
            for key in before.keys() - listed.keys() - self._touched:
                # Not listed may mean only that its label went: read it before dropping it.
                current = await node_instances.still_there(
                    self._client, self._node, *key, before[key].uid)
                if key in self._touched:
                    continue  # the watch brought it meanwhile
                if current is not None:
                    self._instances[key] = Instance.from_object(current)
                    continue
                self._instances.pop(key, None)
                self._seen.discard(key)
        finally:
            self._touched = None

    async def _adopt(self) -> None:
        """Learn the pools this node published before a restart, so none is rewritten
        needlessly and generations keep growing. Slices not bound to this node (a shared
        pool an older agent published) are the controller's to replace and delete."""
        by_pool: dict[str, list[dict[str, Any]]] = {}
        async for obj in self._client.list(
            ResourceSliceResource, labels={slices.LABEL_NODE: slices.node_label(self._node)}
        ):
            body = as_dict(obj)
            if body["spec"].get("nodeName") != self._node:
                continue
            by_pool.setdefault(body["spec"]["pool"]["name"], []).append(body)
        for pool, found in by_pool.items():
            written, stale = adopt(found)
            await self._delete(stale)
            self._written[pool] = written

    # -- output -----------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        self._dirty.set()
        self._relist.set()
        while True:
            try:
                async with asyncio.timeout(current().dra.resync_s):
                    await self._dirty.wait()
            except TimeoutError:
                self._relist.set()
            loop = asyncio.get_running_loop()
            if loop.time() - self._last_write_end < current().dra.quiet_s:  # a burst
                await asyncio.sleep(
                    max(0.0, self._last_write + current().dra.min_pass_interval_s - loop.time()))
            self._dirty.clear()
            started, writes = loop.time(), self.writes
            try:
                if self._relist.is_set():
                    self._relist.clear()
                    await self._list_instances()
                await self.reconcile()
                self.passes += 1
                if self.writes != writes:
                    self._last_write, self._last_write_end = started, loop.time()
            except Exception as error:  # API error or API away: the pass is retried
                log.warning("ResourceSlice pass failed (%s); retrying", watching.describe(error))
                await asyncio.sleep(current().dra.publish_retry_s)
                self._dirty.set()

    def _offered(self) -> list[Instance]:
        """The Instances this node offers to the scheduler: its local devices whose
        Configuration's allocator is DRA (one allocator per device: those of a Configuration
        the kubelets allocate, or one not decided yet, are in no slice; shared devices' pools
        are the controller's)."""
        return [i for i in self._instances.values() if not i.spec.shared
                and self._devices.allocator(i.namespace, i.spec.configuration_name)
                == Allocator.DRA]

    def _undecided_pools(self, served: slices.Served) -> set[str]:
        """Pools of devices this node still serves whose Configuration's allocator it does not
        know yet (an agent restarting reads the Configurations after its first pass may run):
        what was published for them stays as it is until the allocator is known."""
        return {slices.local_pool(i.namespace, i.spec.configuration_name, self._node)
                for i in self._instances.values()
                if not i.spec.shared and self._node in i.spec.nodes
                and not self._left(i, served)
                and self._devices.allocator(i.namespace, i.spec.configuration_name) is None}

    async def reconcile(self) -> None:
        """One pass: publish every pool that changed, withdraw those no longer wanted. A pool
        the API server refuses does not hold back the others; the first error is raised at
        the end, so the pass is retried."""
        served = self._served()
        plan = slices.plan_node(
            self._node, [i for i in self._offered() if not self._left(i, served)], served,
            evicting=self._evicting(served),
            partitions=dra_features.PARTITIONABLE_DEVICES not in self.features.missing)
        for name in sorted(plan.held - self._held):
            log.info("ResourceSlice pool waits for this node to serve all its devices (their "
                     "health is not known yet)", extra={"pool": name})
        self._held = plan.held
        changed = [pool for pool in plan.pools.values()
                   if (w := self._written.get(pool.name)) is None or w.key != content_key(pool)]
        generations = await self._listed_generations(
            [pool.name for pool in changed if pool.name not in self._written])
        undecided = self._undecided_pools(served)
        gone = [p for p in self._written
                if p not in plan.pools and p not in plan.held and p not in undecided]
        outcomes = await asyncio.gather(
            *(self._publish(pool, generations.get(pool.name, 0)) for pool in changed),
            *(self._withdraw(name) for name in gone), return_exceptions=True)
        failed: list[ApiError] = []
        for outcome in outcomes:
            if isinstance(outcome, ApiError):
                failed.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        if failed:
            raise failed[0]

    async def _withdraw(self, name: str) -> None:
        await self._delete(self._written[name].names)
        self._written.pop(name, None)  # the watch may have dropped it meanwhile
        log.info("ResourceSlice pool withdrawn", extra={"pool": name})

    async def _publish(self, plan: slices.PoolPlan, listed: int) -> None:
        """Write the pool one generation above what this process wrote (``listed``, the
        newest generation the API server had, for a pool it has not written)."""
        key = content_key(plan)
        before = self._written.get(plan.name)
        if before is not None and before.key == key:
            return
        generation = (before.generation if before is not None else listed) + 1
        bodies = slices.slice_bodies(plan, generation=generation, publisher=self._node)
        for body in bodies:
            async with self._gate:
                stored = await self._client.patch(
                    ResourceSliceResource, body["metadata"]["name"], body,
                    patch_type=PatchType.APPLY, field_manager=self._manager, force=True,
                )
            self.writes += 1
            dropped = dra_features.dropped_by_slice(body, as_dict(stored))
            self.features.note(dropped, what=f"ResourceSlice {body['metadata']['name']}")
            if dra_features.PARTITIONABLE_DEVICES in dropped:
                self._dirty.set()  # the next pass withdraws the partitions
        names = tuple(b["metadata"]["name"] for b in bodies)
        if before is not None:
            await self._delete([n for n in before.names if n not in names])
        self._written[plan.name] = Written(generation=generation, names=names, key=key)
        left = sum(len(v) for v in plan.left_out.values())
        log.info("ResourceSlice pool published", extra={
            "pool": plan.name, "generation": generation, "devices": len(plan.devices),
            "slices": len(bodies), "properties_left_out": left,
        })

    async def _listed_generations(self, pools: list[str]) -> dict[str, int]:
        """The newest generation the API server holds of each pool (any publisher's; absent:
        none)."""
        listed = await pool_slices.slices_by_pool(self._client, pools, gate=self._gate)
        return {pool: max(written_slices.generation(s) for s in found)
                for pool, found in listed.items()}

    async def _delete(self, names: Iterable[str]) -> None:
        self.writes += await pool_slices.delete_slices(self._client, names, gate=self._gate)
