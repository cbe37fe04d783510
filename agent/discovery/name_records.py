"""What the API server's Instances of given names record, read in one list instead of a GET each.

``recorded_digests`` answers for many names at once from ``LIST_FROM`` names on
(docs/architecture.md, "The agent's discovery modules").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from lightkube import AsyncClient

from agent.kube.client import InstanceResource, as_dict

#: From this many names to look up on, one list of the namespace beats a GET each.
LIST_FROM = 16
#: Instances one page of that list holds.
LIST_PAGE = 500


async def recorded_digests(client: AsyncClient, namespace: str,
                           names: Collection[str]) -> Mapping[str, str]:
    """Each of ``names`` the namespace holds → the ``spec.deviceDigest`` it records (``""``:
    none); a name absent is not held."""
    wanted = set(names)
    found: dict[str, str] = {}
    async for obj in client.list(InstanceResource, namespace=namespace, chunk_size=LIST_PAGE):
        body = as_dict(obj)
        name = str(body["metadata"]["name"])
        if name in wanted:
            found[name] = str((body.get("spec") or {}).get("deviceDigest") or "")
    return found
