"""What the device-plugin side knows of the Instances labelled for this node, and which copies
wake a reconcile pass.

``InstanceCache`` holds the newest copy of each Instance (from the watch, a relist, or a write of
ours, ``remember``) and the copies the last pass decided from; ``seen`` says whether a copy tells
a pass anything new (docs/slots.md). ``InstanceWatch`` feeds it from the API server: the
node's Instance watch, and a relist whenever that watch starts over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from lightkube import AsyncClient

from agent.kube import node_instances, watching
from crds.instance import Instance

log = logging.getLogger(__name__)

Key = tuple[str, str]  # namespace, Instance name


def key_of(obj: Mapping[str, Any]) -> Key:
    return (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


class InstanceCache(Mapping[Key, Instance]):
    """The newest copy of each Instance of this node, and the copies the last pass began from.

    ``on_copy(key, instance, obj)`` hears of every copy taken in (the ledgers and display
    fields follow them); ``on_forget(key)`` of every Instance forgotten.
    """

    def __init__(self, node: str, *, on_copy: Callable[[Key, Instance, Mapping[str, Any]], None],
                 on_forget: Callable[[Key], None]) -> None:
        self.node = node
        self._on_copy = on_copy
        self._on_forget = on_forget
        self._instances: dict[Key, Instance] = {}
        #: The copies the last reconcile pass started from (``seen`` wakes a pass only for a
        #: copy that says something else).
        self._passed: dict[Key, Instance] = {}
        #: Instances known from a read after this node's label went (agent.kube.node_instances):
        #: no watch event brings their changes; forgotten once nothing of this node's is left.
        self._unlabelled: set[Key] = set()

    # -- reading (a Mapping of the newest copies) ------------------------------------------

    def __getitem__(self, key: Key) -> Instance:
        return self._instances[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._instances)

    def __len__(self) -> int:
        return len(self._instances)

    def snapshot(self) -> dict[Key, Instance]:
        return dict(self._instances)

    def is_unlabelled(self, key: Key) -> bool:
        return key in self._unlabelled

    # -- taking copies in ------------------------------------------------------------------

    def seen(self, obj: Mapping[str, Any]) -> bool:
        """Take in a copy of an Instance; whether it tells a pass anything new.

        A copy that differs only in its ``resourceVersion`` from the one the last pass started
        from (the echo of a slot write that pass already decided from, or of a display write:
        ``status.used`` and ``status.nodes`` are not part of ``Instance``) changes no
        decision: it is kept, for the next conditioned write, but wakes no pass. The echo of a
        write no pass has started from (an Allocate's recording, kept by ``remember``) wakes
        one.
        """
        instance = Instance.from_object(dict(obj))
        key = (instance.namespace, instance.name)
        self._on_copy(key, instance, obj)
        known = self._passed.get(key)
        was_unlabelled = key in self._unlabelled
        # Older than our own last write while the watch lags it: a pass starts from
        # that write instead (pass_starts).
        self._instances[key] = instance
        if node_instances.is_labelled(dict(obj), self.node):
            self._unlabelled.discard(key)
        else:  # read after its label went: no watch event brings its changes
            self._unlabelled.add(key)
        return (known is None or was_unlabelled != (key in self._unlabelled)
                or replace(known, resource_version=instance.resource_version) != instance)

    def remember(self, instance: Instance) -> None:
        """Keep the copy a write of ours returned, ahead of its watch event.

        Only for Instances still known: one the watch has meanwhile deleted stays deleted. An
        older watch event may later overwrite it; that costs a conditioned write a retry only.
        """
        key = (instance.namespace, instance.name)
        if key in self._instances:
            self._instances[key] = instance

    def forget(self, key: Key) -> None:
        self._instances.pop(key, None)
        self._passed.pop(key, None)
        self._unlabelled.discard(key)
        self._on_forget(key)

    def pass_starts(self, own_writes: Mapping[Key, Instance | None]) -> None:
        """The copies a pass decides from: our own last write of an Instance where the watch
        has not delivered it yet (a pass must not advertise a slot this node just released, or
        withdraw one it just reserved, from the older copy); an echo of one of them wakes no
        later pass."""
        for key, latest in own_writes.items():
            if key in self._instances and latest is not None:
                self._instances[key] = latest
        self._passed = dict(self._instances)


class InstanceWatch:
    """Feeds an ``InstanceCache`` from the watch of this node's Instances; ``wake`` on news."""

    def __init__(self, client: AsyncClient, cache: InstanceCache, *,
                 wake: Callable[[], None], on_restart: Callable[[], None],
                 on_unchanged: Callable[[Mapping[str, Any]], None]) -> None:
        """``on_restart``: the watch starts over (before the relist); ``on_unchanged``: a copy
        that woke no pass (its display fields may still need putting right)."""
        self._client = client
        self._cache = cache
        self._wake = wake
        self._on_restart = on_restart
        self._on_unchanged = on_unchanged
        self._relists: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        # Only the Instances labelled for this node: a write to another node's never comes.
        stream = node_instances.watch(
            self._client, self._cache.node, what="instances", on_restart=self._relist_later,
        )
        async for op, obj in stream:
            if op == "DELETED":
                self._cache.forget(key_of(obj))
            elif not self._cache.seen(obj):
                self._on_unchanged(obj)
                continue
            self._wake()

    def _relist_later(self) -> None:
        """The Instance watch starts over: relist, so Instances deleted meanwhile go."""
        self._on_restart()
        task = asyncio.create_task(self.relist(), name="relist-instances")
        self._relists.add(task)
        task.add_done_callback(self._relists.discard)

    async def relist(self) -> None:
        before = self._cache.snapshot()
        node = self._cache.node
        try:
            listed = {key_of(obj) async for obj in node_instances.list_instances(self._client,
                                                                                  node)}
            missed = watching.missed_deletions(before, self._cache.snapshot(), listed)
            # Not listed may mean only that the label went: read each before forgetting it.
            found = {key: await node_instances.still_there(
                self._client, node, *key, before[key].uid) for key in missed}
        except Exception as error:  # ApiError, or the API server unreachable: the next
            # watch restart relists again, and the periodic reconcile carries on meanwhile
            log.warning("relist of Instances failed (%s)", watching.describe(error))
            return
        for key, obj in found.items():
            if self._cache.get(key) is not before[key]:
                continue  # the watch brought a newer copy meanwhile
            if obj is None:
                self._cache.forget(key)
            else:
                self._cache.seen(obj)
        self._wake()
