"""What handlers make on the node for a claim's devices (``agent.dra.claim_devices``, through
``ClaimPreparer``): a claim refused half-way leaves nothing made, no spec and no record; an
unprepare that cannot undo everything keeps what is left recorded for the kubelet's next call;
a restarted agent tells the handler what it made before.

The handler here makes a file per device in a directory of the test's own (the thing made on
the node), so what is made and undone is read from disk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import claims as cl
from agent.dra import slices
from agent.dra.plugin import ClaimPreparer
from agent.kube.node_reads import NodeReads
from discovery_handlers.contract import ClaimDevice, Device, DeviceSpec, PropertyValue
from discovery_handlers.registry import register_handler

NODE = "n1"


class Carving:
    """Devices carved on the node at prepare: each made one is a file; ``refused`` names the
    devices it will not make, ``stuck`` the files it cannot remove."""

    name = "test-carving"
    shared = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.refused: set[str] = set()
        self.stuck: set[str] = set()
        self.kept: list[dict[str, str]] = []

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> None:
        return None

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        yield ()

    async def prepare_claim_device(self, details: Any, device: Device) -> ClaimDevice | None:
        if device.id in self.refused:
            raise RuntimeError(f"no room for {device.id}")
        made = _carve(self.directory / device.id)
        return ClaimDevice(device=replace(device, device_specs=(
            DeviceSpec(container_path=f"/dev/{device.id}", host_path=str(made)),)),
            record={"path": str(made)})

    async def unprepare_claim_device(self, record: Mapping[str, str]) -> None:
        if record["path"] in self.stuck:
            raise RuntimeError(f"{record['path']} is busy")
        _uncarve(Path(record["path"]))

    def claim_device_kept(self, record: Mapping[str, str]) -> None:
        self.kept.append(dict(record))


def _carve(path: Path) -> Path:
    path.write_text("carved")
    return path


def _uncarve(path: Path) -> None:
    path.unlink()


class _NoReads(NodeReads):
    def __init__(self) -> None:
        super().__init__(cast(AsyncClient, None))


@pytest.fixture
def carving(tmp_path: Path) -> Carving:
    directory = tmp_path / "carved"
    directory.mkdir()
    handler = Carving(directory)
    register_handler(handler)
    return handler


async def preparer(tmp_path: Path, handler: Carving, monkeypatch: pytest.MonkeyPatch,
                   ids: Sequence[str]) -> ClaimPreparer:
    table = NodeDeviceTable()
    for device_id in ids:
        await table.put(NodeDevice(instance=f"slab-{device_id}", namespace="ns",
                                   configuration="slab", device=Device(id=device_id),
                                   handler=handler, details=None))
    made = ClaimPreparer(reads=_NoReads(), node_name=NODE, devices=table,
                         cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state")
    pool = slices.local_pool("ns", "slab", NODE)

    async def read(namespace: str, name: str, uid: str) -> dict[str, Any]:
        return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [
            {"request": "dev", "driver": "edgeplug.io", "pool": pool,
             "device": slices.device_name(f"slab-{i}")} for i in ids]}}}}

    monkeypatch.setattr(made, "_read_claim", read)
    return made


async def test_a_claim_refused_half_way_leaves_nothing_made(
    tmp_path: Path, carving: Carving, monkeypatch: pytest.MonkeyPatch,
) -> None:
    claims = await preparer(tmp_path, carving, monkeypatch, ["a", "b"])
    carving.refused = {"b"}
    with pytest.raises(cl.PrepareError, match="preparing slab-b failed: no room for b"):
        await claims.prepare("ns", "c", "u1")
    assert list(carving.directory.iterdir()) == [], "a's file undone when b was refused"
    assert claims.checkpoint.claims == {}
    assert cl.read_claim_spec(tmp_path / "cdi", "u1") is None


async def test_made_devices_are_given_recorded_and_undone_even_after_a_failed_unprepare(
    tmp_path: Path, carving: Carving, monkeypatch: pytest.MonkeyPatch,
) -> None:
    claims = await preparer(tmp_path, carving, monkeypatch, ["a", "b"])
    prepared = await claims.prepare("ns", "c", "u1")
    a, b = carving.directory / "a", carving.directory / "b"
    assert a.exists()
    assert b.exists()
    spec = cl.read_claim_spec(tmp_path / "cdi", "u1")
    assert spec is not None
    assert [d["containerEdits"]["deviceNodes"][0]["hostPath"] for d in spec["devices"]] == [
        str(a), str(b)], "the containers get what was made"
    assert [dict(d.made) for d in prepared.devices] == [{"path": str(a)}, {"path": str(b)}]

    restarted = await preparer(tmp_path, carving, monkeypatch, ["a", "b"])
    restarted.restore()
    assert carving.kept == [{"path": str(a)}, {"path": str(b)}]
    assert await restarted.prepare("ns", "c", "u1") == prepared, "answered from the record"

    carving.stuck = {str(b)}
    with pytest.raises(cl.PrepareError, match=f"{b} is busy"):
        await restarted.unprepare("ns", "c", "u1")
    assert not a.exists()
    assert b.exists()
    (left_a, left_b) = restarted.checkpoint.claims["u1"].devices
    assert (dict(left_a.made), dict(left_b.made)) == ({}, {"path": str(b)}), \
        "what was undone is no longer recorded; what was not, is"
    assert cl.read_claim_spec(tmp_path / "cdi", "u1") is not None

    carving.stuck = set()
    await restarted.unprepare("ns", "c", "u1")
    assert not b.exists()
    assert restarted.checkpoint.claims == {}
    assert cl.read_claim_spec(tmp_path / "cdi", "u1") is None
