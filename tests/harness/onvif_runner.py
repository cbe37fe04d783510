"""Run the ONVIF handler's discovery for several Configurations and print every device list.

Multicast discovery must run inside the test's own network namespace, which
means another process (``ip netns exec``). This is that process: it parses each named
Configuration's details and properties with the real handler, runs ``discover`` for all of them
at once, and prints one JSON line per yielded list (``config``, ``t`` on the system-wide
monotonic clock, ``devices``, ``rss_kib``). Logs go to stderr so tests can check what they say.

``python -m tests.harness.onvif_runner CONFIGS.json`` where the file maps a name to
``{"details": "<yaml>", "properties": {"name": "text" | {"secret": "text"}}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

from discovery_handlers.contract import Device, PropertyValue, Secret
from discovery_handlers.onvif import handler


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def properties_of(raw: dict[str, Any]) -> dict[str, PropertyValue]:
    return {
        name: Secret(value["secret"].encode()) if isinstance(value, dict) else str(value)
        for name, value in raw.items()
    }


def device_json(device: Device) -> dict[str, Any]:
    return {
        "id": device.id,
        "properties": dict(device.properties),
        "healthy": device.health.healthy,
        "reason": device.health.reason,
        "warning": device.warning,
    }


async def run_one(name: str, spec: dict[str, Any]) -> None:
    details = handler.parse_details(spec["details"], properties_of(spec.get("properties", {})))
    async for devices in handler.discover(details):
        line = {
            "config": name,
            "t": time.monotonic(),
            "devices": [device_json(d) for d in devices],
            "rss_kib": rss_kib(),
        }
        print(json.dumps(line), flush=True)


async def main(configs: dict[str, Any]) -> None:
    # the SOAP side's import (onvif-zeep-async, ~1 s) is paid once per process; keep it out of
    # the timings that follow "started"
    import discovery_handlers.onvif.scanner  # noqa: F401

    print(json.dumps({"started": time.monotonic(), "rss_kib": rss_kib()}), flush=True)
    await asyncio.gather(*(run_one(name, spec) for name, spec in configs.items()))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with open(sys.argv[1], encoding="utf-8") as handle:
        asyncio.run(main(json.load(handle)))
