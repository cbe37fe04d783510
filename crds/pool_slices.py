"""The API reads and deletes both ResourceSlice publishers make by pool: an agent for its
node's local pools (``agent.dra.publisher``), the controller for shared ones
(``controller.dra.shared_pools``).

``slices_by_pool`` lists every slice of some pools, ``POOLS_PER_LIST`` pools a list (one set-based
selector on the pool label; one list per pool was a round trip before each new pool's write);
``delete_slices`` deletes slices by name, a 404 being already done. Each API call goes through
``gate`` (the agent bounds its calls in flight; the controller passes none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Final, cast

from lightkube import ApiError, AsyncClient, operators

from crds import dra_slices
from crds.resources import ResourceSliceResource

#: Pools whose slices are looked up in one list.
POOLS_PER_LIST: Final = 40
HTTP_NOT_FOUND: Final = 404


def as_dict(obj: Any) -> dict[str, Any]:
    """A listed or returned slice as a dict (lightkube gives generic resources)."""
    return obj if isinstance(obj, dict) else cast(dict[str, Any], obj.to_dict())


async def slices_by_pool(client: AsyncClient, pools: list[str], *,
                         gate: contextlib.AbstractAsyncContextManager[Any] | None = None
                         ) -> dict[str, list[dict[str, Any]]]:
    """Every slice of each of ``pools`` (any publisher's, any generation), by pool."""
    found: dict[str, list[dict[str, Any]]] = {}
    wanted = set(pools)
    for start in range(0, len(pools), POOLS_PER_LIST):
        labels = sorted({dra_slices.pool_label(p) for p in pools[start:start + POOLS_PER_LIST]})
        async with gate or contextlib.nullcontext():
            async for obj in client.list(ResourceSliceResource,
                                         labels={dra_slices.LABEL_POOL: operators.in_(labels)}):
                body = as_dict(obj)
                pool = str(body["spec"]["pool"]["name"])
                if pool in wanted:
                    found.setdefault(pool, []).append(body)
    return found


async def delete_slices(client: AsyncClient, names: Iterable[str], *,
                        gate: contextlib.AbstractAsyncContextManager[Any] | None = None) -> int:
    """Delete the slices ``names``; how many deletes the API server did (a 404 is none)."""
    deleted = 0
    for name in names:
        try:
            async with gate or contextlib.nullcontext():
                await client.delete(ResourceSliceResource, name)
            deleted += 1
        except ApiError as error:
            if error.status.code != HTTP_NOT_FOUND:
                raise
    return deleted
