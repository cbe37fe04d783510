"""The controller's one seam for writes to the Kubernetes API (lightkube), errors translated here.

``Kube`` creates, deletes and patches; "already exists" and "already gone" are success, and a
refusal becomes ``Refused`` with the server's message (docs/architecture.md, "The controller's
modules").
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.resource import NamespacedResource
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod, Service
from lightkube.types import PatchType

from controller.kube.rest import ApiFailure, Rest, status_message
from controller.metrics import PROCESS
from crds.api import API_VERSION, CONFIGURATION_KIND, CONFIGURATION_PLURAL, GROUP, INSTANCE_PLURAL
from crds.api import VERSION as CRD_VERSION
from crds.resources import ConfigurationResource as ConfigurationResource
from crds.resources import InstanceResource as InstanceResource

FIELD_MANAGER: Final = "edgeplug-controller"
HTTP_BAD_REQUEST: Final = 400
HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
HTTP_INVALID: Final = 422

KopfPeeringResource = create_namespaced_resource("kopf.dev", "v1", "KopfPeering", "kopfpeerings")
ClusterKopfPeeringResource = create_global_resource(
    "kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings"
)

_RESOURCES: Final[Mapping[str, type[NamespacedResource]]] = {
    "Pod": Pod,
    "Service": Service,
    "Job": Job,
}
#: Where each kind the controller creates or deletes lives: (group path, plural).
_COLLECTIONS: Final[Mapping[str, tuple[str, str]]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "Event": ("/api/v1", "events"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Instance": (f"/apis/{GROUP}/{CRD_VERSION}", INSTANCE_PLURAL),
    "Configuration": (f"/apis/{GROUP}/{CRD_VERSION}", CONFIGURATION_PLURAL),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates"),
}
_CREATE_PARAMS: Final = {"fieldManager": FIELD_MANAGER}
_DELETE_BACKGROUND: Final = {"propagationPolicy": "Background"}
HTTP_OK_RANGE: Final = range(200, 300)


def collection_path(kind: str, namespace: str) -> str:
    group, plural = _COLLECTIONS[kind]
    return f"{group}/namespaces/{namespace}/{plural}"


class Refused(Exception):
    """The API server refused an object as invalid; ``message`` is its explanation."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Conflict(Exception):
    """A write lost an optimistic-concurrency race (``resourceVersion`` moved on)."""


def make_client(kubeconfig: Path | None) -> AsyncClient:
    """A client from ``kubeconfig``, from ``$KUBECONFIG``/in-cluster when it is None."""
    config = KubeConfig.from_file(str(kubeconfig)) if kubeconfig else KubeConfig.from_env()
    client = AsyncClient(config, field_manager=FIELD_MANAGER)
    PROCESS.hook(client)  # its 429 and 5xx answers count in edgeplug_api_errors_total
    return client


def _code(error: ApiError) -> int:
    return int(error.status.code or 0)


def _refusal(error: ApiError) -> Refused | None:
    if _code(error) in (HTTP_INVALID, HTTP_BAD_REQUEST):
        return Refused(str(error.status.message or error))
    return None


