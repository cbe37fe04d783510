"""The ResourceSlices of shared devices the scheduler allocates: one pool each, kept by the
controller (``--dra``); docs/dra.md ("What is published", "Unhealthy devices") says what and why.

For every shared Instance of a served namespace whose Configuration is allocated by DRA (the mode
``controller.device_classes`` decides), the pool ``controller.pool_inputs.SharedDevice`` plans,
server-side applied one generation above any publisher's (the controller's own slices adopted
by label at start, a pool not written yet listed first); held while no node's verdict is known;
withdrawn when its Instance goes or its Configuration leaves ``dra``. Nothing is written before
the Instances (``controller.instance_classes``' watch) and the modes were listed once.

Work follows what changed: an Instance event whose pool inputs or plan equal those kept marks
nothing; a pass looks only at the marked pools (all after a (re)list), ``WRITES_IN_FLIGHT``
calls at a time. A device unhealthy on every node for its Configuration's ``evictAfterSeconds``
(timed from when this controller first saw it so) is tainted ``NoExecute``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from controller.dra.agent_liveness import without_gone
from controller.dra.shared_allocation import put_mode
from controller.pool_inputs import SharedDevice, assemble, pool_inputs, pool_of
from crds import dra, dra_features, dra_slices, pool_slices
from crds.configuration import Allocator
from crds.instance import Instance
from crds.resources import ResourceSliceResource

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "edgeplug-controller/shared-pools"
#: After a pass that failed (an API error), the next one comes this soon.
RETRY_S: Final = 1.0
#: A pass waits this long after the change that woke it, so a burst is written once.
PASS_DELAY_S: Final = 0.05
#: API calls (applies, deletes, lists) of one pass in flight at once: pools are independent,
#: and one call at a time leaves the API server idle between round trips. One pool's own calls
#: stay in order (apply, then delete the stale).
WRITES_IN_FLIGHT: Final = 16

#: The pool and node of the dry-run slice that asks whether per-device node selection is kept.
PROBE_POOL: Final = dra_slices.shared_pool("kube-system", "edgeplug-probe", "probe")
PROBE_NODE: Final = "edgeplug-probe"

_Key = tuple[str, str]


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj.to_dict())


def _namespace_of(body: Mapping[str, Any]) -> str:
    """The namespace a listed slice's devices name (``crds.dra`` attribute ``namespace``)."""
    for device in body["spec"].get("devices") or ():
        value = ((device.get("attributes") or {}).get(dra.ATTR_NAMESPACE) or {}).get("string")
        if value:
            return str(value)
    return ""


