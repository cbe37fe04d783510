"""Turn one Configuration's device lists into Instances for this node: every full list a
handler yields becomes Instances (one per shared device, listing every node that sees it; one
per node for a local device), entries in the ``NodeDeviceTable`` the allocators serve, this
node's labels and the instances gauge. A shared device gone keeps this node, marked unhealthy,
for ``offlineGracePeriodSeconds``; a local one goes at once. Names: ``instance_placement``;
writes: ``instance_writes``; why the writes are safe: docs/architecture.md, "How an Instance
is written"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from lightkube import AsyncClient

from agent.discovery.cdi_specs import CdiSpecs
from agent.discovery.device_health import HealthReporter
from agent.discovery.instance_ownership import Ownership, Wanted, log_extra
from agent.discovery.instance_placement import NamePlacer
from agent.discovery.instance_writes import InstanceWrites
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.kube import node_instances, watching
from agent.metrics import AgentMetrics
from agent.settings import current
from crds.configuration import Configuration
from crds.instance import Instance
from crds.naming import (
    cdi_name,
    configuration_resource_name,
    instance_name,
    name_digest,
)
from discovery_handlers.contract import Device, DiscoveryHandler, Health, LabellingHandler

log = logging.getLogger(__name__)

#: Newly written devices are handed to the table in batches of at least
#: ``publishing.serve_batch_s`` and at least this share of the devices served (each CDI write
#: renders every device served: batches of a fixed size made the writes quadratic).
SERVE_BATCH_SHARE = 0.25
_T = TypeVar("_T")
OFFLINE_REASON = "not seen by discovery; kept for offlineGracePeriodSeconds"


class InstancePublisher:
    """Instances of one Configuration as this node sees them. Not shared between runs."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        node_name: str,
        configuration: Configuration,
        devices: NodeDeviceTable,
        labels: NodeLabels,
        metrics: AgentMetrics,
        cdi: CdiSpecs | None = None,
    ) -> None:
        self._client = client
        self._node = node_name
        self._cfg = configuration
        self._table = devices
        self._labels = labels
        self._metrics = metrics
        self._own = Ownership(cfg=configuration, node=node_name)
        key = (configuration.namespace, configuration.name)
        self._health = HealthReporter(
            client=client, node_name=node_name, namespace=configuration.namespace,
            marks_reported=lambda: devices.decided_by_previous_controller(*key),
        )
        self._writes = InstanceWrites(
            client=client, ownership=self._own, health=self._health,
            with_slots=lambda: devices.device_plugins_allocate(*key, dra=current().serve_dra),
        )
        self._placer = NamePlacer(client=client, ownership=self._own, writes=self._writes,
                                  leave=self._leave_either)
        self._grace: dict[str, asyncio.Task[None]] = {}
        self._last: tuple[DiscoveryHandler, Any, Sequence[Device], bool] | None = None
        self._served: dict[str, NodeDevice] = {}  # what this node serves, CDI name included
        self._cdi = cdi if cdi is not None else CdiSpecs(None)
        self._lock = asyncio.Lock()
        #: Devices of the running publish whose first verdict is written, not yet in the table.
        self._ready: list[NodeDevice] = []
        self._batch_started = 0.0

    @property
    def owned(self) -> Mapping[str, bool]:
        return dict(self._own.owned)

    async def adopt(self) -> None:
        """Take over the Instances an earlier run or agent left naming this node."""
        cfg = self._cfg
        async for obj in node_instances.list_instances(self._client, self._node, cfg.namespace):
            instance = Instance.from_object(obj)
            spec = instance.spec
            if spec.configuration_name == cfg.name and self._node in spec.nodes:
                self._own.adopt(instance)
        log.info(
            "adopted %d Instances", len(self._own.owned),
            extra={"configuration": f"{cfg.namespace}/{cfg.name}", "node": self._node},
        )

    async def publish(
        self, handler: DiscoveryHandler, details: Any, devices: Sequence[Device], *, shared: bool
    ) -> None:
        """Make the API and the table say what the latest full device list says."""
        async with self._lock:
            self._last = (handler, details, devices, shared)
            groups = self._own.groups(devices, shared=shared)
            desired = {name for group in groups for name in self._own.kept(group)}
            # Grace timers first, writes after: a write that fails (the API server away) ends
            # the pass, and a shared device gone meanwhile must still leave one grace period
            # after it went, not one grace period after the server came back.
            for name in desired:
                task = self._grace.pop(name, None)
                if task is not None:
                    task.cancel()
            for name, was_shared in list(self._own.owned.items()):
                if was_shared and name not in desired and name not in self._grace:
                    served = self._served.get(name)
                    if served is not None:
                        self._served[name] = replace(
                            served, health=Health.unhealthy(OFFLINE_REASON)
                        )
                    self._grace[name] = asyncio.create_task(
                        self._leave_after_grace(name), name=f"grace-{name}"
                    )
            # Several Instances in flight at once: one at a time, 200 devices waited on 400
            # API round trips in a row before the first plugin. The devices of one Akri name
            # go one after the other (each takes a name the one before did not). Each device's
            # first verdict follows its own Instance, not the last one's.
            records = await self._placer.lookups(groups) if shared else None
            self._ready = []
            self._batch_started = asyncio.get_running_loop().time()
            placed = await _bounded([
                self._place_and_report(group, handler, details, shared=shared, records=records)
                for group in groups])
            failed: BaseException | None = None
            published: set[str] = set()
            for outcome in placed:
                if isinstance(outcome, BaseException):
                    failed = failed or outcome
                    continue
                published.update(name for _wanted, name in outcome if name is not None)
            if failed is not None:
                await self._serve_ready(now=True)  # those reported are served all the same
                raise failed  # as before, a failed write ends the pass
            for name, was_shared in list(self._own.owned.items()):
                if name not in desired and name not in published and not was_shared:
                    await self._leave(name, shared=False)
            await self._serve()
            await self._report()

    async def resync(self) -> None:
        """Re-apply every visible device (heals Instances deleted behind our back)."""
        if self._last is None:
            return
        self._writes.forget_all()
        handler, details, devices, shared = self._last
        await self.publish(handler, details, devices, shared=shared)

    async def withdraw(self) -> None:
        """This node stops serving the Configuration: leave (or delete) all its Instances."""
        await self.close()
        async with self._lock:
            owned = list(self._own.owned.items())
            # This node stops serving every one of them before any API write (each _leave
            # does that for its own first): the plugins go at once, not one API round trip
            # apart each.
            # The CDI spec is written once for all of them (one write per Instance rendered
            # the remaining devices each time: 200 devices, 20,000 renders).
            for name, _shared in owned:
                self._forget(name)
            self._write_cdi()
            for name, _shared in owned:
                await self._table.remove(self._cfg.namespace, name)
            outcomes = await _bounded([self._leave(name, shared=shared) for name, shared in owned])
            for (name, _shared), outcome in zip(owned, outcomes, strict=True):
                if isinstance(outcome, Exception):  # the ownerReference still collects it
                    log.warning("could not leave Instance %s: %s", name,
                                watching.describe(outcome), extra=self._extra(name))
                elif isinstance(outcome, BaseException):
                    raise outcome
            await self._report()

    async def close(self) -> None:
        """Stop grace timers; the Instances stay as they are (a restart adopts them)."""
        tasks = list(self._grace.values())
        self._grace.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- writing -------------------------------------------------------------------------

    async def _place_and_report(
        self, group: Sequence[Wanted], handler: DiscoveryHandler, details: Any, *,
        shared: bool, records: Mapping[str, str] | None,
    ) -> list[tuple[Wanted, str | None]]:
        """Place one Akri name's devices, record each as this node's and hand each new shared
        one to the table with the next batch (after its first verdict where a controller of the
        previous release waits for it)."""
        placed = await self._placer.place_group(group, shared=shared, records=records)
        for wanted, name in placed:
            if name is None:
                continue  # every name it may take is held (said once)
            self._own.take(name, wanted.digest, shared=shared)
            served = self._node_device(name, handler, details, wanted.device, shared=shared)
            self._served[name] = served
            if shared:
                if self._health.first_verdict_due(name, shared=shared):
                    await self._report_health(name, served)
                self._ready.append(served)
        await self._serve_ready()
        return placed

    async def _serve_ready(self, *, now: bool = False) -> None:
        """Put the devices whose first verdict is written in the table, after one CDI write
        for all of them: a batch at least ``settings.publishing.serve_batch_s`` long and
        ``SERVE_BATCH_SHARE`` of the devices served (``now``: at once)."""
        loop = asyncio.get_running_loop()
        if not self._ready:
            return
        if not now and (loop.time() - self._batch_started < current().publishing.serve_batch_s
                        or len(self._ready) < SERVE_BATCH_SHARE * len(self._served)):
            return
        ready, self._ready = self._ready, []
        self._batch_started = loop.time()
        with_cdi = self._write_cdi()
        for served in ready:
            await self._table.put(served if with_cdi else replace(served, cdi_name=""))

    async def _leave(self, name: str, *, shared: bool) -> None:
        """Remove this node from ``name``; delete it when local or when no node is left.

        This node stops serving it first; ``name`` stays owned until the API agrees, so a
        failed leave (the API server away) is derived again by the next publish or resync.
        """
        await self._stop_serving(name)
        if not shared:
            await self._writes.delete(name)
        elif await self._writes.delete_if_alone(name):
            self._health.forget(name)
        else:
            await self._health.unreport(name)
            await self._writes.leave_shared(name)
        self._own.drop(name)

    async def _leave_either(self, name: str, shared: bool) -> None:
        await self._leave(name, shared=shared)

    async def _stop_serving(self, name: str) -> None:
        """This node no longer serves ``name`` (its plugin goes); the API is not written."""
        if self._forget(name):
            self._write_cdi()
        await self._table.remove(self._cfg.namespace, name)

    def _forget(self, name: str) -> bool:
        """Drop ``name`` from what this node serves (the table is the caller's); whether it
        was served (its CDI spec entry must go)."""
        self._writes.forget(name)
        self._health.forget(name)
        return self._served.pop(name, None) is not None

    async def _leave_after_grace(self, name: str) -> None:
        """Leave ``name`` once its grace is over; retried until done or superseded (the device
        came back, the run stopped): a failure here must not leave this node listed for good."""
        await asyncio.sleep(self._cfg.spec.offline_grace_period_seconds)
        failures = 0
        while True:
            async with self._lock:
                if self._grace.get(name) is not asyncio.current_task():
                    return
                try:
                    await self._leave(name, shared=True)
                except Exception as exc:  # ApiError, or the API server unreachable
                    failures += 1
                    log.warning("could not leave Instance %s (%s); retrying", name,
                                watching.describe(exc), extra=self._extra(name))
                else:
                    del self._grace[name]
                    await self._report()
                    return
            await asyncio.sleep(watching.retry_delay(failures))

    # -- the node's view -------------------------------------------------------------------

    def _node_device(
        self, name: str, handler: DiscoveryHandler, details: Any, device: Device, *, shared: bool
    ) -> NodeDevice:
        return NodeDevice(
            instance=name,
            namespace=self._cfg.namespace,
            configuration=self._cfg.name,
            device=device,
            broker_properties=self._cfg.spec.broker_properties,
            cdi_name=cdi_name(self._cfg.name, name_digest(name)),
            configuration_resource=configuration_resource_name(
                self._cfg.name, self._cfg.spec.resource_name),
            health=device.health,
            shared=shared,
            handler=handler,
            details=details,
        )

    def _write_cdi(self) -> bool:
        return self._cdi.write(self._cfg.namespace, self._cfg.name, list(self._served.values()))

    async def _serve(self) -> None:
        """Spec on disk first, then the table (CDI names only if the spec was written), then
        each device's health reported where it differs from the stored verdict; a shared
        device's first verdict, where one is written, before the table hears of it."""
        self._ready = []  # the table gets every device below
        with_cdi = self._write_cdi()
        # A new shared device's first verdict (status.reported, for a controller of the
        # previous release) is a status write the slot service's first reservation write would
        # otherwise race, and lose (a 409 and a re-read): the table, which starts that
        # service's pass, comes after it. ``_place_and_report`` wrote those of the devices
        # this pass placed; these are the ones whose write failed before.
        first = {name: served for name, served in self._served.items()
                 if self._health.first_verdict_due(name, shared=served.shared)}
        # Each report and warning handles its own errors; up to writes_in_flight at once.
        await _bounded([self._report_health(name, served) for name, served in first.items()])
        for served in self._served.values():
            await self._table.put(served if with_cdi else replace(served, cdi_name=""))
        await _bounded([self._report_health(name, served)
                        for name, served in self._served.items() if name not in first])

    async def _report_health(self, name: str, served: NodeDevice) -> None:
        await self._health.report(name, served.health, shared=served.shared)
        await self._health.warn(name, served.device.warning)

    async def _report(self) -> None:
        cfg = self._cfg
        self._metrics.instances.labels(cfg.namespace, cfg.name).set(len(self._own.owned))
        self._metrics.set_devices(cfg.namespace, cfg.name, self._node,
                                  [d.healthy for d in self._served.values()])
        renamed = sum(1 for name, served in self._served.items() if name != instance_name(
            cfg.name, served.device.id, shared=served.shared, node=self._node))
        self._metrics.instance_name_collisions.labels(cfg.namespace, cfg.name, self._node).set(
            renamed)
        handler_labels: Mapping[str, str] = {}
        if self._last is not None and self._own.owned:
            handler, details = self._last[0], self._last[1]
            if isinstance(handler, LabellingHandler):
                try:
                    handler_labels = handler.node_labels(
                        details, [s.device for s in self._served.values()]
                    )
                except Exception:  # a handler's bug must not stop publishing
                    log.exception("handler %s: node_labels failed", handler.name)
        await self._labels.set(
            namespace=cfg.namespace, configuration=cfg.name, has_devices=bool(self._own.owned),
            handler_labels=handler_labels,
        )


    def _extra(self, name: str) -> dict[str, str]:
        return log_extra(self._cfg, self._node, name)


async def _bounded(calls: Sequence[Coroutine[Any, Any, _T]]) -> list[_T | BaseException]:
    """Await ``calls``, at most ``publishing.writes_in_flight`` at a time; each one's result or
    exception, in order (every call runs to its end)."""
    gate = asyncio.Semaphore(current().publishing.writes_in_flight)

    async def one(call: Coroutine[Any, Any, _T]) -> _T:
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
