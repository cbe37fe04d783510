"""Which per-Instance DeviceClasses a sync writes (``controller.dra.instance_classes``): only those
of the Instances marked since the last one (issue 48)."""

from __future__ import annotations

from typing import Any, cast

from lightkube import AsyncClient

from controller.dra.instance_classes import InstanceClasses
from crds.configuration import Allocator


class _Client:
    def __init__(self) -> None:
        self.applied: list[str] = []
        self.deleted: list[str] = []

    async def patch(self, _resource: object, name: str, body: dict[str, Any],
                    **_: object) -> dict[str, Any]:
        self.applied.append(name)
        return body

    async def delete(self, _resource: object, name: str, **_: object) -> None:
        self.deleted.append(name)


async def test_a_sync_writes_only_the_classes_of_instances_marked() -> None:
    client = _Client()
    classes = InstanceClasses(cast(AsyncClient, client), namespaces=["ns"])
    for i in range(20):
        classes._set(("ns", f"cam-{i:06x}"), "cam")
    classes.set_mode(("ns", "cam"), Allocator.DRA)
    await classes._sync()
    assert len(client.applied) == 20
    assert len(classes.resources()) == 20
    client.applied.clear()
    classes._changed.clear()
    # The same Instance seen again (a status write, a new resourceVersion): nothing to do.
    classes._set(("ns", "cam-000003"), "cam")
    assert not classes._changed.is_set()
    classes._set(("ns", "cam-000100"), "cam")
    classes._set(("ns", "cam-000004"), None)
    await classes._sync()
    assert client.applied == ["cam-000100.ns.instances.edgeplug.io"]
    assert client.deleted == ["cam-000004.ns.instances.edgeplug.io"]
    assert "edgeplug.io/cam-000100" in classes.resources()
    classes.set_mode(("ns", "cam"), Allocator.DEVICE_PLUGIN)
    await classes._sync()
    assert len(client.deleted) == 21
    assert classes.resources() == frozenset()
