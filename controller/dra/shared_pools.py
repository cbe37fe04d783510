"""The ResourceSlices of shared devices the scheduler allocates, kept by the controller
(``--dra``); docs/dra.md ("What is published", "Unhealthy devices") says what and why.

Every shared Instance of a served namespace whose Configuration is allocated by DRA (the mode
``controller.dra.device_classes`` decides) is published in its pool (``pool_inputs.pool_of``:
one of its Configuration's ``SHARED_POOL_BUCKETS``, each device naming its own nodes; or a pool
of its own), held while no node is listed, withdrawn when its Instance goes or its
Configuration leaves ``dra``. Nothing is written before the Instances and the modes were listed
once; ``controller.dra.pool_writer`` makes the API calls.

Work follows what changed: an Instance event whose pool inputs or plan equal those kept marks
nothing; a pass looks only at the marked pools (all after a (re)list). A device unhealthy on
every node for its Configuration's ``evictAfterSeconds`` (timed from when this controller first
saw it so) is tainted ``NoExecute``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from lightkube import AsyncClient

from controller.dra.agent_liveness import without_gone
from controller.dra.pool_inputs import SharedDevice, assemble, pool_inputs, pool_of
from controller.dra.pool_writer import PoolWriter
from controller.dra.shared_allocation import put_mode
from controller.settings import DraSettings
from crds import dra_features, dra_slices, written_slices
from crds.configuration import Allocator
from crds.instance import Instance

log = logging.getLogger(__name__)

_Key = tuple[str, str]


class SharedPools:
    """Publishes the pools of shared devices allocated by DRA; ``run`` until cancelled.
    Fed by ``listed``/``put`` (Instances) and ``set_mode``/``modes_listed`` (Configurations)."""

    def __init__(self, client: AsyncClient, *, namespaces: Iterable[str] = (),
                 settings: DraSettings | None = None) -> None:
        self._settings = settings or DraSettings()
        self._writer = PoolWriter(client, in_flight=self._settings.shared_pools_writes_in_flight)
        self._namespaces = frozenset(namespaces)
        self._devices: dict[_Key, SharedDevice] = {}
        self._inputs: dict[_Key, tuple[Any, Any]] = {}  # pool_inputs of each device kept
        self._by_configuration: dict[_Key, set[_Key]] = {}
        self._modes: dict[_Key, Allocator] = {}
        #: Pools to look at in the next pass; ``_everything``: every pool known (a (re)list).
        self._dirty: set[str] = set()
        self._everything = True
        self._instances_listed = False
        self._modes_listed = False
        self._wake = asyncio.Event()
        self._passing = False  # a pass is running
        self.passes = 0  # passes done, for tests and benchmarks
        self.examined = 0  # pools the passes looked at, for tests and benchmarks
        self._failing = ""  # the error the last pass failed with
        #: (namespace, configuration) → ``spec.unhealthyDevices.evictAfterSeconds``, where set.
        self._graces: dict[_Key, int] = {}
        #: Instance → when this controller first saw it unhealthy on every node (monotonic).
        self._unhealthy_since: dict[_Key, float] = {}
        self._grace_timer: asyncio.TimerHandle | None = None
        #: Nodes whose agent is gone (``controller.dra.agent_liveness``): left out of selectors.
        self._gone: frozenset[str] = frozenset()
        #: Whether the API server keeps per-device node selection (None: not asked yet): pools
        #: of many devices, else a pool per device (``controller.dra.pool_inputs.pool_of``).
        self.per_device_nodes: bool | None = None
        self._pool_of: dict[_Key, str] = {}  # the pool each kept device is published in
        self._members: dict[str, set[_Key]] = {}  # pool → the devices kept in it
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
        return live, written_slices.content_key(live)

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
                await asyncio.sleep(self._settings.shared_pools_retry_s)
        while True:
            await self._wake.wait()
            if not (self._instances_listed and self._modes_listed):
                self._wake.clear()
                continue
            await asyncio.sleep(self._settings.shared_pools_pass_delay_s)
            self._passing = True
            self._wake.clear()
            try:
                await self.reconcile()
                self._failing = ""
            except Exception as error:  # API error or away: the pass is retried
                # Said once per cause (a right missing: deploy/dra not reapplied), not per retry.
                if str(error) != self._failing:
                    log.warning("shared pools: pass failed (%s); retrying every %.0f s",
                                error, self._settings.shared_pools_retry_s)
                self._failing = str(error)
                self._wake.set()
                await asyncio.sleep(self._settings.shared_pools_retry_s)
            finally:
                self._passing = False

    async def _adopt(self) -> None:
        """Learn whether the API server keeps per-device node selection, and the pools an
        earlier controller wrote (``controller.dra.pool_writer``); devices kept before are placed
        again, a device published in a pool of its own staying there."""
        if self.per_device_nodes is None:
            self.per_device_nodes = await self._writer.keeps_per_device_nodes()
        self._adopted.update(await self._writer.adopt(self._serves))
        for key in list(self._devices):
            device, inputs = self._devices[key], self._inputs[key]
            self._forget(key)
            self._keep(key, device)
            self._inputs[key] = inputs
        self._everything = True

    def _taken(self) -> set[str]:
        """The pools this pass looks at, taken from the marks."""
        if self._everything:
            self._everything = False
            self._dirty.clear()
            return set(self._members) | set(self._writer.written)
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
        return assemble(pool, plans, held, self._writer.entries.get(pool, {}), pooled=not own)

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
                if pool in self._writer.written and not held:
                    gone.append(pool)
                continue
            key = written_slices.content_key(plan)
            if (w := self._writer.written.get(pool)) is None or w.key != key:
                changed.append((plan, key))
        self._time_graces()
        try:
            others = await self._writer.listed([p.name for p, _ in changed
                                                if p.name not in self._writer.written])
            listed = await self._writer.listed(gone)
            results = await asyncio.gather(
                *(self._writer.publish(plan, key, others.get(plan.name, []))
                  for plan, key in changed),
                *(self._writer.withdraw(pool, listed.get(pool, [])) for pool in gone),
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

    @property
    def writes(self) -> int:
        """API writes (applies and deletes) so far, for tests and benchmarks."""
        return self._writer.writes

    @property
    def features(self) -> dra_features.FeatureReport:
        """The DRA features the API server dropped from the slices written."""
        return self._writer.features
