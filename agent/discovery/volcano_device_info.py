"""Keeps Huawei's device-info ConfigMap for Volcano, ``kube-system/mindx-dl-deviceinfo-<node>``.

With ``VOLCANO_DEVICE_INFO=on``, ``DeviceInfoWriter`` writes it in Huawei's format
(``discovery_handlers.ascend.device_info``) from this node's ``ascend`` chips whose
Configuration keeps ``huaweiMetadata`` on, a chip any pod holds left out of the free list, and
the Node annotation ``baseDeviceInfos``; on each change and at least every
``settings.discovery.volcano_refresh_s``; never deleted. docs/handlers/ascend.md, "Volcano's
view of the chips"; its rights: ``deploy/ascend/agent-device-info.yaml``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.types import PatchType

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube import node_instances
from agent.kube.client import field_manager
from agent.settings import current
from discovery_handlers.ascend import device_info

log = logging.getLogger(__name__)

HANDLER = "ascend"

_Key = tuple[str, str]


def _held(obj: Mapping[str, Any]) -> bool:
    usage = (obj.get("spec") or {}).get("deviceUsage") or {}
    return any(value for value in usage.values())


class DeviceInfoWriter:
    """Writes this node's device-info ConfigMap whenever its chips, their health or their use
    change."""

    def __init__(self, *, client: AsyncClient, node: str, devices: NodeDeviceTable,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._node = node
        self._devices = devices
        self._clock = clock
        self._held: dict[_Key, bool] = {}
        self._wake = asyncio.Event()
        #: (physical id, error code) → when this agent first saw the code, Unix ms.
        self._first_seen: dict[tuple[int, int], int] = {}
        self._written: dict[str, str] | None = None
        self._annotated = ""
        self.name = device_info.configmap_name(node)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_usage())
            group.create_task(self._watch_devices())
            group.create_task(self._write_loop())

    async def _watch_usage(self) -> None:
        async for kind, obj in node_instances.watch(self._client, self._node,
                                                    what="Instances (device-info usage)"):
            meta = obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            held = kind != "DELETED" and _held(obj)
            if self._held.get(key, False) != held:
                self._wake.set()
            if kind == "DELETED":
                self._held.pop(key, None)
            else:
                self._held[key] = held

    async def _watch_devices(self) -> None:
        version = self._devices.version
        self._wake.set()
        while True:
            version = await self._devices.wait_changed(version)
            self._wake.set()

    def lists(self) -> dict[str, str] | None:
        """The ``DeviceList`` now (None: this node has no chip to report)."""
        chips = self._chips()
        now_ms = int(self._clock() * 1000)
        present = {(view.phy, code) for _, view in chips if view.faults
                   for code, _ in view.faults.codes}
        self._first_seen = {key: self._first_seen.get(key, now_ms) for key in present}
        if not chips and self._written is None:
            return None
        return device_info.node_lists(chips, self._first_seen)

    def _chips(self) -> list[tuple[str, device_info.ChipView]]:
        chips = []
        for (namespace, instance), record in self._devices.snapshot().items():
            if not _reported(record):
                continue
            view = device_info.chip_view(record.device,
                                         held=self._held.get((namespace, instance), False))
            if view is not None:
                chips.append(view)
        return chips

    async def _write_loop(self) -> None:
        last_write = 0.0
        while True:
            timeout = max(0.0, last_write + current().discovery.volcano_refresh_s - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout if self._written else None)
            self._wake.clear()
            lists = self.lists()
            if lists is None:
                continue
            done = await self._annotate_node()
            refresh = current().discovery.volcano_refresh_s
            if lists != self._written or self._clock() - last_write >= refresh:
                if await self.write(lists):
                    last_write = self._clock()
                else:
                    done = False
            if not done:
                await asyncio.sleep(current().discovery.volcano_retry_s)
                self._wake.set()

    async def _annotate_node(self) -> bool:
        """Set the Node's ``baseDeviceInfos`` when the chips (or their addresses) changed;
        whether it is as wanted."""
        value = device_info.node_annotation(self._chips())
        if value == self._annotated:
            return True
        patch = {"metadata": {"annotations": {device_info.NODE_ANNOTATION: value}}}
        try:
            await self._client.patch(Node, self._node, patch, patch_type=PatchType.MERGE)
        except Exception as error:  # a refusal, the API server away: the next pass tries again
            log.warning("could not annotate this Node with its chips for Volcano (retried): "
                        "%s", error,
                        extra={"annotation": device_info.NODE_ANNOTATION})
            return False
        self._annotated = value
        return True

    async def write(self, lists: dict[str, str]) -> bool:
        """Apply the ConfigMap for these lists; whether the API server took it."""
        data = device_info.configmap_data(lists, int(self._clock()))
        body = ConfigMap(metadata=ObjectMeta(name=self.name, namespace=device_info.NAMESPACE,
                                             labels=dict(device_info.LABELS)), data=data)
        try:
            await self._client.apply(body, field_manager=field_manager(self._node), force=True)
        except Exception as error:  # a refusal, the API server away: retried
            log.warning("could not write the device-info ConfigMap for Volcano (retried): %s",
                        error, extra={"configmap": f"{device_info.NAMESPACE}/{self.name}"})
            return False
        if self._written != lists:
            log.info("wrote the device-info ConfigMap for Volcano",
                     extra={"configmap": f"{device_info.NAMESPACE}/{self.name}"})
        self._written = lists
        return True


def _reported(record: NodeDevice) -> bool:
    """An ``ascend`` chip of a Configuration that keeps Huawei's metadata, on this node alone."""
    handler = record.handler
    if handler is None or getattr(handler, "name", "") != HANDLER or record.shared:
        return False
    return bool(getattr(record.details, "huawei_metadata", False))