class SharedPools:
    """Publishes the pools of shared devices allocated by DRA; ``run`` until cancelled.
    Fed by ``listed``/``put`` (Instances) and ``set_mode``/``modes_listed`` (Configurations)."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = ()) -> None:
        self._client = client
        self._namespaces = frozenset(namespaces)
        self._devices: dict[_Key, SharedDevice] = {}
        self._inputs: dict[_Key, tuple[Any, Any, Any]] = {}  # pool_inputs of each device kept
        self._by_configuration: dict[_Key, set[_Key]] = {}
        self._modes: dict[_Key, Allocator] = {}
        self._written: dict[str, dra_slices.Written] = {}
        #: Pools to look at in the next pass; ``_everything``: every pool known (a (re)list).
        self._dirty: set[str] = set()
        self._everything = True
        self._instances_listed = False
        self._modes_listed = False
        self._wake = asyncio.Event()
        self._passing = False  # a pass is running
        self._gate = asyncio.Semaphore(WRITES_IN_FLIGHT)
        self.features = dra_features.FeatureReport(log)
        self.writes = 0  # API writes (applies and deletes), for tests and benchmarks
        self.passes = 0  # passes done, for tests and benchmarks
        self.examined = 0  # pools the passes looked at, for tests and benchmarks
        self._failing = ""  # the error the last pass failed with
        #: (namespace, configuration) → ``spec.unhealthyDevices.evictAfterSeconds``, where set.
        self._graces: dict[_Key, int] = {}
        #: Instance → when this controller first saw it unhealthy on every node (monotonic).
        self._unhealthy_since: dict[_Key, float] = {}
        self._grace_timer: asyncio.TimerHandle | None = None
        #: Nodes whose agent is gone (``controller.agent_liveness``): left out of selectors.
        self._gone: frozenset[str] = frozenset()
        #: Whether the API server keeps per-device node selection (None: not asked yet): pools
        #: of many devices, else a pool per device (``controller.pool_inputs.pool_of``).
        self.per_device_nodes: bool | None = None
        self._pool_of: dict[_Key, str] = {}  # the pool each kept device is published in
        self._members: dict[str, set[_Key]] = {}  # pool → the devices kept in it
        #: pool → device name → the device as last written (a held device stays so)
        self._entries: dict[str, dict[str, Mapping[str, Any]]] = {}
        #: (namespace, device name) → the pool of its own an earlier release published it in,
        #: kept for the process's life: claims allocated from it name it.
        self._adopted: dict[tuple[str, str], str] = {}

    # -- input ------------------------------------------------------------------------------

    def _serves(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    def _mark(self, *pools: str) -> None:
        self._dirty.update(pools)
        self._wake.set()

    def _forget(self, key: _Key) -> str | None:
        """Drop a kept device; the pool it was in (None: it was not kept)."""
        device = self._devices.pop(key, None)
        self._inputs.pop(key, None)
        if device is None:
            return None
        pool = self._pool_of.pop(key)
        members = self._members[pool]
        members.discard(key)
        if not members:
            del self._members[pool]
        keys = self._by_configuration.get((key[0], device.configuration))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_configuration[(key[0], device.configuration)]
        return pool

    def _keep(self, key: _Key, device: SharedDevice) -> str:
        """Keep a device; the pool it is in."""
        if device.evicting is None:
            self._unhealthy_since.pop(key, None)
        else:
            self._unhealthy_since.setdefault(key, time.monotonic())
        self._devices[key] = device
        pool = pool_of(key, device, adopted=self._adopted,
                       per_device_nodes=self.per_device_nodes is not False)
        self._pool_of[key] = pool
        self._members.setdefault(pool, set()).add(key)
        self._by_configuration.setdefault((key[0], device.configuration), set()).add(key)
        return pool

    def listed(self, instances: Iterable[Mapping[str, Any]]) -> None:
        """Every Instance, as a (re)list found them: every pool is looked at next pass."""
        for key in list(self._devices):
            self._forget(key)
        for data in instances:
            instance = Instance.from_object(data)
            if instance.spec.shared and self._serves(instance.namespace):
                key = (instance.namespace, instance.name)
                self._keep(key, SharedDevice.of(instance))
                self._inputs[key] = pool_inputs(data)
        for key in set(self._unhealthy_since) - set(self._devices):
            del self._unhealthy_since[key]
        self._instances_listed = True
        self._everything = True
        self._wake.set()

    def put(self, key: _Key, data: Mapping[str, Any] | None) -> None:
        """An Instance changed (``data`` None: deleted). Only a change of what its pool is
        built from marks the pool."""
        inputs = pool_inputs(data) if data is not None else None
        if inputs is not None and key in self._devices and self._inputs.get(key) == inputs:
            return
        instance = Instance.from_object(data) if data is not None else None
        if inputs is None or instance is None or not instance.spec.shared \
                or not self._serves(key[0]):
            gone = self._forget(key)
            self._unhealthy_since.pop(key, None)
            if gone is not None:
                self._mark(gone)
            return
        device = SharedDevice.of(instance)
        if self._devices.get(key) == device:
            self._inputs[key] = inputs
            return
        before = self._forget(key)
        pool = self._keep(key, device)
        self._inputs[key] = inputs
        self._mark(pool, *([before] if before is not None else []))

    def set_mode(self, configuration: _Key, mode: Allocator | None) -> None:
        """The allocator of ``configuration``'s shared devices (``None``: it is gone)."""
        if put_mode(self._modes, configuration, mode):
            keys = self._by_configuration.get(configuration, ())
            self._mark(*(self._pool_of[k] for k in keys))

    def set_eviction_grace(self, configuration: _Key, grace: int | None) -> None:
        """``configuration``'s ``spec.unhealthyDevices.evictAfterSeconds`` (None: absent, or
        the Configuration is gone)."""
        if self._graces.get(configuration) == grace:
            return
        if grace is None:
            self._graces.pop(configuration, None)
        else:
            self._graces[configuration] = grace
        keys = self._by_configuration.get(configuration, ())
        self._mark(*(self._pool_of[k] for k in keys))

    def _plan(self, key: _Key, device: SharedDevice
              ) -> tuple[dra_slices.PoolPlan | None, str | None]:
        """The plan to publish for ``device`` now: ``evicting`` once unhealthy everywhere for
        the Configuration's grace."""
        grace = self._graces.get((key[0], device.configuration))
        since = self._unhealthy_since.get(key)
        if device.evicting is not None and grace is not None and since is not None \
                and time.monotonic() >= since + grace:
            return device.evicting, device.evicting_key
        return device.plan, device.key

    def _time_graces(self) -> None:
        """Set the timer for the nearest eviction grace still running; it marks those pools."""
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        now = time.monotonic()
        nearest: float | None = None
        due: list[str] = []
        for key, since in self._unhealthy_since.items():
            device = self._devices.get(key)
            grace = self._graces.get((key[0], device.configuration)) if device else None
            if device is None or grace is None or since + grace <= now:
                continue
            due.append(self._pool_of[key])
            nearest = since + grace if nearest is None else min(nearest, since + grace)
        if nearest is not None:
            self._grace_timer = asyncio.get_running_loop().call_later(
                nearest - now, lambda: self._mark(*due))

    @property
    def idle(self) -> bool:
        """No pass waiting or running (for tests and benchmarks)."""
        return not self._passing and not self._wake.is_set()

    def set_gone_nodes(self, gone: frozenset[str]) -> None:
        """The nodes whose agent is gone now: the pools listing a node that left or joined
        the set are marked."""
        changed, self._gone = gone ^ self._gone, gone
        self._mark(*(self._pool_of[k] for k, d in self._devices.items()
                     if d.plan is not None and changed.intersection(d.plan.nodes)))

    def _without_gone(self, plan: dra_slices.PoolPlan | None, key: str | None
                      ) -> tuple[dra_slices.PoolPlan | None, str | None]:
        if plan is None or not self._gone.intersection(plan.nodes):
            return plan, key
        live = without_gone(plan, self._gone)
        return live, dra_slices.content_key(live)

    def modes(self) -> list[_Key]:
        """The Configurations whose mode is known now."""
        return list(self._modes)

    def modes_listed(self) -> None:
        """Every served Configuration's mode has been set once (after a list)."""
        self._modes_listed = True
        self._everything = True
        self._wake.set()

    # -- output -----------------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._adopt()
                break
            except Exception as error:  # API away or refusing: wait it out
                failures += 1
                log.warning("shared pools: slices not listed yet (%s); retrying", error)
                await asyncio.sleep(RETRY_S)
        while True:
            await self._wake.wait()
            if not (self._instances_listed and self._modes_listed):
                self._wake.clear()
                continue
            await asyncio.sleep(PASS_DELAY_S)
            self._passing = True
            self._wake.clear()
            try:
                await self.reconcile()
                self._failing = ""
            except Exception as error:  # API error or away: the pass is retried
                # Said once per cause (a right missing: deploy/dra not reapplied), not per retry.
                if str(error) != self._failing:
                    log.warning("shared pools: pass failed (%s); retrying every %.0f s",
                                error, RETRY_S)
                self._failing = str(error)
                self._wake.set()
                await asyncio.sleep(RETRY_S)
            finally:
                self._passing = False

    async def _adopt(self) -> None:
        """Learn whether the API server keeps per-device node selection, and the pools an
        earlier controller wrote, so none is rewritten needlessly, generations keep growing and
        a device published in a pool of its own stays there."""
        if self.per_device_nodes is None:
            self.per_device_nodes = await self._keeps_per_device_nodes()
        by_pool: dict[str, list[dict[str, Any]]] = {}
        # Every slice of the driver bound to no node: this controller's, and a shared pool an
        # agent of an older release published (taken over: rewritten as the controller's).
        async for obj in self._client.list(
                ResourceSliceResource, fields={"spec.driver": dra.DRIVER, "spec.nodeName": ""}):
            body = _as_dict(obj)
            pool = str(body["spec"]["pool"]["name"])
            if body["spec"].get("driver") == dra.DRIVER and not body["spec"].get("nodeName") \
                    and dra_slices.is_shared_pool(pool) and self._serves(_namespace_of(body)):
                by_pool.setdefault(pool, []).append(body)
        for pool, found in by_pool.items():
            written, stale = dra_slices.adopt(found)
            await self._delete(stale)
            self._written[pool] = written
            current = [s for s in found if s["metadata"]["name"] in written.names]
            self._entries[pool] = {str(d["name"]): dra_slices.as_written(d)
                                   for s in current for d in s["spec"].get("devices") or ()}
            if not any(s["spec"].get("perDeviceNodeSelection") for s in current):
                namespace = _namespace_of(current[0])
                self._adopted.update({(namespace, name): pool for name in self._entries[pool]})
        for key in list(self._devices):  # kept before the pools were known: placed again
            device, inputs = self._devices[key], self._inputs[key]
            self._forget(key)
            self._keep(key, device)
            self._inputs[key] = inputs
        self._everything = True

    async def _keeps_per_device_nodes(self) -> bool:
        """Whether the API server keeps ``perDeviceNodeSelection`` (DRAPartitionableDevices),
        asked by a dry-run write of a pool of one device."""
        plan = dra_slices.pooled_plan(PROBE_POOL, [dra_slices.PoolPlan(
            name=PROBE_POOL, nodes=(PROBE_NODE,), devices=({"name": "probe"},))])
        body = dra_slices.slice_bodies(plan, generation=1,
                                       publisher=dra_slices.CONTROLLER_PUBLISHER)[0]
        try:
            stored = await self._client.patch(
                ResourceSliceResource, body["metadata"]["name"], body, dry_run=True,
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
        except ApiError as error:
            if error.status.code != 422:
                raise
            kept = False
        else:
            kept = bool(_as_dict(stored)["spec"].get("perDeviceNodeSelection"))
        if not kept:
            log.warning("shared pools: the API server does not keep per-device node selection "
                        "(%s off): each shared device gets a pool and a slice of its own",
                        dra_features.PARTITIONABLE_DEVICES)
        return kept

    def _taken(self) -> set[str]:
        """The pools this pass looks at, taken from the marks."""
        if self._everything:
            self._everything = False
            self._dirty.clear()
            return set(self._members) | set(self._written)
        taken, self._dirty = self._dirty, set()
        return taken

    def _pool_plan(self, pool: str) -> tuple[dra_slices.PoolPlan | None, bool]:
        """What ``pool`` is to hold now (None: nothing, withdraw it), and whether it is held
        as written (a pool of its own whose device's health is not known yet)."""
        plans: list[dra_slices.PoolPlan] = []
        held: list[str] = []
        for key in self._members.get(pool, ()):
            device = self._devices[key]
            if self._modes.get((key[0], device.configuration)) != Allocator.DRA:
                continue
            plan, _ = self._without_gone(*self._plan(key, device))
            if plan is None:
                held.append(dra_slices.device_name(key[1]))
            else:
                plans.append(plan)
        own = self.per_device_nodes is False or pool in self._adopted.values()
        return assemble(pool, plans, held, self._entries.get(pool, {}), pooled=not own)

    async def reconcile(self) -> None:
        """One pass: publish every marked pool that changed, withdraw those no longer wanted
        (held ones are left as they are)."""
        pools = self._taken()
        self.examined += len(pools)
        changed: list[tuple[dra_slices.PoolPlan, str]] = []  # (plan, its content key)
        gone: list[str] = []
        for pool in sorted(pools):
            plan, held = self._pool_plan(pool)
            if plan is None:
                if pool in self._written and not held:
                    gone.append(pool)
                continue
            key = dra_slices.content_key(plan)
            if (w := self._written.get(pool)) is None or w.key != key:
                changed.append((plan, key))
        self._time_graces()
        try:
            others = await self._listed([p.name for p, _ in changed
                                         if p.name not in self._written])
            listed = await self._listed(gone)
            results = await asyncio.gather(
                *(self._publish(plan, key, others.get(plan.name, []))
                  for plan, key in changed),
                *(self._withdraw(pool, listed.get(pool, [])) for pool in gone),
                return_exceptions=True)
        except BaseException:
            self._dirty |= pools
            raise
        failed = [(pool, r) for pool, r in zip([p.name for p, _ in changed] + gone, results,
                                               strict=True) if isinstance(r, BaseException)]
        self.passes += 1
        if failed:
            self._dirty.update(pool for pool, _ in failed)
            raise failed[0][1]

    async def _gated(self, call: Awaitable[Any]) -> Any:
        async with self._gate:
            return await call

    async def _listed(self, pools: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Every slice of the driver's of each pool (any publisher's, any generation); the
        lists (``pool_slices.POOLS_PER_LIST`` pools each) in flight at once, gated."""
        chunk = pool_slices.POOLS_PER_LIST
        found = await asyncio.gather(*(
            pool_slices.slices_by_pool(self._client, pools[i:i + chunk], gate=self._gate)
            for i in range(0, len(pools), chunk)))
        return {pool: mine for listed in found for pool, slices in listed.items()
                if (mine := [s for s in slices if s["spec"].get("driver") == dra.DRIVER])}

    async def _publish(self, plan: dra_slices.PoolPlan, key: str,
                       others: list[dict[str, Any]]) -> None:
        """Write the pool (``key``: its content key) one generation above any of its slices,
        then delete the rest (this controller's older slices, an agent's from before the
        upgrade)."""
        before = self._written.get(plan.name)
        newest = max([dra_slices.generation(s) for s in others]
                     + [before.generation if before is not None else 0])
        generation = newest + 1
        bodies = dra_slices.slice_bodies(plan, generation=generation,
                                         publisher=dra_slices.CONTROLLER_PUBLISHER)
        for body in bodies:
            stored = await self._gated(self._client.patch(
                ResourceSliceResource, body["metadata"]["name"], body,
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True))
            self.writes += 1
            self.features.note(dra_features.dropped_by_slice(body, _as_dict(stored)),
                               what=f"ResourceSlice {body['metadata']['name']}")
        names = tuple(b["metadata"]["name"] for b in bodies)
        stale = {str(s["metadata"]["name"]) for s in others} | set(
            before.names if before is not None else ())
        await self._delete(sorted(stale - set(names)))
        self._written[plan.name] = dra_slices.Written(
            generation=generation, names=names, key=key)
        self._entries[plan.name] = {str(d["name"]): d for d in plan.devices}
        log.info("ResourceSlice pool published", extra={
            "pool": plan.name, "generation": generation, "nodes": list(plan.nodes),
            "tainted": any("taints" in d for d in plan.devices)})

    async def _withdraw(self, pool: str, listed: list[dict[str, Any]]) -> None:
        names = {str(s["metadata"]["name"]) for s in listed} | set(self._written[pool].names)
        await self._delete(sorted(names))
        self._written.pop(pool, None)
        self._entries.pop(pool, None)
        log.info("ResourceSlice pool withdrawn", extra={"pool": pool})

    async def _delete(self, names: Iterable[str]) -> None:
        self.writes += await pool_slices.delete_slices(self._client, names, gate=self._gate)
