"""The kubelet's DRA resource-health service (KEP-4680): this node's verdict on every device its
DRA plugin serves (Healthy, Unhealthy with a reason, Unknown once gone), the same one that taints
it in its slice, streamed to the kubelet at once, on every change and again every
``dra.health_refresh_s``. Asked ``NodeWatchResources`` in ``v1`` and ``v1alpha1`` (``SERVICES``);
``HealthStreams.stop`` ends the open streams cleanly. docs/dra.md, "Health in the pod".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import slices
from agent.kubeletapi import dra_health_v1_pb2 as v1
from agent.kubeletapi import dra_health_v1_pb2_grpc as v1_grpc
from agent.kubeletapi import dra_health_v1alpha1_pb2 as v1alpha1
from agent.kubeletapi import dra_health_v1alpha1_pb2_grpc as v1alpha1_grpc
from agent.settings import current

log = logging.getLogger(__name__)

#: The health services this plugin serves, as its registration lists them (newest first).
SERVICES: Final = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: The API's longest message; the kubelet cuts longer ones.
MAX_MESSAGE: Final = 1024
GONE_MESSAGE: Final = "no longer served on this node"


class Status(Enum):
    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceReport:
    """One device's line in a report: where its slice publishes it, and this node's verdict."""

    pool: str
    device: str
    status: Status
    message: str
    since: int  # Unix seconds when this verdict was first sent on this stream


def pool_of(device: NodeDevice, node: str) -> str:
    """The pool the device's ResourceSlice publishes it in (``agent.dra.slices``)."""
    if device.shared:
        return slices.shared_pool(device.namespace, device.configuration, device.instance)
    return slices.local_pool(device.namespace, device.configuration, node)


Verdicts = dict[tuple[str, str], tuple[Status, str]]


def verdicts(node: str, served: Mapping[Any, NodeDevice]) -> Verdicts:
    """(pool, device name) → (status, message) of every device of the table."""
    found: Verdicts = {}
    for device in served.values():
        key = (pool_of(device, node), slices.device_name(device.instance))
        found[key] = ((Status.HEALTHY, "") if device.healthy
                      else (Status.UNHEALTHY, device.health.reason[:MAX_MESSAGE]))
    return found


class HealthReports:
    """The reports one stream sends, ``watch`` until cancelled or until ``stopping`` is set."""

    def __init__(self, *, node_name: str, devices: NodeDeviceTable,
                 stopping: asyncio.Event | None = None,
                 clock: Callable[[], float] = time.time,
                 refresh: float | None = None) -> None:
        """``refresh``: seconds between resends of an unchanged list (default: the settings
        tree's ``dra.health_refresh_s``)."""
        self._node = node_name
        self._devices = devices
        self._stopping = stopping if stopping is not None else asyncio.Event()
        self._clock = clock
        self._refresh = refresh if refresh is not None else current().dra.health_refresh_s

    async def watch(self) -> AsyncGenerator[list[DeviceReport]]:
        sent: dict[tuple[str, str], DeviceReport] = {}
        refresh: bool | None = True  # the first report goes at once
        while refresh is not None:
            version = self._devices.version  # before the snapshot: no change slips between
            current = verdicts(self._node, self._devices.snapshot())
            if refresh or current != {k: (r.status, r.message) for k, r in sent.items()}:
                now = int(self._clock())
                report = {key: _kept(sent.get(key), key, verdict, now)
                          for key, verdict in current.items()}
                gone = [DeviceReport(pool=k[0], device=k[1], status=Status.UNKNOWN,
                                     message=GONE_MESSAGE, since=now)
                        for k in sent if k not in current]
                yield [*report.values(), *gone]
                sent = report
            refresh = await self._next(version)

    async def _next(self, version: int) -> bool | None:
        """Wait for the table to change (False), the refresh (True) or the stop (None)."""
        changed = asyncio.ensure_future(self._devices.wait_changed(version))
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait((changed, stopped), timeout=self._refresh,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            stopped.cancel()
        if stopped in done:
            return None
        return changed not in done


def _kept(before: DeviceReport | None, key: tuple[str, str], verdict: tuple[Status, str],
          now: int) -> DeviceReport:
    """The device's line: its ``since`` stays while its verdict does."""
    if before is not None and (before.status, before.message) == verdict:
        return before
    return DeviceReport(pool=key[0], device=key[1], status=verdict[0], message=verdict[1],
                        since=now)


def _described(reports: list[DeviceReport]) -> dict[str, int]:
    counts = {s.name.lower(): 0 for s in Status}
    for r in reports:
        counts[r.status.name.lower()] += 1
    return counts


class HealthStreams:
    """What both API versions serve: this node's reports, one ``HealthReports`` per stream.
    ``stop`` ends every open stream cleanly (the kubelet reads the end of the stream, not an
    error) before the server stops."""

    def __init__(self, *, node_name: str, devices: NodeDeviceTable) -> None:
        self._node = node_name
        self._devices = devices
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def reports(self, version: str, context: Any) -> AsyncIterator[list[DeviceReport]]:
        peer = str(context.peer())
        log.info("DRA health stream opened by the kubelet", extra={"api": version,
                                                                   "peer": peer})
        try:
            async for reports in HealthReports(node_name=self._node, devices=self._devices,
                                               stopping=self._stopping).watch():
                log.debug("DRA health sent", extra={"api": version, **_described(reports)})
                yield reports
        finally:
            log.info("DRA health stream closed", extra={"api": version, "peer": peer})


class HealthV1(v1_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth``."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(
        self, request: v1.NodeWatchResourcesRequest, context: Any,
    ) -> AsyncIterator[v1.NodeWatchResourcesResponse]:
        async for reports in self._streams.reports("v1", context):
            yield v1.NodeWatchResourcesResponse(devices=[v1.DeviceHealth(
                device=v1.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                health=v1.HealthStatus.ValueType(r.status.value), last_updated_time=r.since,
                health_check_timeout_seconds=current().dra.health_timeout_s, message=r.message,
            ) for r in reports])


class HealthV1Alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``, for kubelets that know no v1."""

    def __init__(self, streams: HealthStreams) -> None:
        self._streams = streams

    async def NodeWatchResources(
        self, request: v1alpha1.NodeWatchResourcesRequest, context: Any,
    ) -> AsyncIterator[v1alpha1.NodeWatchResourcesResponse]:
        async for reports in self._streams.reports("v1alpha1", context):
            yield v1alpha1.NodeWatchResourcesResponse(devices=[v1alpha1.DeviceHealth(
                device=v1alpha1.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                health=v1alpha1.HealthStatus.ValueType(r.status.value),
                last_updated_time=r.since,
                health_check_timeout_seconds=current().dra.health_timeout_s,
                message=r.message,
            ) for r in reports])
