"""A claim's devices found by pool and name, its CDI spec (per device, or composed), the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.dra import claims as cl
from agent.dra import slices
from agent.node_devices import NodeDevice
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
    ]}}}}
    assert cl.results_for_driver(claim) == [cl.AllocatedDevice("r", "p", "d")]
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
    ))
    record.put("u", prepared)
    assert cl.Checkpoint(path).claims == {"u": prepared}
    record.drop("u")
    assert cl.Checkpoint(path).claims == {}
    for garbage in ('{"version": 99, "claims": {}}', "{not json", '{"version": 1}'):
        path.write_text(garbage)
        assert cl.Checkpoint(path).claims == {}
        assert not path.exists()
        assert (tmp_path / "claims.json.unreadable").read_text() == garbage
