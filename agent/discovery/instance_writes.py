"""The API writes of one Configuration's Instances on this node: the applied body (which also
creates a shared Instance its Configuration's device plugins do not serve), the create that wins
a name, the merge patch that adds missing slots, the conditional leave of a shared Instance and
the delete; and who holds a name this node may not write. How these writes keep every slot safe
while several agents write one Instance: docs/architecture.md, "How an Instance is written"."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.discovery.device_health import HealthReporter
from agent.discovery.instance_ownership import Holder, Ownership, Wanted, log_extra, properties
from agent.kube import node_instances
from agent.kube.client import InstanceResource, as_dict, field_manager, is_conflict, is_not_found
from crds.api import API_VERSION, INSTANCE_KIND
from crds.naming import cdi_name, name_digest, slot_id

log = logging.getLogger(__name__)

LEAVE_ATTEMPTS = 5  # conditional leave retries when the Instance changes under us
HTTP_UNPROCESSABLE = 422  # the CRD's rules refused a write (another device's deviceDigest)


class LeaveFailed(Exception):
    """A conditioned leave lost every race; the caller tries again later."""


class VerdictNotWritten(Exception):
    """An unhealthy shared device's mark could not be written before its node is listed; the
    pass fails and is retried."""


class InstanceWrites:
    """Writes one Configuration's Instances as this node, remembering the last body applied
    to each so an unchanged one is not applied again."""

    def __init__(self, *, client: AsyncClient, ownership: Ownership, health: HealthReporter,
                 with_slots: Callable[[], bool]) -> None:
        self._client = client
        self._own = ownership
        self._cfg = ownership.cfg
        self._node = ownership.node
        self._health = health
        #: Whether the Configuration's devices are served by device plugins now, whose slots
        #: ``deviceUsage`` lists (a slot missing there is free to every reader).
        self._with_slots = with_slots
        self._manager = field_manager(ownership.node)
        #: The last body applied per Instance, and whether its slots were written with it.
        self._applied: dict[str, tuple[dict[str, Any], bool]] = {}
        #: Shared Instances applied without this node, their unhealthy mark still to write.
        self._unlisted: set[str] = set()

    def forget(self, name: str) -> None:
        """Apply ``name`` again at its next ``ensure``."""
        self._applied.pop(name, None)
        self._unlisted.discard(name)

    def forget_all(self) -> None:
        self._applied.clear()

    def body(self, name: str, wanted: Wanted, *, shared: bool,
             listed: bool = True) -> dict[str, Any]:
        """The applied Instance; ``listed``: with this node in ``nodes``."""
        cfg = self._cfg
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": INSTANCE_KIND,
            "metadata": {
                "name": name,
                "namespace": cfg.namespace,
                "labels": {node_instances.serves_label(self._node): node_instances.LABEL_VALUE},
                "ownerReferences": [cfg.owner_reference()],
            },
            "spec": {
                "configurationName": cfg.name,
                "cdiName": cdi_name(cfg.name, name_digest(name)),
                "capacity": cfg.spec.capacity,
                "brokerProperties": properties(cfg, wanted.device),
                "shared": shared,
                "nodes": [self._node],
                "deviceDigest": wanted.digest,
            },
        }
        if not listed:
            del body["spec"]["nodes"]
        return body

    async def read(self, name: str) -> dict[str, Any] | None:
        """The API server's Instance ``name``; None where there is none."""
        try:
            return as_dict(
                await self._client.get(InstanceResource, name, namespace=self._cfg.namespace))
        except ApiError as exc:
            if is_not_found(exc):
                return None
            raise

    async def ensure(self, name: str, wanted: Wanted, *, shared: bool) -> Holder | None:
        """Create or apply ``name`` for ``wanted``; who holds it instead when it is not this
        device's to write, else None.

        A shared Instance is made by the apply itself where no device plugin serves its
        Configuration (one write: no slot map to create), and this node is listed in it only
        once its verdict is on it: a healthy device's is the listing itself, an unhealthy one's
        mark is written first (the controller offers a shared device on every listed node not
        marked unhealthy)."""
        body = self.body(name, wanted, shared=shared)
        slots = self._with_slots()
        if self._applied.get(name) == (body, slots):
            return None
        fresh = name not in self._own.owned
        if fresh and (slots or not shared):
            holder = await self._create(name, body, wanted.digest, shared=shared, slots=slots)
            if holder is not None:
                return holder
        elif fresh:
            self._own.owned[name] = shared  # owned from before the request: see _create
        if shared and (fresh or name in self._unlisted) and not wanted.device.health.healthy:
            unlisted = self.body(name, wanted, shared=shared, listed=False)
            holder = await self._apply(name, unlisted, wanted.digest, shared=shared,
                                       fresh=fresh, slots=slots)
            if holder is not None:
                return holder
            self._unlisted.add(name)
            if not await self._health.report(name, wanted.device.health, shared=True):
                raise VerdictNotWritten(f"Instance {name}: the unhealthy mark was not written")
            fresh = False
        holder = await self._apply(name, body, wanted.digest, shared=shared, fresh=fresh,
                                   slots=slots)
        if holder is not None:
            return holder
        self._unlisted.discard(name)
        self._applied[name] = (body, slots)
        return None

    async def _apply(self, name: str, body: dict[str, Any], digest: str, *, shared: bool,
                     fresh: bool, slots: bool) -> Holder | None:
        """Apply ``body`` (making ``name`` where it is not yet), tell the health reporter what
        the stored Instance says of this node and add the slots it lacks where device plugins
        serve it; who holds ``name`` where the API server refused it as another's, else None.
        ``fresh``: not this node's before this write; ``slots``: device plugins serve it (as
        ``ensure`` read once, so the body it records matches what was written)."""
        try:
            applied = await self._client.patch(
                InstanceResource, name, body, namespace=self._cfg.namespace,
                patch_type=PatchType.APPLY, field_manager=self._manager, force=True,
            )
        except ApiError as exc:
            if exc.status.code != HTTP_UNPROCESSABLE:
                if fresh:
                    self._own.owned.pop(name, None)
                raise
            holder = await self.holder(name, digest, shared=shared)
            if holder is None or not (holder.digest or fresh):
                raise  # refused for another reason
            if fresh:
                self._own.owned.pop(name, None)
            return holder
        stored = as_dict(applied)
        self._health.seed(name, stored)
        if slots:
            await self._fill_slots(stored)
        return None

    async def _create(self, name: str, body: dict[str, Any], digest: str, *,
                      shared: bool, slots: bool) -> Holder | None:
        """Create ``name``, owned from before the request is sent: a run stopped while the
        create (or the apply after it) is in flight must still withdraw what the API server may
        have made, or a Node relabelled right after a device appeared keeps its Instance.
        Who holds ``name`` when it is not this node's to write (``holder``), else None."""
        # A shared Instance is created without nodes (each agent then owns its own element
        # through its apply); a local one names this node from the start, since the agents'
        # Instance policy lets a node create a local Instance only for itself.
        spec = {k: v for k, v in body["spec"].items() if k != "nodes" or not shared}
        if slots:
            spec["deviceUsage"] = {slot_id(name, i): "" for i in range(self._cfg.spec.capacity)}
        # Likewise the label of a shared one: created by this manager, the label would stay
        # after the apply that leaves drops it.
        metadata = {k: v for k, v in body["metadata"].items() if k != "labels" or not shared}
        created = {**body, "metadata": metadata, "spec": spec}
        self._own.owned[name] = shared
        try:
            await self._client.create(
                InstanceResource.from_dict(created), field_manager=self._manager
            )
            log.info("created Instance %s", name, extra=log_extra(self._cfg, self._node, name))
        except ApiError as exc:
            if not is_conflict(exc):
                self._own.owned.pop(name, None)  # refused: nothing was made; the next pass
                raise
            holder = await self.holder(name, digest, shared=shared)
            if holder is not None:
                self._own.owned.pop(name, None)
                return holder
        return None

    async def holder(self, name: str, digest: str, *, shared: bool) -> Holder | None:
        """Who holds ``name`` when it is not this node's to write, else None: an Instance of the
        other kind (``spec.shared`` is immutable), one recording another device (a 3-byte name
        digest collides, or a stolen token squatted it), or a local one naming other nodes."""
        existing = await self.read(name)
        if existing is None:
            return None  # gone meanwhile: the apply that follows makes it
        spec = existing.get("spec") or {}
        nodes = [str(n) for n in spec.get("nodes") or []]
        listed = ", ".join(nodes) or "none"
        if bool(spec.get("shared")) != shared:
            kind = "shared" if spec.get("shared") else "local"
            return Holder(f"a {kind} Instance of node(s) {listed}")
        recorded = str(spec.get("deviceDigest") or "")
        if recorded and recorded != digest:
            return Holder(f"listing node(s) {listed}", recorded)
        if shared or nodes in ([], [self._node]):
            return None
        return Holder(f"an Instance of node(s) {listed}")

    async def _fill_slots(self, obj: dict[str, Any]) -> None:
        """Add the slots ``obj`` lacks (capacity raised, or re-created by an apply), conditioned
        on the version read: it fails rather than overwrite a slot claimed in between."""
        name = obj["metadata"]["name"]
        usage = obj.get("spec", {}).get("deviceUsage") or {}
        missing = {
            slot_id(name, i): ""
            for i in range(self._cfg.spec.capacity)
            if slot_id(name, i) not in usage
        }
        if not missing:
            return
        patch = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"deviceUsage": missing},
        }
        try:
            await self._client.patch(
                InstanceResource, name, patch, namespace=self._cfg.namespace,
                patch_type=PatchType.MERGE, field_manager=self._manager,
            )
        except ApiError as exc:
            if not is_conflict(exc):
                raise
            self._applied.pop(name, None)  # someone wrote in between: fill at the next pass

    async def delete_if_alone(self, name: str) -> bool:
        """Delete ``name`` at once where this node alone is listed (one write where a leave
        and a delete make two); whether it is gone. Another node that joins between the read
        and the delete re-creates it, as after a leave."""
        current = await self.read(name)
        if current is None:
            return True
        if (current.get("spec") or {}).get("nodes") != [self._node]:
            return False
        await self.delete(name, str(current["metadata"].get("uid") or ""))
        return True

    async def leave_shared(self, name: str) -> None:
        """Take this node out of shared Instance ``name`` (an apply without ``nodes``,
        conditioned on the version read); delete it when no node is left."""
        extra = log_extra(self._cfg, self._node, name)
        for _attempt in range(LEAVE_ATTEMPTS):
            try:
                current = as_dict(
                    await self._client.get(InstanceResource, name, namespace=self._cfg.namespace)
                )
                # The read resourceVersion makes the apply conditional: it can neither
                # re-create an Instance deleted meanwhile nor race another writer.
                # The label stays while this node still holds a slot there: the device-plugin
                # side frees it, then drops the label (agent.kube.node_instances).
                body = self._leave_body(
                    name, current["metadata"]["resourceVersion"],
                    keep_label=node_instances.holds_usage(current, self._node))
                left = await self._client.patch(
                    InstanceResource, name, body, namespace=self._cfg.namespace,
                    patch_type=PatchType.APPLY, field_manager=self._manager, force=True,
                )
            except ApiError as exc:
                if is_not_found(exc):
                    return
                if is_conflict(exc):
                    continue
                raise
            stored = as_dict(left)
            nodes = stored.get("spec", {}).get("nodes") or []
            log.info("left Instance %s (nodes now %s)", name, nodes, extra=extra)
            if not nodes:
                await self.delete(name, str(stored["metadata"].get("uid") or ""))
            elif (node_instances.is_labelled(stored, self._node)
                  and not node_instances.wants_label(stored, self._node)):
                # Labelled by a merge patch too (agent.kube.node_instances.relabel): the apply
                # does not own it alone.
                await node_instances.drop_label(self._client, self._node, stored)
            return
        raise LeaveFailed(f"could not leave Instance {name}: it kept changing")

    def _leave_body(self, name: str, resource_version: str, *, keep_label: bool) -> dict[str, Any]:
        cfg = self._cfg
        metadata: dict[str, Any] = {
            "name": name, "namespace": cfg.namespace, "resourceVersion": resource_version,
        }
        if keep_label:
            label = node_instances.serves_label(self._node)
            metadata["labels"] = {label: node_instances.LABEL_VALUE}
        return {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": metadata}

    async def delete(self, name: str, uid: str = "") -> None:
        """Delete ``name`` (``uid``: the object read, which this node's watches then take for
        gone without reading it)."""
        try:
            await self._client.delete(InstanceResource, name, namespace=self._cfg.namespace)
            log.info("deleted Instance %s", name, extra=log_extra(self._cfg, self._node, name))
        except ApiError as exc:
            if not is_not_found(exc):
                raise
        if uid:
            node_instances.deleted_here(uid)
