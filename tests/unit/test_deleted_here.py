"""A watch takes an Instance this process deleted for gone without reading it again
(``agent.kube.node_instances.deleted_here``), and still reads every other ``DELETED`` (a label that
went is not a deletion), and a deletion remembered longer than
``settings.publishing.deleted_memory_s`` ago."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.kube import node_instances, watching
from agent.settings import PublishingSettings


class _Instance:
    def __init__(self, uid: str) -> None:
        self._body = {"metadata": {"name": f"i-{uid}", "namespace": "ns", "uid": uid}}

    def to_dict(self) -> dict[str, Any]:
        return self._body


async def _events(uids: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[
        list[tuple[str, str]], list[str]]:
    """What ``node_instances.watch`` yields for a DELETED of each of ``uids``, and the uids it
    read (each read answers: gone)."""
    read: list[str] = []

    async def events(*_args: Any, **_kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        for uid in uids:
            yield "DELETED", _Instance(uid)

    async def still_there(_client: Any, _node: str, _namespace: str, _name: str,
                          uid: str = "") -> None:
        read.append(uid)

    monkeypatch.setattr(watching, "watch", events)
    monkeypatch.setattr(node_instances, "still_there", still_there)
    got = [(kind, body["metadata"]["uid"]) async for kind, body in
           node_instances.watch(object(), "n1", what="test")]  # type: ignore[arg-type]
    return got, read


async def test_an_instance_deleted_here_is_gone_unread_and_others_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_instances, "_deleted", {})
    node_instances.deleted_here("mine")
    got, read = await _events(["mine", "label-gone"], monkeypatch)
    assert got == [("DELETED", "mine"), ("DELETED", "label-gone")]
    assert read == ["label-gone"]


async def test_a_deletion_is_forgotten_after_the_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_instances, "_deleted", {
        "old": time.monotonic() - PublishingSettings().deleted_memory_s - 1})
    node_instances.deleted_here("new")  # the old one is pruned here
    assert list(node_instances._deleted) == ["new"]
    got, read = await _events(["old", "new"], monkeypatch)
    assert read == ["old"]
    assert got == [("DELETED", "old"), ("DELETED", "new")]
