"""The API side of the shared devices' pools (``controller.dra.shared_pools`` decides what each
holds): asks whether the API server keeps per-device node selection, adopts what an earlier
controller (or an older release's agent) wrote, lists a pool's slices, writes a pool one
generation above every slice of it and deletes the rest, withdraws a pool. It remembers what it
wrote (``written``, and each device as written, ``entries``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from crds import dra, dra_features, dra_slices, pool_slices, written_slices
from crds.pool_slices import as_dict
from crds.resources import ResourceSliceResource

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "edgeplug-controller/shared-pools"
#: The pool and node of the dry-run slice that asks whether per-device node selection is kept.
PROBE_POOL: Final = dra_slices.shared_pool("kube-system", "edgeplug-probe", "probe")
PROBE_NODE: Final = "edgeplug-probe"



def namespace_of(body: Mapping[str, Any]) -> str:
    """The namespace a listed slice's devices name (``crds.dra`` attribute ``namespace``)."""
    for device in body["spec"].get("devices") or ():
        value = ((device.get("attributes") or {}).get(dra.ATTR_NAMESPACE) or {}).get("string")
        if value:
            return str(value)
    return ""


class PoolWriter:
    """Writes and deletes the controller's slices of shared pools; ``writes`` counts the calls
    that changed something (for tests and benchmarks)."""

    def __init__(self, client: AsyncClient, *, in_flight: int) -> None:
        """``in_flight``: API calls at once (pools are independent; one pool's own calls stay
        in order: apply, then delete the stale)."""
        self._client = client
        self._gate = asyncio.Semaphore(in_flight)
        self.features = dra_features.FeatureReport(log)
        self.writes = 0
        self.written: dict[str, written_slices.Written] = {}
        #: pool → device name → the device as last written (a held device is kept so)
        self.entries: dict[str, dict[str, Mapping[str, Any]]] = {}

    async def keeps_per_device_nodes(self) -> bool:
        """Whether the API server keeps ``perDeviceNodeSelection`` (DRAPartitionableDevices),
        asked by a dry-run write of a pool of one device."""
        plan = dra_slices.pooled_plan(PROBE_POOL, [dra_slices.PoolPlan(
            name=PROBE_POOL, nodes=(PROBE_NODE,), devices=({"name": "probe"},))])
        body = dra_slices.slice_bodies(plan, generation=1,
                                       publisher=dra_slices.CONTROLLER_PUBLISHER)[0]
        try:
            stored = await self._client.patch(
                ResourceSliceResource, body["metadata"]["name"], body, dry_run=True,
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
        except ApiError as error:
            # 422: dropped, then refused as placing nowhere; 403: an earlier release's slice
            # policy (deploy/dra not reapplied yet) refuses per-device selectors.
            if error.status.code not in (403, 422):
                raise
            why = str(error.status.message)
        else:
            if as_dict(stored)["spec"].get("perDeviceNodeSelection"):
                return True
            why = "the field was dropped"
        log.warning("shared pools: the API server keeps no slice whose devices name their own "
                    "nodes (%s; %s off, or an earlier release's deploy/dra): each shared device "
                    "gets a pool and a slice of its own until the controller restarts", why,
                    dra_features.PARTITIONABLE_DEVICES)
        return False

    async def adopt(self, serves: Callable[[str], bool]) -> dict[tuple[str, str], str]:
        """Learn the pools written before (every slice of the driver bound to no node, in a
        shared pool of a namespace ``serves``: an earlier controller's, or an older release's
        agent's, taken over by the next write), so none is rewritten needlessly and generations
        keep growing; delete their older generations. Returns (namespace, device name) → pool
        for the devices found in a pool of their own: claims allocated from it name it."""
        by_pool: dict[str, list[dict[str, Any]]] = {}
        async for obj in self._client.list(
                ResourceSliceResource, fields={"spec.driver": dra.DRIVER, "spec.nodeName": ""}):
            body = as_dict(obj)
            pool = str(body["spec"]["pool"]["name"])
            if body["spec"].get("driver") == dra.DRIVER and not body["spec"].get("nodeName") \
                    and dra_slices.is_shared_pool(pool) and serves(namespace_of(body)):
                by_pool.setdefault(pool, []).append(body)
        own: dict[tuple[str, str], str] = {}
        for pool, found in by_pool.items():
            written, stale = written_slices.adopt(found)
            await self.delete(stale)
            self.written[pool] = written
            current = [s for s in found if s["metadata"]["name"] in written.names]
            self.entries[pool] = {str(d["name"]): written_slices.as_written(d)
                                  for s in current for d in s["spec"].get("devices") or ()}
            if not any(s["spec"].get("perDeviceNodeSelection") for s in current):
                namespace = namespace_of(current[0])
                own.update({(namespace, name): pool for name in self.entries[pool]})
        return own

    async def _gated(self, call: Awaitable[Any]) -> Any:
        async with self._gate:
            return await call

    async def listed(self, pools: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Every slice of the driver's of each pool (any publisher's, any generation); the
        lists (``pool_slices.POOLS_PER_LIST`` pools each) in flight at once, gated."""
        chunk = pool_slices.POOLS_PER_LIST
        found = await asyncio.gather(*(
            pool_slices.slices_by_pool(self._client, pools[i:i + chunk], gate=self._gate)
            for i in range(0, len(pools), chunk)))
        return {pool: mine for listed in found for pool, slices in listed.items()
                if (mine := [s for s in slices if s["spec"].get("driver") == dra.DRIVER])}

    async def publish(self, plan: dra_slices.PoolPlan, key: str,
                      others: list[dict[str, Any]]) -> None:
        """Write the pool (``key``: its content key) one generation above any of its slices,
        then delete the rest (this controller's older slices, an agent's from before the
        upgrade)."""
        before = self.written.get(plan.name)
        newest = max([written_slices.generation(s) for s in others]
                     + [before.generation if before is not None else 0])
        generation = newest + 1
        bodies = dra_slices.slice_bodies(plan, generation=generation,
                                         publisher=dra_slices.CONTROLLER_PUBLISHER)
        for body in bodies:
            stored = await self._gated(self._client.patch(
                ResourceSliceResource, body["metadata"]["name"], body,
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True))
            self.writes += 1
            self.features.note(dra_features.dropped_by_slice(body, as_dict(stored)),
                               what=f"ResourceSlice {body['metadata']['name']}")
        names = tuple(b["metadata"]["name"] for b in bodies)
        stale = {str(s["metadata"]["name"]) for s in others} | set(
            before.names if before is not None else ())
        await self.delete(sorted(stale - set(names)))
        self.written[plan.name] = written_slices.Written(
            generation=generation, names=names, key=key)
        self.entries[plan.name] = {str(d["name"]): d for d in plan.devices}
        log.info("ResourceSlice pool published", extra={
            "pool": plan.name, "generation": generation, "devices": len(plan.devices),
            "tainted": any("taints" in d for d in plan.devices)})

    async def withdraw(self, pool: str, listed: list[dict[str, Any]]) -> None:
        names = {str(s["metadata"]["name"]) for s in listed} | set(self.written[pool].names)
        await self.delete(sorted(names))
        self.written.pop(pool, None)
        self.entries.pop(pool, None)
        log.info("ResourceSlice pool withdrawn", extra={"pool": pool})

    async def delete(self, names: Iterable[str]) -> None:
        self.writes += await pool_slices.delete_slices(self._client, names, gate=self._gate)
