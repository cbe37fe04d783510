"""The ``ascend`` handler's contract adapter (v2): parse details, poll the chips, serve the hooks.

``discover`` runs one pass at once and again every ``healthPollSeconds`` on the handlers' thread
pool, and yields the device list whenever a chip appears, goes or changes (health included).
The last pass's status (the source used, what could not be read) is logged when it changes and
kept per details for ``status``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from discovery_handlers.ascend import devices as shaping
from discovery_handlers.ascend import huawei
from discovery_handlers.ascend.details import SOURCE_DEVICES, AscendDetails, parse_details
from discovery_handlers.contract import (
    ClaimDevice,
    Device,
    DeviceList,
    PodFacts,
    PropertyValue,
    run_blocking,
)

NAME = "ascend"
STATUS_KEPT = 64  # details whose last status is kept (one per Configuration on a node)
log = logging.getLogger(__name__)


#: The Configuration's warning while chips are only listed from their device nodes.
NO_DRIVER_WARNING = (
    "no DCMI or npu-smi: health unknown; chips are listed from /dev/davinci* only and "
    "advertised healthy (mount the driver, /usr/local/dcmi and npu-smi into the agent: "
    "docs/handlers/ascend.md, 'On a real node')"
)


def fallback_warnings(source: str) -> tuple[str, ...]:
    """The Configuration-level warning a pass gives (once as an Event: agent.discovery.runs)."""
    return (NO_DRIVER_WARNING,) if source == SOURCE_DEVICES else ()


class ChipsUnhealthy(RuntimeError):
    """Raised by ``prepare`` when a chip went unhealthy or vanished before the container starts."""


class AscendHandler:
    """Huawei Ascend NPUs: one local device per chip; ``handler`` below is the entry point's."""

    name = NAME
    shared = False

    def __init__(self) -> None:
        self._status: dict[AscendDetails, Any] = {}

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]
                      ) -> AscendDetails:
        return parse_details(details, properties)

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        assert isinstance(details, AscendDetails)
        from discovery_handlers.ascend.sources import scan  # imports the ctypes wrapper

        last: tuple[tuple[Device, ...], tuple[str, ...]] | None = None
        while True:
            result = await run_blocking(scan, details)
            self._note(details, result.status)
            warnings = fallback_warnings(result.status.source)
            if (result.devices, warnings) != last:
                last = (result.devices, warnings)
                yield DeviceList(result.devices, warnings)
            await asyncio.sleep(details.health_poll_seconds)

    def status(self, details: AscendDetails) -> Any:
        """The ``ScanStatus`` of the last pass for these details (None before the first)."""
        return self._status.get(details)

    def compose(self, details: Any, devices: Sequence[Device]) -> Mapping[str, str]:
        assert isinstance(details, AscendDetails)
        return shaping.compose(details, devices)

    def rank(self, details: Any, available: Sequence[Device], must_include: Sequence[Device],
             size: int) -> Sequence[Device]:
        return shaping.rank(available, must_include, size)

    def node_labels(self, details: Any, devices: Sequence[Device]) -> Mapping[str, str]:
        """``edgeplug.io/`` Node labels for the chips, and Huawei's own (``huaweiMetadata``)."""
        assert isinstance(details, AscendDetails)
        if details.vnpu_type is not None or details.vnpu_partitions:  # the chips' labels
            return {}
        labels = shaping.node_labels(devices)
        if details.huawei_metadata:
            labels.update(huawei.node_labels(devices))
        return labels

    def pod_annotations(self, details: Any, devices: Sequence[Device], pod: PodFacts
                        ) -> Mapping[str, str]:
        """Huawei's annotations for a pod holding ``devices`` (``huaweiMetadata``)."""
        assert isinstance(details, AscendDetails)
        if not details.huawei_metadata or details.vnpu_type is not None or \
                details.vnpu_partitions:
            return {}  # a vNPU pod's keys (huawei.com/<vNPU type>) are not among those written
        return huawei.pod_annotations(devices, pod)

    async def prepare(self, details: Any, devices: Sequence[Device]) -> None:
        """Re-read the chips right before the container starts; refuse unhealthy or gone ones."""
        assert isinstance(details, AscendDetails)
        from discovery_handlers.ascend.sources import scan

        result = await run_blocking(scan, details)
        self._note(details, result.status)
        now = {d.id: d for d in result.devices}
        bad = []
        for device in devices:
            current = now.get(device.id)
            if current is None:
                bad.append(f"{device.id} is gone ({result.status})")
            elif not current.health.healthy:
                bad.append(f"{device.id} is unhealthy: {current.health.reason}")
        if bad:
            raise ChipsUnhealthy("Ascend chips not usable: " + "; ".join(bad))

    async def prepare_claim_device(self, details: Any, device: Device) -> ClaimDevice | None:
        """A partition's vNPU created on its chip (``vnpu_claims``); None for other devices."""
        assert isinstance(details, AscendDetails)
        from discovery_handlers.ascend import vnpu_claims  # imports the ctypes wrapper

        return await run_blocking(vnpu_claims.make, details, device)

    async def unprepare_claim_device(self, record: Mapping[str, str]) -> None:
        """The vNPU ``record`` names destroyed."""
        from discovery_handlers.ascend import vnpu_claims

        await run_blocking(vnpu_claims.destroy, record)

    def claim_device_kept(self, record: Mapping[str, str]) -> None:
        from discovery_handlers.ascend import vnpu_claims

        vnpu_claims.kept(record)

    def _note(self, details: AscendDetails, status: Any) -> None:
        if self._status.get(details) != status:
            level = logging.WARNING if status.degraded else logging.INFO
            log.log(level, "ascend discovery (%s): %s", details.host_root, status)
        self._status.pop(details, None)
        self._status[details] = status
        while len(self._status) > STATUS_KEPT:  # forget the details used longest ago
            del self._status[next(iter(self._status))]
