"""The Instances that concern this node, as the API server filters them for it.

``serves_label`` and ``selector`` give the node's label on Instances; ``watch`` and ``still_there``
tell a label that went from a deletion; ``relabel``, ``drop_label``, ``deleted_here`` and
``label_unlabelled`` keep the label right. Design: docs/fleet.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient, operators
from lightkube.types import PatchType

from agent.kube import watching
from agent.kube.client import (
    InstanceResource,
    as_dict,
    field_manager,
    is_conflict,
    is_forbidden,
    is_not_found,
)
from agent.settings import current

log = logging.getLogger(__name__)

#: The label key's name part and domain: ``<node>.nodes.edgeplug.io/serves``.
LABEL_DOMAIN = "nodes.edgeplug.io"
LABEL_NAME = "serves"
LABEL_VALUE = "true"
#: A label key's prefix is a DNS subdomain of at most this many characters.
MAX_PREFIX = 253
#: A node name longer than this gets the digest form (``<digest>.digest.nodes.edgeplug.io``).
MAX_NODE_IN_LABEL = MAX_PREFIX - len(LABEL_DOMAIN) - 1
#: Instances one page of ``label_unlabelled``'s list holds.
MIGRATION_PAGE = 250

_deleted: dict[str, float] = {}  # uid → when this process deleted it, oldest first


def deleted_here(uid: str) -> None:
    """This process deleted the Instance ``uid``: a watch takes its ``DELETED`` for a deletion
    without reading it (a withdrawal of 1,000 Instances read each one again)."""
    now = time.monotonic()
    while _deleted and now - next(iter(_deleted.values())) > current().publishing.deleted_memory_s:
        del _deleted[next(iter(_deleted))]
    _deleted.pop(uid, None)
    _deleted[uid] = now


def serves_label(node: str) -> str:
    """The label key of Instances ``node`` serves; a digest form for names too long for it."""
    if not node:
        raise ValueError("a node name is required for the Instance label")
    if len(node) <= MAX_NODE_IN_LABEL:
        return f"{node}.{LABEL_DOMAIN}/{LABEL_NAME}"
    digest = hashlib.blake2b(node.encode(), digest_size=16).hexdigest()
    return f"{digest}.digest.{LABEL_DOMAIN}/{LABEL_NAME}"


def selector(node: str) -> dict[str, Any]:
    """The label selector of every Instance watch and list the agent makes."""
    return {serves_label(node): operators.exists()}


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


def is_labelled(obj: Mapping[str, Any], node: str) -> bool:
    return serves_label(node) in labels_of(obj)


def lists_node(obj: Mapping[str, Any], node: str) -> bool:
    return node in ((obj.get("spec") or {}).get("nodes") or [])


def holds_usage(obj: Mapping[str, Any], node: str) -> bool:
    """Whether a slot of the Instance names ``node`` as its holder (``N`` or ``C:<id>:N``)."""
    usage: Mapping[str, str] = (obj.get("spec") or {}).get("deviceUsage") or {}
    return any(v == node or (v.startswith("C:") and v.endswith(":" + node))
               for v in usage.values())


def wants_label(obj: Mapping[str, Any], node: str) -> bool:
    """Whether ``node``'s label belongs on the Instance: it lists the node, or the node still
    holds a slot there that its agent has to free."""
    return lists_node(obj, node) or holds_usage(obj, node)


async def _label_patch(client: AsyncClient, node: str, obj: Mapping[str, Any],
                       value: str | None) -> bool:
    """Set (``value``) or remove (None) this node's label on the read ``obj``, conditioned on
    its resourceVersion; False when it changed meanwhile (or went)."""
    meta = obj["metadata"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                          "labels": {serves_label(node): value}}}
    try:
        await client.patch(InstanceResource, meta["name"], patch, namespace=meta["namespace"],
                           patch_type=PatchType.MERGE, field_manager=field_manager(node))
    except ApiError as error:
        if is_conflict(error) or is_not_found(error):
            return False
        raise
    return True


async def relabel(client: AsyncClient, node: str, obj: Mapping[str, Any]) -> bool:
    """Put this node's label back on ``obj`` (someone removed it while the node is listed)."""
    done = await _label_patch(client, node, obj, LABEL_VALUE)
    if done:
        log.info("labelled Instance %s/%s for this node", obj["metadata"]["namespace"],
                 obj["metadata"]["name"], extra={"node": node})
    return done


