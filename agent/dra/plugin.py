"""The agent as a DRA kubelet plugin: registration in ``plugins_registry`` and the ``dra/v1``
``DRAPlugin`` service (with ``agent.dra.health``'s services) over Unix sockets.

``NodePrepareResources``, per claim: read the claim (``agent.kube.node_reads``), find its devices
(``agent.dra.claims``), run the handler's ``prepare`` and ``agent.dra.claim_devices``, write the
claim's CDI spec and record, answer the CDI ids (``agent.dra.claim_status`` then fills
``status.devices``); a recorded claim answers from its record. ``NodeUnprepareResources`` undoes
it. One claim's failure is that claim's ``error``; a refused prepare leaves nothing behind.
Before registering, recorded claims' specs are written again where missing (a reboot).
docs/dra.md, "The kubelet plugin".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from grpc import aio
from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import claim_devices, health
from agent.dra import claims as cl
from agent.dra.claim_status import ClaimStatus
from agent.kube.client import as_dict
from agent.kube.node_reads import NodeReads
from agent.kubeletapi import dra_health_v1_pb2_grpc as health_v1_grpc
from agent.kubeletapi import dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from agent.kubeletapi import pluginregistration_v1_pb2 as reg_pb
from agent.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from agent.metrics import AgentMetrics
from agent.settings import current
from crds import dra
from discovery_handlers.contract import PreparingHandler

log = logging.getLogger(__name__)

ResourceClaimResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin", *health.SERVICES)
SERVICE_SOCKET: Final = "dra.sock"
CHECKPOINT_FILE: Final = "claims.json"


def registration_socket(registry_dir: Path) -> Path:
    return registry_dir / f"{dra.DRIVER}-reg.sock"


class ClaimPreparer:
    """Prepares and unprepares claims on this node; the gRPC layer only translates."""

    def __init__(self, *, reads: NodeReads, node_name: str, devices: NodeDeviceTable,
                 cdi_dir: Path | None, state_dir: Path,
                 status_client: AsyncClient | None = None) -> None:
        self._reads = reads
        self.node_name = node_name
        self.devices = devices
        self._cdi_dir = cdi_dir
        self.checkpoint = cl.Checkpoint(state_dir / CHECKPOINT_FILE)
        self._lock = asyncio.Lock()
        #: Writes the claims' ``status.devices`` with ``status_client`` (the agent's token);
        #: None: none written.
        self.status = (ClaimStatus(status_client, node_name=node_name, devices=devices,
                                   find=self._served_as) if status_client is not None else None)

    def _served_as(self, table: Iterable[NodeDevice], pool: str, device: str
                   ) -> NodeDevice | None:
        return cl.find_device(table, self.node_name,
                              cl.AllocatedDevice(request="", pool=pool, device=device))

    def _report(self, uid: str, known: cl.PreparedClaim,
                claim: Mapping[str, Any] | None = None) -> None:
        if self.status is not None:
            self.status.prepared(uid, known.namespace, known.name,
                                 [(d.pool, d.device) for d in known.devices], claim,
                                 {(d.pool, d.device): d.share_id for d in known.devices
                                  if d.share_id})

    def restore(self) -> None:
        """Write every recorded claim's spec again where it is missing or differs (after a
        reboot, before the kubelet asks); a spec that cannot be made yet (an older agent's
        record, its device not served yet) is logged and made at the kubelet's next prepare."""
        for uid, known in list(self.checkpoint.claims.items()):
            claim_devices.kept(known.devices)
            self._report(uid, known)
            try:
                self._spec_in_place(uid, known)
            except (cl.PrepareError, OSError) as error:
                log.warning("prepared claim's CDI spec not restored yet; the kubelet's next "
                            "prepare tries again", extra={
                                "claim": f"{known.namespace}/{known.name}", "uid": uid,
                                "error": str(error)})

    def _spec_dir(self) -> Path:
        if self._cdi_dir is None:
            raise cl.PrepareError("this agent writes no CDI specs (CDI_SPEC_DIR is empty)")
        return self._cdi_dir

    def _spec_in_place(self, uid: str, known: cl.PreparedClaim) -> cl.PreparedClaim:
        """``known`` once its spec is in the CDI directory as recorded; a record without the
        spec (an older agent's) takes the one on disk, or one made from the served devices."""
        directory = self._spec_dir()
        on_disk = cl.read_claim_spec(directory, uid)
        spec = known.cdi_spec or on_disk or self._rebuilt_spec(uid, known)
        if on_disk != spec:
            cl.write_claim_spec(directory, uid, spec)
            log.info("claim spec written again", extra={
                "claim": f"{known.namespace}/{known.name}", "uid": uid})
        if known.cdi_spec is None:
            known = replace(known, cdi_spec=spec)
            self.checkpoint.put(uid, known)
        return known

    def _rebuilt_spec(self, uid: str, known: cl.PreparedClaim) -> dict[str, Any]:
        table = self.devices.snapshot().values()
        found: list[NodeDevice] = []
        for recorded in known.devices:
            device = cl.find_device(table, self.node_name, cl.AllocatedDevice(
                request=recorded.request, pool=recorded.pool, device=recorded.device))
            if device is None:
                raise cl.PrepareError(
                    f"the CDI spec of claim {known.namespace}/{known.name} is gone and its "
                    f"device {recorded.device} of pool {recorded.pool} is not served on node "
                    f"{self.node_name} yet")
            found.append(device)
        return cl.claim_spec(uid, found)

    async def prepare(self, namespace: str, name: str, uid: str) -> cl.PreparedClaim:
        async with self._lock:
            known = self.checkpoint.claims.get(uid)
            if known is not None:
                known = self._spec_in_place(uid, known)
                self._report(uid, known)
                return known
            directory = self._spec_dir()
            claim = await self._read_claim(namespace, name, uid)
            wanted = cl.results_for_driver(claim)
            table = self.devices.snapshot().values()
            found: list[NodeDevice] = []
            for result in wanted:
                device = cl.find_device(table, self.node_name, result)
                if device is None:
                    raise cl.PrepareError(f"device {result.device} of pool {result.pool} is "
                                          f"not served on node {self.node_name}")
                if not device.healthy:
                    raise cl.PrepareError(f"device {result.device} is unhealthy: "
                                          f"{device.health.reason}")
                found.append(device)
            await _run_prepare_hook(found)
            found, made = await claim_devices.make(found)
            try:
                spec = cl.claim_spec(uid, found)
                cl.write_claim_spec(directory, uid, spec)
                prepared = cl.PreparedClaim(namespace=namespace, name=name, devices=tuple(
                    cl.PreparedDevice(request=r.request, pool=r.pool, device=r.device,
                                      cdi_ids=(cl.cdi_id(uid, i),), share_id=r.share_id,
                                      handler=m.handler if m else "",
                                      made=m.record if m else {})
                    for i, (r, m) in enumerate(zip(wanted, made, strict=True))), cdi_spec=spec)
                self.checkpoint.put(uid, prepared)
            except BaseException:
                await claim_devices.undo_all(made)
                with contextlib.suppress(FileNotFoundError):
                    cl.claim_spec_path(directory, uid).unlink()
                raise
            self._report(uid, prepared, claim)
            log.info("claim prepared", extra={"claim": f"{namespace}/{name}", "uid": uid,
                                              "devices": [r.device for r in wanted],
                                              "made": [dict(m.record) for m in made if m]})
            return prepared

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        async with self._lock:
            known = self.checkpoint.claims.get(uid)
            if known is not None and any(d.made for d in known.devices):
                left, problems = await claim_devices.undo_devices(known.devices)
                if problems:  # the rest stays recorded, for the kubelet's next call
                    self.checkpoint.put(uid, replace(known, devices=left))
                    raise cl.PrepareError(f"unpreparing claim {namespace}/{name}: "
                                          + "; ".join(problems))
            if self._cdi_dir is not None:
                with contextlib.suppress(FileNotFoundError):
                    cl.claim_spec_path(self._cdi_dir, uid).unlink()
            if self.status is not None:
                self.status.forget(uid)
            if uid in self.checkpoint.claims:
                self.checkpoint.drop(uid)
                log.info("claim unprepared", extra={"claim": f"{namespace}/{name}", "uid": uid})

    async def _read_claim(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        try:
            client = await self._reads.client()
            claim = as_dict(await client.get(ResourceClaimResource, name, namespace=namespace))
        except ApiError as error:
            raise cl.PrepareError(f"cannot read claim {namespace}/{name} as "
                                  f"{self._reads.identity}: {error.status.message}") from error
        if claim["metadata"].get("uid") != uid:
            raise cl.PrepareError(f"claim {namespace}/{name} has another uid now (re-created)")
        return claim


async def _run_prepare_hook(devices: Sequence[NodeDevice]) -> None:
    """The handlers' ``prepare`` hooks, once per Configuration with its devices of the claim."""
    groups: dict[tuple[str, str], list[NodeDevice]] = {}
    for device in devices:
        groups.setdefault((device.namespace, device.configuration), []).append(device)
    for group in groups.values():
        first = group[0]
        if isinstance(first.handler, PreparingHandler):
            try:
                await first.handler.prepare(first.details, [d.device for d in group])
            except Exception as error:
                names = ", ".join(d.instance for d in group)
                raise cl.PrepareError(f"preparing {names} failed: {error}") from error


class _DraService(pb_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer, metrics: AgentMetrics | None) -> None:
        self._preparer = preparer
        self._metrics = metrics

    async def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any,
    ) -> pb.NodePrepareResourcesResponse:
        answers: dict[str, pb.NodePrepareResourceResponse] = {}
        for claim in request.claims:
            started = time.monotonic()
            try:
                prepared = await self._preparer.prepare(claim.namespace, claim.name, claim.uid)
            except (cl.PrepareError, OSError) as error:  # OSError: the spec or record write
                self._observe("failed", started)
                log.warning("claim not prepared", extra={
                    "claim": f"{claim.namespace}/{claim.name}", "error": str(error)})
                answers[claim.uid] = pb.NodePrepareResourceResponse(error=str(error))
                continue
            self._observe("ok", started)
            answers[claim.uid] = pb.NodePrepareResourceResponse(devices=[
                pb.Device(request_names=[d.request] if d.request else [], pool_name=d.pool,
                          device_name=d.device, cdi_device_ids=list(d.cdi_ids))
                for d in prepared.devices])
        return pb.NodePrepareResourcesResponse(claims=answers)

    def _observe(self, outcome: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.dra_prepare_duration.labels(outcome).observe(
                time.monotonic() - started)

    async def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any,
    ) -> pb.NodeUnprepareResourcesResponse:
        answers: dict[str, pb.NodeUnprepareResourceResponse] = {}
        for claim in request.claims:
            try:
                await self._preparer.unprepare(claim.namespace, claim.name, claim.uid)
                answers[claim.uid] = pb.NodeUnprepareResourceResponse()
            except (cl.PrepareError, OSError) as error:
                answers[claim.uid] = pb.NodeUnprepareResourceResponse(error=str(error))
        return pb.NodeUnprepareResourcesResponse(claims=answers)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self._endpoint = endpoint
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: Any,
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=dra.DRIVER, endpoint=str(self._endpoint),
                                 supported_versions=list(SUPPORTED_VERSIONS))

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: Any,
    ) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registered.set()
            log.info("DRA plugin registered with the kubelet")
        else:
            self.last_error = request.error
            log.warning("the kubelet refused the DRA plugin: %s", request.error)
        return reg_pb.RegistrationStatusResponse()


