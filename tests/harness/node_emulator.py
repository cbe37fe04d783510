"""A kubelet stand-in for tests and the demo: one emulated node against a real API server.

The real kubelet needs a container runtime, which this machine lacks, yet
edgeplug's device plugins must be exercised by the kubelet's real gRPC API and its pods placed by
the real scheduler. ``NodeEmulator`` is the one public face of the ``kubelet_*`` modules:

- ``kubelet_node``: the Node object, its Lease heartbeat and capacity/allocatable;
- ``kubelet_devices``: ``kubelet.sock``, plugin endpoints and their ListAndWatch streams;
- ``kubelet_pods``: pod admission (GetPreferredAllocation, Allocate, PreStartContainer),
  Running/Failed status, deletion;
- ``kubelet_cdi``: CDI names resolved as a CDI-enabled runtime does at container creation;
- ``kubelet_podresources``: the pod-resources ``List`` API;
- ``kubelet_dra``: DRA plugins registered from ``plugins_registry``, pods' claims prepared
  (``NodePrepareResources``), when given ``dra_registry_dir``.

Several emulators can run in one process (each with its own plugin directory and client).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

from lightkube import AsyncClient, KubeConfig

from tests.harness.devicenode import DeviceNode
from tests.harness.kubelet_devices import KUBELET_SOCKET, PLUGIN_RPC_TIMEOUT_S, DeviceManager
from tests.harness.kubelet_dra import ClaimUse, DraManager
from tests.harness.kubelet_node import HEARTBEAT_INTERVAL_S, NodeReporter
from tests.harness.kubelet_podresources import PodResourcesServer
from tests.harness.kubelet_pods import ADMISSION_ERROR, PodManager
from tests.harness.kubelet_records import ContainerAllocation, Registration
from tests.harness.node_stand_in import NodeStandIn

__all__ = [
    "ADMISSION_ERROR",
    "HEARTBEAT_INTERVAL_S",
    "KUBELET_SOCKET",
    "PLUGIN_RPC_TIMEOUT_S",
    "ContainerAllocation",
    "NodeEmulator",
    "Registration",
]

log = logging.getLogger(__name__)


#: ``EDGEPLUG_KUBELET=devicenode`` makes ``NodeEmulator(...)`` a ``DeviceNode``: the kubelet's
#: own device manager behind the same interface (tests/harness/devicenode.py), so any test can
#: be run against the real thing unchanged. ``PythonNodeEmulator`` is always this emulator.
KUBELET_ENV = "EDGEPLUG_KUBELET"


class NodeEmulator(NodeStandIn):
    """An emulated kubelet: a Node, kubelet.sock, device plugins' devices and pod admission."""

    def __new__(cls, **kwargs: Any) -> NodeEmulator:
        if cls is NodeEmulator and os.environ.get(KUBELET_ENV) == "devicenode":
            # Same constructor and methods; __init__ is not called on the DeviceNode again.
            return cast(NodeEmulator, DeviceNode(**kwargs))
        return super().__new__(cls)

    def __init__(self, *, dra_registry_dir: Path | None = None, **kwargs: Any) -> None:
        """``dra_registry_dir``: the kubelet's ``plugins_registry``, where DRA plugins register
        (None: no DRA; pods' claims are left alone). The rest: ``NodeStandIn``'s."""
        self.dra_registry_dir = dra_registry_dir
        super().__init__(**kwargs)

    def _build(self) -> None:
        self._client = AsyncClient(KubeConfig.from_file(str(self.kubeconfig)))
        self._dra = (DraManager(client=self._client, node_name=self.node_name,
                                registry_dir=self.dra_registry_dir)
                     if self.dra_registry_dir is not None else None)
        self._node = NodeReporter(client=self._client, node_name=self.node_name,
                                  labels=self.labels, device_counts=self._device_counts,
                                  device_capacity=self._device_capacity)
        self._devices = DeviceManager(plugin_dir=self.plugin_dir, on_change=self._node.poke)
        self._pods = PodManager(client=self._client, node_name=self.node_name,
                                devices=self._devices, cdi_spec_dirs=self.cdi_spec_dirs,
                                dra=self._dra)
        self._pod_resources = (
            PodResourcesServer(socket_path=self.pod_resources_socket, pods=self._pods,
                               devices=self._devices)
            if self.pod_resources_socket is not None else None
        )

    @property
    def registrations(self) -> list[Registration]:
        """Every registration kubelet.sock accepted, oldest first."""
        return self._devices.registrations

    def first_offered(self, resource_name: str) -> list[str] | None:
        """The healthy device ids of the first ListAndWatch response the current plugin of
        ``resource_name`` sent (None before one): what the kubelet was first offered."""
        endpoint = self._devices.endpoint(resource_name)
        return endpoint.first_healthy if endpoint is not None else None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create or adopt the Node, serve kubelet.sock (and pod-resources), admit pods."""
        await self._devices.start()
        try:
            await self._node.start()
            if self._dra is not None:
                await self._dra.start()
            if self._pod_resources is not None:
                await self._pod_resources.start()
            await self._pods.start()
        except BaseException:
            await self.stop()
            raise
        log.info("emulated kubelet for node %s serving %s", self.node_name, self.kubelet_socket)

    async def stop(self, *, delete_node: bool = False) -> None:
        """Stop admission, servers and heartbeats; optionally delete the Node and its Lease.

        Every part is stopped even when an earlier one fails to stop cleanly."""
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("pod admission", self._pods.stop),
            *([("DRA plugin watcher", self._dra.stop)] if self._dra is not None else []),
            ("kubelet.sock", self._devices.stop),
            ("node heartbeat", partial(self._node.stop, delete_node=delete_node)),
            ("API client", self._client.close),
        ]
        if self._pod_resources is not None:
            steps.insert(1, ("pod-resources", self._pod_resources.stop))
        for what, step in steps:
            try:
                await step()
            except Exception:
                log.exception("node %s: stopping %s failed", self.node_name, what)
        self._devices.socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> NodeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def restart_kubelet(self) -> None:
        """As a real kubelet restarts: drop plugin connections, delete every socket in the
        plugin directory (the plugins' too) and serve a fresh kubelet.sock. Pod allocations
        survive (the real kubelet keeps them in a checkpoint file); the pod-resources socket
        is served anew too, since the restart may have deleted it."""
        if self._pod_resources is not None:
            await self._pod_resources.stop()
        await self._devices.restart()
        if self._pod_resources is not None:
            await self._pod_resources.start()

    async def set_node_ready(self, ready: bool) -> None:
        """Report the Node Ready=False (heartbeats go on, as with a kubelet whose container
        runtime is down) or Ready=True again. The real node-lifecycle controller reacts with
        its not-ready taints (and evictions), as it would for a real node."""
        await self._node.set_ready(ready)

    # -- what tests read -------------------------------------------------------------------

    def allocations(self, namespace: str, pod: str) -> list[ContainerAllocation]:
        """What Allocate returned for each container of the newest pod of that name."""
        record = self._pods.record(namespace, pod)
        return list(record.allocations) if record is not None else []

    def claims(self, namespace: str, pod: str) -> list[ClaimUse]:
        """The claims the DRA manager prepared for each container of the newest pod of
        that name."""
        record = self._pods.record(namespace, pod)
        return list(record.claims) if record is not None else []

    def claim_env(self, namespace: str, pod: str, container: str) -> dict[str, str]:
        """The environment the runtime gave ``container`` from its CDI ids (claims')."""
        record = self._pods.record(namespace, pod)
        edits = record.claim_edits.get(container) if record is not None else None
        return dict(edits.env) if edits is not None else {}

    def allocated_device_ids(self, resource_name: str) -> set[str]:
        """Device ids of the resource that live pods on this node hold."""
        return self._pods.held_ids(resource_name)

    def healthy_device_ids(self, resource_name: str) -> list[str]:
        """Device ids the resource's plugin last reported Healthy (empty when not connected)."""
        return self._devices.healthy_ids(resource_name)

    def plugin_connected(self, resource_name: str) -> bool:
        """Whether a plugin for the resource is connected (its ListAndWatch stream is open)."""
        return self._devices.endpoint(resource_name) is not None

    def pod_admitted(self, namespace: str, pod: str) -> bool:
        """Whether the newest pod of that name was admitted and still holds its devices."""
        record = self._pods.record(namespace, pod)
        return record is not None and record.live

    # -- wiring ----------------------------------------------------------------------------

    def _device_counts(self) -> dict[str, int]:
        return self._devices.healthy_counts()

    def _device_capacity(self) -> dict[str, int]:
        return self._devices.capacity_counts()


class PythonNodeEmulator(NodeEmulator):
    """This Python emulator whatever ``EDGEPLUG_KUBELET`` says (for the tests of the emulator)."""
