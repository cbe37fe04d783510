"""Annotations on the pods that hold this node's devices, for handlers that give them.

From the kubelet's pod-resources ``List`` (the slot sweep's), each pod's device ids are mapped
back to devices (``devices_of``), their handler (``AnnotatingHandler``) is asked, and its answer
merged into the pod's annotations, only the keys ``ANNOTATION_KEYS`` names (the agent's pod
policy allows no other). The pod is read through an empty merge patch, so the agent needs no
``get`` on pods. Each pod once per set of devices; what cannot be mapped yet is tried again at
the next ``List``. Why Volcano and MindCluster need them: docs/handlers/ascend.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from agent.deviceplugins.kubelet.podresources import LatestPods, PodDevices
from agent.deviceplugins.slots.rules import held_virtual_ids
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from crds.instance import Instance
from crds.naming import instance_resource_name
from discovery_handlers.contract import AnnotatingHandler, PodFacts

log = logging.getLogger(__name__)

#: The pod annotations the agent may write: Huawei's Ascend plugin's
#: (``discovery_handlers.ascend.huawei.ANNOTATION_KEYS``; agent-pod-policy.yaml allows exactly
#: these).
ANNOTATION_KEYS = frozenset({
    "huawei.com/AscendReal", "ascend.kubectl.kubernetes.io/ascend-910-configuration",
    "huawei.com/Ascend910", "huawei.com/Ascend310P", "huawei.com/Ascend310",
})

_Key = tuple[str, str]
#: A pod and the device ids it holds: annotated once per such key.
_PodKey = tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]]


def devices_of(
    resource: str, ids: Sequence[str], *, node: str, instances: Mapping[_Key, Instance],
    configuration_resources: Mapping[_Key, str], table: NodeDeviceTable,
) -> list[NodeDevice] | None:
    """The devices behind ``ids`` of ``resource``: [] when the resource is none of ours, None
    when it is ours but an id cannot be mapped (yet)."""
    for (namespace, name) in instances:
        if instance_resource_name(name) == resource:
            device = table.get(namespace, name)
            return None if device is None else [device]
    for (namespace, configuration), served in configuration_resources.items():
        if served != resource:
            continue
        held = held_virtual_ids(
            (i for (ns, _), i in instances.items()
             if ns == namespace and i.spec.configuration_name == configuration), node)
        found: dict[_Key, NodeDevice] = {}
        for virtual in ids:
            ref = held.get(virtual)
            device = None if ref is None else table.get(ref.namespace, ref.instance)
            if device is None:
                return None
            found.setdefault((device.namespace, device.instance), device)
        return list(found.values())
    return []


class PodAnnotator:
    """Keeps Huawei-style annotations on this node's pods in line with the devices they hold."""

    def __init__(
        self, *, client: AsyncClient, resolve: Callable[[str, Sequence[str]],
                                                         list[NodeDevice] | None],
    ) -> None:
        """``resolve(resource, ids)``: ``devices_of`` over the service's current view."""
        self._client = client
        self._resolve = resolve
        self._pods = LatestPods()
        self._done: set[_PodKey] = set()
        #: Pods whose failure was logged as a warning: retried every List, logged once.
        self._warned: set[_PodKey] = set()

    def offer(self, pods: Sequence[PodDevices]) -> None:
        """A pod-resources ``List`` answered: look at its pods (the latest answer wins)."""
        self._pods.offer(pods)

    async def run(self) -> None:
        while True:
            pods = await self._pods.next()
            listed = {(p.namespace, p.name, p.devices) for p in pods}
            self._done &= listed
            self._warned &= listed
            for pod in pods:
                key = (pod.namespace, pod.name, pod.devices)
                if key in self._done:
                    continue
                if await self._annotate(pod, warn=key not in self._warned):
                    self._done.add(key)
                else:
                    self._warned.add(key)

    async def _annotate(self, pod: PodDevices, *, warn: bool) -> bool:
        """Annotate ``pod`` if its devices' handlers ask; whether it is settled."""
        groups: dict[_Key, list[NodeDevice]] = {}
        for resource, ids in pod.devices:
            devices = self._resolve(resource, ids)
            if devices is None:
                return False  # ours, not mapped yet: the next List tries again
            for device in devices:
                if isinstance(device.handler, AnnotatingHandler):
                    group = groups.setdefault((device.namespace, device.configuration), [])
                    if device not in group:
                        group.append(device)
        if not groups:
            return True
        extra = {"pod": f"{pod.namespace}/{pod.name}"}
        try:
            # An empty merge patch reads the pod: the pod policy confines it to this node.
            current = await self._client.patch(Pod, pod.name, {}, namespace=pod.namespace,
                                               patch_type=PatchType.MERGE)
            meta, status = current.metadata, current.status
            host_ip = (status.hostIP if status else None) or ""
            if meta is None or not meta.uid or not host_ip:
                return False  # the kubelet has not reported the pod's node address yet
            facts = PodFacts(name=pod.name, uid=meta.uid, host_ip=host_ip)
            wanted: dict[str, str] = {}
            for devices in groups.values():
                first = devices[0]
                assert isinstance(first.handler, AnnotatingHandler)
                given = first.handler.pod_annotations(first.details,
                                                      [d.device for d in devices], facts)
                wanted.update({k: v for k, v in given.items() if k in ANNOTATION_KEYS})
            have = meta.annotations or {}
            changes = {k: v for k, v in wanted.items() if have.get(k) != v}
            if changes:
                await self._client.patch(Pod, pod.name, {"metadata": {"annotations": changes}},
                                         namespace=pod.namespace, patch_type=PatchType.MERGE)
                log.info("annotated a pod holding this node's devices",
                         extra={**extra, "annotations": sorted(changes)})
        except ApiError as error:
            if error.status.code == 404:
                return True  # gone
            log.log(logging.WARNING if warn else logging.DEBUG,
                    "could not annotate pod (retried at each pod-resources List): %s", error,
                    extra=extra)
            return False
        except Exception:  # a handler's bug must not stop the annotator
            if warn:
                log.exception("annotating pod failed", extra=extra)
            return False
        return True