class DraKubeletPlugin:
    """Both sockets, served until cancelled; the sockets are removed on the way out."""

    def __init__(self, *, preparer: ClaimPreparer, plugins_dir: Path, registry_dir: Path,
                 metrics: AgentMetrics | None = None) -> None:
        self.preparer = preparer
        self._metrics = metrics
        self.service_socket = plugins_dir / dra.DRIVER / SERVICE_SOCKET
        self.registration_socket = registration_socket(registry_dir)
        self.registration = _Registration(self.service_socket)
        self.health = health.HealthStreams(node_name=preparer.node_name,
                                           devices=preparer.devices)

    async def run(self) -> None:
        self.preparer.restore()  # before the kubelet can ask: it registers us only below
        servers: list[tuple[aio.Server, Path]] = []
        status = self.preparer.status
        writer = asyncio.create_task(status.run()) if status is not None else None
        try:
            service = aio.server()
            pb_grpc.add_DRAPluginServicer_to_server(_DraService(self.preparer, self._metrics),
                                                    service)
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                health.HealthV1(self.health), service)
            health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                health.HealthV1Alpha1(self.health), service)
            servers.append((await _serve(service, self.service_socket), self.service_socket))
            registration = aio.server()
            reg_grpc.add_RegistrationServicer_to_server(self.registration, registration)
            servers.append((await _serve(registration, self.registration_socket),
                            self.registration_socket))
            log.info("DRA kubelet plugin serving", extra={
                "socket": str(self.service_socket),
                "registration": str(self.registration_socket)})
            await asyncio.Event().wait()  # until cancelled
        finally:
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            self.health.stop()  # the kubelet reads the stream's end, not an error
            for server, path in reversed(servers):
                await server.stop(current().dra.plugin_stop_grace_s)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _fresh_socket(socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()  # a stale socket of an earlier run


async def _serve(server: aio.Server, socket: Path) -> aio.Server:
    _fresh_socket(socket)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server
