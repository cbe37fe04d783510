"""The emulated kubelet's DRA side: its plugin watcher and its DRA manager, over the real APIs.

The plugin watcher finds sockets in the node's ``plugins_registry`` directory, asks each one
``GetInfo`` (``pluginregistration/v1``) and, for a ``DRAPlugin``, answers
``NotifyRegistrationStatus``. The DRA manager prepares a pod's claims before its containers
start: for each claim the pod names (``status.resourceClaimStatuses``, or the claim the scheduler
made for an extended resource, ``status.extendedResourceClaimStatus``) it reads the claim's
allocation and calls ``NodePrepareResources`` (``dra/v1``) on the registered driver's socket;
each container gets the CDI ids of the claims (and requests) it names. Once no live pod uses a
claim, ``NodeUnprepareResources``. The real kubelet does the same (``pkg/kubelet/cm/dra``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from agent.kube.client import as_dict
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from agent.kubeletapi import pluginregistration_v1_pb2 as reg_pb
from agent.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from tests.harness.aio_process import cancel_and_wait
from tests.harness.kubelet_devices import plugin_channel

log = logging.getLogger(__name__)

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")
DRA_PLUGIN_TYPE = "DRAPlugin"
#: How often the plugin watcher looks at the registry directory (the kubelet uses inotify).
REGISTRY_POLL_S = 0.2
#: How long a pod whose claim's driver has not registered yet waits for it.
DRIVER_WAIT_S = 10.0
#: Deadline of each call to a plugin.
RPC_TIMEOUT_S = 10.0


class PrepareError(Exception):
    """A claim of the pod could not be prepared; the pod's containers do not start."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device ``NodePrepareResources`` returned for a claim."""

    pool: str
    device: str
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    """A claim of a pod, as its driver prepared it on this node."""

    pod_claim: str  # the name the pod's containers use for it ("" for an extended resource's)
    namespace: str
    name: str
    uid: str
    driver: str
    devices: tuple[PreparedDevice, ...]


@dataclass(frozen=True)
class ClaimUse:
    """Which claim (and which of its requests; empty: all) one container of the pod uses."""

    container: str
    claim: PreparedClaim
    requests: tuple[str, ...]

    @property
    def cdi_ids(self) -> tuple[str, ...]:
        return tuple(i for d in self.claim.devices
                     if not self.requests or set(self.requests) & set(d.requests)
                     for i in d.cdi_ids)


class DraManager:
    """Registers the node's DRA plugins and prepares (and unprepares) the claims of its pods."""

    def __init__(self, *, client: AsyncClient, node_name: str, registry_dir: Path) -> None:
        self._client = client
        self.node_name = node_name
        self.registry_dir = registry_dir
        self.drivers: dict[str, Path] = {}  # driver name -> its DRA service socket
        self._seen: set[Path] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.create_task(self._watch_registry(),
                                         name=f"plugin watcher of {self.node_name}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    # -- the plugin watcher ----------------------------------------------------------------

    async def _watch_registry(self) -> None:
        while True:
            present = set(await asyncio.to_thread(lambda: list(self.registry_dir.glob("*.sock"))))
            self._seen &= present
            for socket in sorted(present - self._seen):
                self._seen.add(socket)
                await self._register(socket)
            await asyncio.sleep(REGISTRY_POLL_S)

    async def _register(self, socket: Path) -> None:
        try:
            async with plugin_channel(socket) as channel:
                stub = reg_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=RPC_TIMEOUT_S)
                accepted = info.type == DRA_PLUGIN_TYPE
                await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(
                    plugin_registered=accepted,
                    error="" if accepted else f"plugin type {info.type} is not served here"),
                    timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            self._seen.discard(socket)  # asked again on the next look
            log.info("node %s: registering %s failed: %s", self.node_name, socket, error)
            return
        if accepted:
            self.drivers[info.name] = Path(info.endpoint)
            log.info("node %s: DRA driver %s registered at %s", self.node_name, info.name,
                     info.endpoint)

    async def _driver_socket(self, driver: str) -> Path:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRIVER_WAIT_S
        while driver not in self.drivers:
            if loop.time() >= deadline:
                raise PrepareError(f"DRA driver {driver} is not registered")
            await asyncio.sleep(REGISTRY_POLL_S)
        return self.drivers[driver]

    # -- the DRA manager -------------------------------------------------------------------

    async def prepare(self, pod: Pod) -> list[ClaimUse]:
        """Prepare every claim of ``pod``; what each container uses. PrepareError when one
        cannot be."""
        body = as_dict(pod)
        namespace = body["metadata"].get("namespace") or "default"
        status = body.get("status") or {}
        containers = [*(body["spec"].get("initContainers") or []), *body["spec"]["containers"]]
        uses: list[ClaimUse] = []
        named = {s["name"]: s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or []}
        for pod_claim in body["spec"].get("resourceClaims") or []:
            name = pod_claim.get("resourceClaimName") or named.get(pod_claim["name"])
            if not name:
                raise PrepareError(f"claim {pod_claim['name']} of the pod has no ResourceClaim")
            claim = await self._prepare(namespace, name, pod_claim["name"])
            for container in containers:
                for ref in (container.get("resources") or {}).get("claims") or []:
                    if ref["name"] == pod_claim["name"]:
                        request = (ref["request"],) if ref.get("request") else ()
                        uses.append(ClaimUse(container["name"], claim, request))
        extended = status.get("extendedResourceClaimStatus")
        if extended:
            claim = await self._prepare(namespace, extended["resourceClaimName"], "")
            uses += [ClaimUse(m["containerName"], claim, (m["requestName"],))
                     for m in extended.get("requestMappings") or []]
        return uses

    async def _prepare(self, namespace: str, name: str, pod_claim: str) -> PreparedClaim:
        try:
            claim = as_dict(await self._client.get(ResourceClaim, name, namespace=namespace))
        except ApiError as error:
            raise PrepareError(f"reading claim {namespace}/{name}: {error}") from error
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is None:
            raise PrepareError(f"claim {namespace}/{name} is not allocated")
        uid = claim["metadata"]["uid"]
        (driver,) = {r["driver"] for r in allocation["devices"]["results"]}
        socket = await self._driver_socket(driver)
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=namespace, name=name, uid=uid)])
        try:
            async with plugin_channel(socket) as channel:
                answer = await pb_grpc.DRAPluginStub(channel).NodePrepareResources(
                    request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise PrepareError(f"NodePrepareResources of {namespace}/{name}: "
                               f"{error.code().name}: {error.details()}") from error
        result = answer.claims[uid]
        if result.error:
            raise PrepareError(f"NodePrepareResources of {namespace}/{name}: {result.error}")
        devices = tuple(PreparedDevice(pool=d.pool_name, device=d.device_name,
                                       requests=tuple(d.request_names),
                                       cdi_ids=tuple(d.cdi_device_ids))
                        for d in result.devices)
        return PreparedClaim(pod_claim=pod_claim, namespace=namespace, name=name, uid=uid,
                             driver=driver, devices=devices)

    async def unprepare(self, claims: Iterable[PreparedClaim]) -> None:
        """``NodeUnprepareResources`` for claims no live pod uses any more (errors logged)."""
        for claim in claims:
            socket = self.drivers.get(claim.driver)
            if socket is None:
                continue
            request = pb.NodeUnprepareResourcesRequest(
                claims=[pb.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)])
            try:
                async with plugin_channel(socket) as channel:
                    await pb_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                        request, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                log.warning("node %s: NodeUnprepareResources of %s/%s: %s", self.node_name,
                            claim.namespace, claim.name, error)