class Kube:
    """Idempotent writes. ``create``/``delete`` return whether this call changed anything.

    Creations and deletions, the writes made per Instance, go through :class:`Rest`; the rarer
    patches, reads and server-side applies through lightkube's client."""

    def __init__(self, client: AsyncClient, rest: Rest) -> None:
        self.client = client
        self.rest = rest
        # Bounded: unbounded writes at 10,000 Instances would overflow the keep-alive pool,
        # and every extra connection costs a TLS handshake.
        self._writes = asyncio.Semaphore(rest.settings.writes_in_flight)

    async def create(self, obj: Mapping[str, Any]) -> bool:
        meta = obj["metadata"]
        path = collection_path(str(obj["kind"]), str(meta["namespace"]))
        async with self._writes:
            code, body = await self.rest.request("POST", path, body=obj, params=_CREATE_PARAMS)
        if code in HTTP_OK_RANGE:
            return True
        if code == HTTP_CONFLICT:
            return False
        message = status_message(code, body)
        if code in (HTTP_INVALID, HTTP_BAD_REQUEST):
            raise Refused(message)
        raise ApiFailure(code, message)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        path = f"{collection_path(kind, namespace)}/{name}"
        async with self._writes:
            code, body = await self.rest.request("DELETE", path, body=_DELETE_BACKGROUND)
        if code in HTTP_OK_RANGE:
            return True
        if code == HTTP_NOT_FOUND:
            return False
        raise ApiFailure(code, status_message(code, body))

    async def annotate_node(self, node: str, key: str, value: str | None) -> None:
        """Sets (or, with None, removes) one annotation of a Node; a Node gone is no error."""
        body = {"metadata": {"annotations": {key: value}}}
        try:
            async with self._writes:
                await self.client.patch(Node, node, body, patch_type=PatchType.MERGE,
                                        field_manager=FIELD_MANAGER)
        except ApiError as error:
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def merge_patch(self, obj: Mapping[str, Any]) -> None:
        """Replaces the labels, annotations and spec of an existing object (services)."""
        meta = obj["metadata"]
        patch = {
            "metadata": {"labels": meta.get("labels"), "annotations": meta.get("annotations")},
            "spec": obj["spec"],
        }
        try:
            await self.client.patch(
                _RESOURCES[str(obj["kind"])], meta["name"], patch, namespace=meta["namespace"],
                patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER,
            )
        except ApiError as error:
            refused = _refusal(error)
            if refused is not None:
                raise refused from error
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def get_instance(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self.client.get(InstanceResource, name, namespace=namespace)
        except ApiError as error:
            if _code(error) == HTTP_NOT_FOUND:
                return None
            raise
        as_dict: dict[str, Any] = obj.to_dict()  # type: ignore[no-untyped-call]
        return as_dict

    async def patch_instance(
        self, namespace: str, name: str, *, resource_version: str, spec: Mapping[str, Any]
    ) -> None:
        """A merge patch of ``spec`` that applies only if the Instance is still at
        ``resource_version``; :class:`Conflict` when an agent wrote it in between."""
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": dict(spec)}
        try:
            await self.client.patch(
                InstanceResource, name, patch, namespace=namespace,
                patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER,
            )
        except ApiError as error:
            if _code(error) == HTTP_CONFLICT:
                raise Conflict(f"Instance {namespace}/{name} changed meanwhile") from error
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def patch_instance_status(self, namespace: str, name: str,
                                    status: Mapping[str, Any]) -> None:
        """A merge patch of some of an Instance's status fields (the controller's display
        fields; the agents' fields are left as they are); an Instance gone is no error."""
        try:
            await self.client.patch(
                InstanceResource.Status, name, {"status": dict(status)}, namespace=namespace,
                patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER,
            )
        except ApiError as error:
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def delete_instance(self, namespace: str, name: str) -> bool:
        return await self.delete("Instance", namespace, name)

    async def apply_configuration_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Server-side apply of the controller's status fields, as ``edgeplug-controller``;
        the agent's condition (another field manager) is left as it is."""
        body = {
            "apiVersion": API_VERSION,
            "kind": CONFIGURATION_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": dict(status),
        }
        try:
            await self.client.patch(
                ConfigurationResource.Status, name, body, namespace=namespace,
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True,
            )
        except ApiError as error:
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def set_configuration_finalizers(
        self, namespace: str, name: str, finalizers: list[str]
    ) -> None:
        """Replaces the Configuration's finalizers (to release one an older version left)."""
        patch = {"metadata": {"finalizers": finalizers or None}}
        try:
            await self.client.patch(
                ConfigurationResource, name, patch, namespace=namespace,
                patch_type=PatchType.MERGE, field_manager=FIELD_MANAGER,
            )
        except ApiError as error:
            if _code(error) != HTTP_NOT_FOUND:
                raise

    async def post_event(self, event: Mapping[str, Any]) -> None:
        """Creates a core/v1 Event (best effort: the caller logs a failure and moves on)."""
        await self.create(event)

    async def ensure_peering(self, namespace: str | None, name: str) -> None:
        """Creates the peering object the replicas elect their active one through: a
        KopfPeering in ``namespace``, or a ClusterKopfPeering when it is None."""
        body: dict[str, Any] = {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering" if namespace else "ClusterKopfPeering",
            "metadata": {"name": name},
        }
        if namespace:
            body["metadata"]["namespace"] = namespace
        try:
            await self.client.create(from_dict(body))
        except ApiError as error:
            if _code(error) != HTTP_CONFLICT:
                raise
