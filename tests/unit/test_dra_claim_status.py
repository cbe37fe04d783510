"""What the agent writes in a prepared claim's ``status.devices`` (``agent.dra.claim_status``):
network data, data, the Ready condition, and when it writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from lightkube import AsyncClient

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.dra import claim_status as cs
from discovery_handlers.contract import Device, Health


def _device(properties: dict[str, str], health: Health | None = None) -> NodeDevice:
    return NodeDevice(instance="cam-abc123", namespace="ns", configuration="cam",
                      device=Device(id="cam", properties=properties),
                      health=health or Health())


def test_network_data_from_an_ip_a_mac_or_a_url_naming_an_ip() -> None:
    assert cs.network_data({"ONVIF_DEVICE_IP_ADDRESS": "10.0.0.7",
                            "ONVIF_DEVICE_MAC_ADDRESS": "00:11:22:33:44:55",
                            "ONVIF_DEVICE_SERVICE_URL": "http://10.0.0.7/onvif"}) == {
        "ips": ["10.0.0.7/32"], "hardwareAddress": "00:11:22:33:44:55"}
    assert cs.network_data({"OPCUA_DISCOVERY_URL": "opc.tcp://[fd00::5]:4840/"}) == {
        "ips": ["fd00::5/128"]}
    # A host name says no address; a device without one has no network data.
    assert cs.network_data({"OPCUA_DISCOVERY_URL": "opc.tcp://plc.local:4840/"}) is None
    assert cs.network_data({"UDEV_DEVNODE": "/dev/ttyUSB0"}) is None


def test_data_holds_the_properties_as_far_as_the_api_allows() -> None:
    data = cs.device_data(_device({"UDEV_DEVNODE": "/dev/ttyUSB0"}))
    assert data == {"instance": "cam-abc123", "configuration": "cam",
                    "properties": {"UDEV_DEVNODE": "/dev/ttyUSB0"}}
    big = cs.device_data(_device({f"P{i:03d}": "x" * 1000 for i in range(12)}))
    assert len(big["properties"]) < 12
    assert big["leftOut"] == sorted(set(f"P{i:03d}" for i in range(12)) - set(big["properties"]))


def test_ready_follows_health_and_the_time_moves_only_with_the_status() -> None:
    table = NodeDeviceTable()
    healthy = _device({"A": "1"})
    found: dict[str, NodeDevice | None] = {"d": healthy}

    def find(_table: Iterable[NodeDevice], _pool: str, device: str) -> NodeDevice | None:
        return found.get(device)

    status = cs.ClaimStatus(cast(AsyncClient, object()), node_name="n1", devices=table,
                            find=find)
    earlier = {"status": {"devices": [{
        "driver": "edgeplug.io", "pool": "p", "device": "d",
        "conditions": [{"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}}
    status.prepared("uid-1", "ns", "claim", [("p", "d")], earlier)
    (entry,) = status.entries("uid-1")
    assert entry["conditions"][0]["status"] == "True"
    assert entry["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    found["d"] = _device({"A": "1"}, Health.unhealthy("lens covered"))
    (entry,) = status.entries("uid-1")
    assert (entry["conditions"][0]["status"], entry["conditions"][0]["message"]) == (
        "False", "lens covered")
    assert entry["conditions"][0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    found["d"] = None
    (entry,) = status.entries("uid-1")
    assert entry["conditions"][0]["reason"] == cs.REASON_NOT_SERVED
    assert "data" not in entry


def test_a_device_shared_between_claims_is_named_with_its_share_id() -> None:
    """The API server refuses a status entry of a shared device without the allocation's
    shareID; a device allocated whole has none."""
    status = cs.ClaimStatus(cast(AsyncClient, object()), node_name="n1",
                            devices=NodeDeviceTable(), find=lambda _t, _p, _d: _device({}))
    status.prepared("uid-1", "ns", "claim", [("shared", "cam"), ("local", "lamp")],
                    shares={("shared", "cam"): "0b5d"})
    cam, lamp = status.entries("uid-1")
    assert (cam["device"], cam["shareID"]) == ("cam", "0b5d")
    assert "shareID" not in lamp


class _Client:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def patch(self, _resource: object, _name: str, body: dict[str, Any],
                    **_: object) -> None:
        self.bodies.append(body)


async def test_a_claim_is_written_once_per_change_never_unknown_before_its_first_write() -> None:
    client = _Client()
    found: dict[str, NodeDevice | None] = {"d": None}

    def find(_table: Iterable[NodeDevice], _pool: str, device: str) -> NodeDevice | None:
        return found.get(device)

    status = cs.ClaimStatus(cast(AsyncClient, client), node_name="n1",
                            devices=NodeDeviceTable(), find=find)
    status.prepared("uid-1", "ns", "claim", [("p", "d")])
    await status._write("uid-1")  # an agent just started: its device not served yet
    assert client.bodies == []
    found["d"] = _device({"A": "1"})
    await status._write("uid-1")
    await status._write("uid-1")  # nothing changed: nothing written
    assert len(client.bodies) == 1
    assert client.bodies[0]["status"]["devices"][0]["data"]["properties"] == {"A": "1"}
    found["d"] = None  # once written, a device gone is said so
    await status._write("uid-1")
    assert client.bodies[-1]["status"]["devices"][0]["conditions"][0]["status"] == "Unknown"
