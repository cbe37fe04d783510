"""The node-device table: one record per served Instance, holding the handler's device.

Re-publishing an unchanged device list must not wake the device-plugin side (it re-reconciles
every plugin on each table change), so records built twice from the same device, handler and
details compare equal, hooks included.
"""

from __future__ import annotations

from dataclasses import replace

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from discovery_handlers.contract import Device, Health
from tests.harness.echo_handlers import ExtendedEcho


def _record(handler: ExtendedEcho, description: str = "d0") -> NodeDevice:
    details = handler.parse_details("descriptions: [d0]", {})
    return NodeDevice(
        instance="echo-abc123", namespace="ns", configuration="echo",
        device=Device(id=description, properties={"P": "1"}), broker_properties={"B": "2"},
        handler=handler, details=details,
    )


async def test_an_equal_record_with_hooks_does_not_bump_the_version() -> None:
    table, handler = NodeDeviceTable(), ExtendedEcho()
    await table.put(_record(handler))
    version = table.version
    await table.put(_record(handler))
    assert table.version == version
    assert _record(handler).needs_prepare  # the handler has prepare: PreStartContainer asked
    assert _record(handler).properties == {"P": "1", "B": "2"}


async def test_a_changed_device_or_health_bumps_it() -> None:
    table, handler = NodeDeviceTable(), ExtendedEcho()
    await table.put(_record(handler))
    version = table.version
    await table.put(_record(handler, "d1"))
    assert table.version == version + 1
    await table.put(replace(_record(handler, "d1"), health=Health.unhealthy("fault")))
    assert table.version == version + 2
    assert not table.get("ns", "echo-abc123").healthy  # type: ignore[union-attr]
