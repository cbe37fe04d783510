"""One discovery run: one Configuration's handler, on this node, as one asyncio task.

``DiscoveryRun.start`` and ``stop`` run and end it: load the handler, resolve properties, parse
details, feed each device list to the publisher; bad input is reported and errors retried with
backoff (docs/architecture.md, "The agent's discovery modules").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from lightkube import AsyncClient

from agent.discovery.events import (
    REASON_DISCOVERY_FAILED,
    REASON_DISCOVERY_WARNING,
    REASON_INVALID_DETAILS,
    REASON_PROPERTY_UNAVAILABLE,
    REASON_UNKNOWN_HANDLER,
    ConfigurationReporter,
    emit_event,
)
from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.properties import (
    PropertyUnavailable,
    ReferenceWatch,
    references_of,
)
from agent.kube import watching
from agent.metrics import AgentMetrics
from agent.settings import current
from crds.api import CONFIGURATION_KIND
from crds.configuration import Configuration
from discovery_handlers.contract import (
    Device,
    DiscoveryHandler,
    InvalidDetails,
    PropertyValue,
    Secret,
    is_shared,
    warnings_of,
)
from discovery_handlers.external.status import HandlerStatus
from discovery_handlers.registry import BrokenHandler, UnknownHandler, load_handler

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 8
#: Secret values shorter than this are not searched for in device properties (a one-letter
#: password would match everywhere and drop honest properties).
MIN_GUARDED_SECRET_LENGTH = 4
#: The reason of this node's condition while an out-of-process handler the run needs is not
#: registered or not reachable (``HandlerStatus``).
REASON_HANDLER_UNAVAILABLE = "DiscoveryHandlerUnavailable"

RunKey = tuple[str, str]  # (namespace, configuration name)


class DiscoveryRun:
    """Owns the task of one Configuration's discovery on this node."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        node_name: str,
        configuration: Configuration,
        publisher: InstancePublisher,
        references: ReferenceWatch,
        metrics: AgentMetrics,
    ) -> None:
        self.configuration = configuration
        self.publisher = publisher
        self.key: RunKey = (configuration.namespace, configuration.name)
        self.properties: Mapping[str, PropertyValue] | None = None
        self._client = client
        self._node = node_name
        self._references = references
        self._metrics = metrics
        self._reporter = ConfigurationReporter(
            client=client, node_name=node_name, configuration=configuration
        )
        self._task: asyncio.Task[None] | None = None
        self._warnings: frozenset[str] = frozenset()
        self._warnings_lock = asyncio.Lock()
        self._got_result = False
        self._publish_failed = asyncio.Event()
        self._handler = configuration.spec.discovery_handler.name
        self._extra = {"configuration": f"{configuration.namespace}/{configuration.name}",
                       "node": node_name}

    def start(self) -> None:
        name = f"discovery-{self.key[0]}/{self.key[1]}"
        self._task = asyncio.create_task(self._run(), name=name)

    async def stop(self, *, withdraw: bool) -> None:
        """Cancel the run; ``withdraw`` also removes this node from the Instances."""
        if self._task is not None:
            self._task.cancel()
            # Whatever the run ended with (cancelled, or a crash already logged), it is
            # collected here, so nothing is left as "Task exception was never retrieved".
            await asyncio.gather(self._task, return_exceptions=True)
        self._references.track(self.key, frozenset())
        if withdraw:
            self._metrics.forget_run(*self.key, self._node, self._handler)
            await self.publisher.withdraw()
            if self._warnings:  # this node no longer runs it: its warnings are over
                self._warnings = frozenset()
                await self._write_warnings()

    async def _run(self) -> None:
        cfg = self.configuration
        extra = {"configuration": f"{cfg.namespace}/{cfg.name}", "node": self._node}
        handler_name = cfg.spec.discovery_handler.name
        try:
            handler = load_handler(handler_name)
        except (UnknownHandler, BrokenHandler) as exc:
            self._metrics.discovery_errors.labels(handler_name, REASON_UNKNOWN_HANDLER).inc()
            await self._problem(REASON_UNKNOWN_HANDLER, str(exc))
            return
        try:
            await self._discover_with_backoff(handler, extra)
        except Exception:
            log.exception("discovery run crashed", extra=extra)
            raise
        finally:
            await self.publisher.close()

    async def _discover_with_backoff(
        self, handler: DiscoveryHandler, extra: Mapping[str, str]
    ) -> None:
        cfg = self.configuration
        failures = 0
        adopted = False
        while True:
            try:
                if not adopted:
                    await self.publisher.adopt()
                    adopted = True
                props = cfg.spec.discovery_handler.discovery_properties
                self._references.track(
                    self.key, references_of(namespace=cfg.namespace, properties=props)
                )
                resolved = await self._references.resolve(
                    namespace=cfg.namespace, properties=props)
                self.properties = resolved.values
                details = handler.parse_details(
                    cfg.spec.discovery_handler.discovery_details, resolved.values
                )
            except InvalidDetails as exc:
                self._metrics.discovery_errors.labels(handler.name, REASON_INVALID_DETAILS).inc()
                await self._problem(REASON_INVALID_DETAILS, str(exc))
                return
            except PropertyUnavailable as exc:
                self._metrics.discovery_errors.labels(
                    handler.name, REASON_PROPERTY_UNAVAILABLE
                ).inc()
                await self._problem(REASON_PROPERTY_UNAVAILABLE, str(exc))
                return
            except Exception as exc:  # adoption or a property read hit a transient API error,
                # or the API server is unreachable (httpx's errors)
                failures += 1
                if not await self._back_off(handler, failures, exc, extra):
                    return
                continue
            self._got_result = False
            try:
                await self._discover(handler, details)
                return  # the handler's stream ended: nothing more will come
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = 1 if self._got_result else failures + 1
                if not await self._back_off(handler, failures, exc, extra):
                    return

    async def _back_off(
        self, handler: DiscoveryHandler, failures: int, exc: Exception, extra: Mapping[str, str]
    ) -> bool:
        """Count and report a failure, wait; False once the run should give up."""
        self._metrics.discovery_errors.labels(handler.name, type(exc).__name__).inc()
        if failures >= MAX_CONSECUTIVE_FAILURES:
            await self._problem(
                REASON_DISCOVERY_FAILED, f"gave up after {failures} consecutive failures: {exc}"
            )
            return False
        timings = current().discovery
        delay = min(timings.restart_backoff_max_s,
                    timings.restart_backoff_base_s * 2 ** (failures - 1))
        log.warning("discovery failed (%s); retrying in %.1fs", exc, delay, extra=extra)
        await self._problem(
            REASON_DISCOVERY_FAILED, f"{exc} (attempt {failures}, retrying)"
        )
        await asyncio.sleep(delay)
        return True

    async def _discover(self, handler: DiscoveryHandler, details: Any) -> None:
        shared = is_shared(handler, details)
        loop = asyncio.get_running_loop()
        # One pass per list (``edgeplug_discovery_duration_seconds``): from the list's arrival
        # to its publish; the run's first pass counts from the run's start, so it includes the
        # handler's first scan. The wait for the next change belongs to no pass.
        started: float | None = loop.time()
        first = True
        resync = asyncio.create_task(self._resync_forever(), name=f"resync-{self.key[1]}")
        try:
            async for devices in handler.discover(details):
                if started is None:
                    started = loop.time()
                if isinstance(devices, HandlerStatus):
                    first = False  # the handler's own verdict speaks for the run from now on
                    await self._report_handler(devices)
                try:
                    await self.publisher.publish(
                        handler, details, self._without_secrets(devices), shared=shared
                    )
                except Exception as failed:
                    publish_error: Exception | None = failed
                else:
                    publish_error = None
                self._metrics.discovery_duration.labels(handler.name).observe(
                    loop.time() - started)
                started = None
                # The list's warnings after its devices: the first pass's condition write
                # (one Configuration status write) was on the path to the first plugin.
                await self._post_warnings(warnings_of(devices))
                if publish_error is not None:
                    # The API server away or refusing: the handler keeps running, and the
                    # resync loop publishes the newest list again, with backoff, until it lands.
                    log.warning("publishing devices failed (%s); retrying",
                                watching.describe(publish_error), extra=self._extra)
                    self._publish_failed.set()
                    continue
                if first:
                    first = False
                    self._got_result = True
                    await self._ok(f"discovery running on node {self._node}")
        finally:
            resync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resync

    async def _problem(self, reason: str, message: str) -> None:
        """This node's verdict on the run: a problem (the condition, and the metric)."""
        self._metrics.set_discovery_failing(*self.key, self._node, self._handler, True)
        await self._reporter.problem(reason, message)

    async def _ok(self, message: str) -> None:
        self._metrics.set_discovery_failing(*self.key, self._node, self._handler, False)
        await self._reporter.ok(message)

    async def _report_handler(self, status: HandlerStatus) -> None:
        """An out-of-process handler registered, was lost or is awaited: this node's verdict."""
        self._metrics.handlers_reachable.labels(self._handler).set(int(status.ready))
        if status.ready:
            self._got_result = True
            await self._ok(status.message)
        else:
            await self._problem(REASON_HANDLER_UNAVAILABLE, status.message)

    async def _post_warnings(self, warnings: Sequence[str]) -> None:
        """Each warning the handler newly carries (``DeviceList``) is logged and posted once as a
        Warning Event on the Configuration; one it no longer carries is logged as ended. The
        current ones are this node's ``DiscoveryHealthy`` condition (``events``)."""
        current = frozenset(warnings)
        cfg = self.configuration
        for message in sorted(current - self._warnings):
            log.warning("discovery warning: %s", message, extra=self._extra)
            try:
                await emit_event(self._client, node=self._node, kind=CONFIGURATION_KIND,
                                 name=cfg.name, namespace=cfg.namespace, uid=cfg.uid,
                                 reason=REASON_DISCOVERY_WARNING, message=message, warning=True)
            except Exception as exc:  # the API server away: the log line stands
                log.warning("could not post the discovery warning (%s)",
                            watching.describe(exc), extra=self._extra)
        for message in sorted(self._warnings - current):
            log.info("discovery warning ended: %s", message, extra=self._extra)
        self._warnings = current
        await self._write_warnings()

    async def _write_warnings(self) -> None:
        """The current warnings as this node's condition. One write at a time, each reading
        the newest warnings once it holds the lock, so a slower older write never lands last."""
        async with self._warnings_lock:
            await self._reporter.warnings(sorted(self._warnings))

    def _without_secrets(self, devices: Sequence[Device]) -> list[Device]:
        """Devices with every property that carries a Secret's value dropped (and said so,
        naming the property, never the value): properties reach Instances and containers."""
        secrets = [v.value for v in (self.properties or {}).values() if isinstance(v, Secret)]
        secrets = [s for s in secrets if len(s) >= MIN_GUARDED_SECRET_LENGTH]
        if not secrets:
            return list(devices)
        clean = []
        for device in devices:
            leaking = sorted(
                k for k, v in device.properties.items()
                if any(s in v.encode("utf-8", "surrogateescape") for s in secrets)
            )
            if leaking:
                log.warning(
                    "handler put a Secret's value into device properties %s; dropped", leaking,
                    extra={"configuration": "/".join(self.key), "device": device.id},
                )
                device = replace(
                    device,
                    properties={k: v for k, v in device.properties.items() if k not in leaking},
                )
            clean.append(device)
        return clean

    async def _resync_forever(self) -> None:
        """Re-publish every ``settings.discovery.resync_interval_s`` (heals Instances deleted behind
        our back and re-derives every join and leave), and soon after a failed publish, with
        backoff."""
        failures = 0
        while True:
            if failures == 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(current().discovery.resync_interval_s):
                        await self._publish_failed.wait()
                failures = 1 if self._publish_failed.is_set() else 0
            if failures:
                await asyncio.sleep(watching.retry_delay(failures))
            self._publish_failed.clear()
            try:
                await self.publisher.resync()
                failures = 0
                await self._write_warnings()  # one whose write failed lands here
            except Exception as exc:
                failures += 1
                log.warning("resync of %s/%s failed (%s)", *self.key, watching.describe(exc))