async def drop_label(client: AsyncClient, node: str, obj: Mapping[str, Any]) -> bool:
    """Remove this node's label from ``obj`` (it no longer lists the node, which holds nothing
    there); False when the Instance changed since it was read (a rejoin, a claim)."""
    return await _label_patch(client, node, obj, None)


async def still_there(client: AsyncClient, node: str, namespace: str,
                      name: str, uid: str = "") -> dict[str, Any] | None:
    """The Instance as it is now, or None when it is gone (or is another object of the same
    name than ``uid``); labelled again where it lists this node but lost the label."""
    try:
        obj = as_dict(await client.get(InstanceResource, name, namespace=namespace))
    except ApiError as error:
        if is_not_found(error):
            return None
        raise
    if uid and obj["metadata"].get("uid") != uid:
        return None
    if lists_node(obj, node) and not is_labelled(obj, node):
        await relabel(client, node, obj)
    return obj


async def list_instances(client: AsyncClient, node: str,
                         namespace: str = "*") -> AsyncIterator[dict[str, Any]]:
    """The Instances labelled for this node, in ``namespace`` (``*``: all)."""
    async for obj in client.list(InstanceResource, namespace=namespace, labels=selector(node)):
        yield as_dict(obj)


async def watch(
    client: AsyncClient, node: str, *, what: str, namespace: str = "*",
    on_restart: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``watching.watch`` of the Instances labelled for this node. A ``DELETED`` that only
    says the label went (the Instance is still there) comes as ``MODIFIED`` with the Instance
    as read. The read is retried until it answers: taking the event for a deletion unread
    could free slots or withdraw a device that is still there."""
    async for kind, obj in watching.watch(client, InstanceResource, what=what,
                                          namespace=namespace, labels=selector(node),
                                          on_restart=on_restart):
        body = as_dict(obj)
        if kind != "DELETED":
            yield kind, body
            continue
        meta = body["metadata"]
        if meta.get("uid") in _deleted:
            yield "DELETED", body
            continue
        current = await _read_until_answered(client, node, meta, what)
        if current is None:
            yield "DELETED", body
        else:
            yield "MODIFIED", current


async def _read_until_answered(client: AsyncClient, node: str, meta: Mapping[str, Any],
                               what: str) -> dict[str, Any] | None:
    failures = 0
    while True:
        try:
            return await still_there(client, node, str(meta.get("namespace") or ""),
                                     str(meta["name"]), str(meta.get("uid") or ""))
        except Exception as error:  # ApiError, the API server away: the watch waits with it
            failures += 1
            log.warning("%s: reading %s after its label went failed (%s); retrying", what,
                        meta["name"], watching.describe(error))
            await asyncio.sleep(watching.retry_delay(failures))


async def label_unlabelled(client: AsyncClient, node: str, namespace: str = "*") -> int:
    """Label the Instances that list this node (or hold a slot of it) and lack its label:
    those an agent without labels left. One paginated list of every Instance without this
    node's label (in ``namespace``); the number labelled. A policy that refuses the label
    (an install older than the agent) is said once and leaves them as they are."""
    labelled = 0
    async for obj in client.list(InstanceResource, namespace=namespace, chunk_size=MIGRATION_PAGE,
                                 labels={serves_label(node): operators.not_exists()}):
        body = as_dict(obj)
        if not wants_label(body, node):
            continue
        try:
            if await relabel(client, node, body):
                labelled += 1
        except ApiError as error:
            if not is_forbidden(error):
                raise
            log.error("labelling this node's Instances was refused (%s): the agent's Instance "
                      "policy is older than the agent; Instances it did not label are not seen "
                      "until it applies them", watching.describe(error), extra={"node": node})
            return labelled
    if labelled:
        log.info("labelled %d Instances of this node left without its label", labelled,
                 extra={"node": node})
    return labelled
