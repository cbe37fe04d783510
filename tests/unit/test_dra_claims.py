"""A claim's devices found by pool and name, its CDI spec (per device, or composed), the record,
and the spec written again from the record where a reboot emptied the CDI directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import claims as cl
from agent.dra import slices
from agent.dra.plugin import CHECKPOINT_FILE, ClaimPreparer
from agent.kube.node_reads import NodeReads
from discovery_handlers.contract import Device, DeviceSpec, Mount
from tests.harness.echo_handlers import EchoDetails, ExtendedEcho


def node_device(instance: str, *, handler: ExtendedEcho | None = None, compose: bool = False,
                namespace: str = "ns") -> NodeDevice:
    return NodeDevice(
        instance=instance, namespace=namespace, configuration="npu",
        device=Device(id=instance[-1], properties={"CHIP": instance[-1]},
                      device_specs=(DeviceSpec("/dev/chip" + instance[-1],
                                               "/dev/chip" + instance[-1]),),
                      mounts=(Mount(container_path="/opt/driver", host_path="/usr/local/driver",
                                    read_only=True),)),
        broker_properties={"SITE": "lab"}, handler=handler,
        details=EchoDetails(descriptions=(), compose=compose) if handler else None,
    )


def test_results_for_this_driver_only_and_an_unallocated_claim_refused() -> None:
    claim = {"status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "edgeplug.io", "pool": "p", "device": "d"},
        {"request": "r", "driver": "gpu.example.com", "pool": "q", "device": "e"},
        {"request": "s", "driver": "edgeplug.io", "pool": "p", "device": "f", "shareID": "9a"},
    ]}}}}
    assert cl.results_for_driver(claim) == [cl.AllocatedDevice("r", "p", "d"),
                                            cl.AllocatedDevice("s", "p", "f", share_id="9a")]
    with pytest.raises(cl.PrepareError, match="not allocated"):
        cl.results_for_driver({"status": {}})


def test_find_device_by_pool_and_name() -> None:
    a, b = node_device("npu-00000a"), node_device("npu-00000b", namespace="other")
    local = slices.local_pool("ns", "npu", "n1")
    assert cl.find_device([a, b], "n1", cl.AllocatedDevice("", local, "npu-00000a")) is a
    # The same device name in another pool (another node's, another namespace's) is not ours.
    assert cl.find_device([a, b], "n2", cl.AllocatedDevice("", local, "npu-00000a")) is None
    assert cl.find_device([a, b], "n1", cl.AllocatedDevice("", local, "npu-00000b")) is None
    shared = slices.shared_pool("other", "npu", "npu-00000b")
    assert cl.find_device([a, b], "n1", cl.AllocatedDevice("", shared, "npu-00000b")) is b


def test_spec_per_device_env_nodes_and_mounts() -> None:
    spec = cl.claim_spec("uid-1", [node_device("npu-00000a"), node_device("npu-00000b")])
    assert spec["kind"] == "edgeplug.io/claim"
    assert "containerEdits" not in spec
    first, second = spec["devices"]
    assert first["name"] == "uid-1-0"
    assert "CHIP=a" in first["containerEdits"]["env"]
    assert "CHIP_00000A=a" in first["containerEdits"]["env"]
    assert first["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/chipa", "hostPath": "/dev/chipa", "permissions": "rwm"}]
    assert first["containerEdits"]["mounts"] == [
        {"hostPath": "/usr/local/driver", "containerPath": "/opt/driver",
         "options": ["bind", "ro"]}]
    assert second["containerEdits"]["deviceNodes"][0]["path"] == "/dev/chipb"


def test_composing_handler_env_is_spec_wide_and_not_per_device() -> None:
    handler = ExtendedEcho()
    devices = [node_device("npu-00000a", handler=handler, compose=True),
               node_device("npu-00000b", handler=handler, compose=True)]
    spec = cl.claim_spec("uid-2", devices)
    assert spec["containerEdits"] == {"env": ["ECHO_ALL=a,b", "SITE=lab"]}
    assert all("env" not in d["containerEdits"] for d in spec["devices"])


def test_checkpoint_round_trip_and_an_unreadable_one_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    record = cl.Checkpoint(path)
    prepared = cl.PreparedClaim(namespace="ns", name="c", devices=(
        cl.PreparedDevice(request="r", pool="p", device="d", cdi_ids=("edgeplug.io/claim=u-0",)),
        cl.PreparedDevice(request="s", pool="p", device="f", cdi_ids=("edgeplug.io/claim=u-1",),
                          share_id="9a"),
    ), cdi_spec=cl.claim_spec("u", [node_device("npu-00000a")]))
    older = cl.PreparedClaim(namespace="ns", name="old", devices=prepared.devices)
    record.put("u", prepared)
    record.put("v", older)  # an older agent's claim: no spec recorded
    assert cl.Checkpoint(path).claims == {"u": prepared, "v": older}
    record.drop("u")
    record.drop("v")
    assert cl.Checkpoint(path).claims == {}
    not_a_spec = ('{"version": 1, "claims": {"u": {"namespace": "ns", "name": "c", '
                  '"devices": [], "cdi_spec": {"kind": "other"}}}}')
    for garbage in ('{"version": 99, "claims": {}}', "{not json", '{"version": 1}', not_a_spec):
        path.write_text(garbage)
        assert cl.Checkpoint(path).claims == {}
        assert not path.exists()
        assert (tmp_path / "claims.json.unreadable").read_text() == garbage


class _NoReads(NodeReads):
    """Reads nothing: a claim the record answers is never read from the API again."""

    def __init__(self) -> None:
        super().__init__(cast(AsyncClient, None))

    async def client(self) -> AsyncClient:
        raise AssertionError("a recorded claim was read from the API")


def _allocated(uid: str, pool: str, device: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [
        {"request": "dev", "driver": "edgeplug.io", "pool": pool, "device": device}]}}}}


async def _table(*devices: NodeDevice) -> NodeDeviceTable:
    table = NodeDeviceTable()
    for device in devices:
        await table.put(device)
    return table


async def test_a_reboot_empties_the_cdi_directory_and_the_record_writes_the_spec_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prepared, then the node reboots: ``/var/run/cdi`` emptied, the record on disk kept, the
    agent started again before discovery found anything. The spec is back, the same, before
    the kubelet asks; and where it goes again, the kubelet's prepare writes it again."""
    cdi_dir, state = tmp_path / "run" / "cdi", tmp_path / "plugins" / "edgeplug.io"
    device = node_device("npu-00000a")
    pool = slices.local_pool("ns", "npu", "n1")
    first = ClaimPreparer(reads=_NoReads(), node_name="n1", devices=await _table(device),
                          cdi_dir=cdi_dir, state_dir=state)

    async def read(namespace: str, name: str, uid: str) -> dict[str, Any]:
        return _allocated(uid, pool, slices.device_name(device.instance))

    monkeypatch.setattr(first, "_read_claim", read)
    prepared = await first.prepare("ns", "c", "u1")
    spec = cl.claim_spec_path(cdi_dir, "u1")
    written = spec.read_text()

    shutil.rmtree(cdi_dir)  # the reboot: /run is a tmpfs
    second = ClaimPreparer(reads=_NoReads(), node_name="n1", devices=NodeDeviceTable(),
                           cdi_dir=cdi_dir, state_dir=state)
    second.restore()  # what the plugin does before it registers with the kubelet
    assert spec.read_text() == written
    spec.unlink()
    assert await second.prepare("ns", "c", "u1") == prepared
    assert spec.read_text() == written, "the kubelet is told only what is on disk"
    spec.write_text("{}")  # a spec that is not the one recorded is replaced
    await second.prepare("ns", "c", "u1")
    assert spec.read_text() == written

    await second.unprepare("ns", "c", "u1")
    await second.unprepare("ns", "c", "u1")
    assert not spec.exists()
    assert cl.Checkpoint(state / CHECKPOINT_FILE).claims == {}


