"""Which per-Instance DeviceClasses a sync writes (``controller.dra.instance_classes``): only those
of Instances a waiting pod asked for, and only those marked since the last sync."""

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


def _waiting_pod(namespace: str, *resources: str) -> dict[str, Any]:
    """A pod the scheduler has not bound, asking for ``resources`` (one each)."""
    return {"metadata": {"name": "p", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": dict.fromkeys(resources, "1")}}]}}


async def test_a_class_is_made_only_for_an_instance_a_waiting_pod_asks_for() -> None:
    client = _Client()
    classes = InstanceClasses(cast(AsyncClient, client), namespaces=["ns"])
    for i in range(3):
        classes._set(("ns", f"cam-{i:06x}"), "cam")
    classes.set_mode(("ns", "cam"), Allocator.DRA)
    await classes._sync()
    assert client.applied == [], "no pod asks: no class"
    assert "edgeplug.io/cam-000001" in classes.resources(), "the scheduler's all the same"
    # A pod asking for one Instance by name, another Configuration's resource, a resource of
    # another namespace, and one of no Instance yet.
    classes.asked(_waiting_pod("ns", "edgeplug.io/cam-000001", "edgeplug.io/cam",
                               "edgeplug.io/cam-000009"))
    classes.asked(_waiting_pod("other", "edgeplug.io/cam-000002"))
    await classes._sync()
    assert client.applied == ["cam-000001.ns.instances.edgeplug.io"]
    classes._set(("ns", "cam-000009"), "cam")  # its Instance comes after the pod
    await classes._sync()
    assert client.applied[-1] == "cam-000009.ns.instances.edgeplug.io"
    classes._set(("ns", "cam-000001"), None)
    await classes._sync()
    assert client.deleted == ["cam-000001.ns.instances.edgeplug.io"]


async def test_a_sync_writes_only_the_classes_of_instances_marked() -> None:
    client = _Client()
    classes = InstanceClasses(cast(AsyncClient, client), namespaces=["ns"])
    for i in range(20):
        classes._set(("ns", f"cam-{i:06x}"), "cam")
    classes.asked(_waiting_pod("ns", *(f"edgeplug.io/cam-{i:06x}" for i in (*range(20), 256))))
    classes.set_mode(("ns", "cam"), Allocator.DRA)
    await classes._sync()
    assert len(client.applied) == 20
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
    assert "edgeplug.io/cam-000004" not in classes.resources()
    classes.set_mode(("ns", "cam"), Allocator.DEVICE_PLUGIN)
    await classes._sync()
    assert len(client.deleted) == 21
    assert classes.resources() == frozenset()