async def test_an_older_agents_record_takes_the_spec_on_disk_or_the_served_device(
    tmp_path: Path,
) -> None:
    """A record without specs (an older agent's): at start a claim whose spec is still on
    disk records it; one whose spec is gone and whose device is not served yet is logged, its
    prepare refused (the kubelet asks again), and made from the device once it is served."""
    cdi_dir, state = tmp_path / "cdi", tmp_path / "state"
    device = node_device("npu-00000a")
    pool = slices.local_pool("ns", "npu", "n1")
    recorded = (cl.PreparedDevice(request="dev", pool=pool,
                                  device=slices.device_name(device.instance),
                                  cdi_ids=(cl.cdi_id("kept", 0),)),)
    record = cl.Checkpoint(state / CHECKPOINT_FILE)
    record.put("kept", cl.PreparedClaim(namespace="ns", name="kept", devices=recorded))
    record.put("lost", cl.PreparedClaim(namespace="ns", name="lost", devices=recorded))
    on_disk = cl.claim_spec("kept", [device])
    cl.write_claim_spec(cdi_dir, "kept", on_disk)

    table = NodeDeviceTable()
    preparer = ClaimPreparer(reads=_NoReads(), node_name="n1", devices=table, cdi_dir=cdi_dir,
                             state_dir=state)
    preparer.restore()
    claims = cl.Checkpoint(state / CHECKPOINT_FILE).claims
    assert claims["kept"].cdi_spec == on_disk
    assert claims["lost"].cdi_spec is None
    assert not cl.claim_spec_path(cdi_dir, "lost").exists()
    with pytest.raises(cl.PrepareError, match="not served on node n1 yet"):
        await preparer.prepare("ns", "lost", "lost")

    await table.put(device)
    await preparer.prepare("ns", "lost", "lost")
    made = cl.claim_spec("lost", [device])
    assert json.loads(cl.claim_spec_path(cdi_dir, "lost").read_text()) == made
    assert cl.Checkpoint(state / CHECKPOINT_FILE).claims["lost"].cdi_spec == made
