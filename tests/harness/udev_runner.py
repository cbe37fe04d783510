"""Run the udev handler's discovery in this process and print each device list as JSON.

Under umockdev the handler must run in a process started with the bed's
preload library and ``UMOCKDEV_DIR``, so tests start this module as that process
(``python -m tests.harness.udev_runner DETAILS_YAML``) and read its lines:
``{"t": monotonic seconds, "devices": [...], "reopens": n, "full_scans": n}``. A line
``break-monitor`` on stdin shuts the watcher's uevent socket down (a real socket failure, seen
through the real libudev); ``scan-stress N`` runs N full enumerations back to back and prints
``{"scans": N, "errors": [...]}``; ``stats`` prints the counters, CPU seconds and memory. When
discovery fails, the last line is ``{"failed": message}`` and the exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from discovery_handlers.contract import Device
from discovery_handlers.udev import handler, udevlib
from discovery_handlers.udev.watch import Watcher


def device_json(device: Device) -> dict[str, Any]:
    return {
        "id": device.id,
        "properties": dict(device.properties),
        "device_specs": [[s.host_path, s.container_path, s.permissions]
                         for s in device.device_specs],
        "healthy": device.health.healthy,
    }


def memory_kib() -> dict[str, int]:
    """This process's resident memory now and at its peak (``getrusage``'s peak is not used:
    Linux carries it over from the parent across fork and exec)."""
    status = Path("/proc/self/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]), "hwm_kib": int(fields["VmHWM"].split()[0])}


def emit(watcher: Watcher, **fields: Any) -> None:
    line = {"t": time.monotonic(), "reopens": watcher.reopens,
            "full_scans": watcher.full_scans, "events": watcher.events_handled,
            "scan_s": watcher.last_scan_s,
            **memory_kib(), **fields}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def on_command(watcher: Watcher) -> None:
    line = sys.stdin.readline()
    command = line.strip()
    if not line:
        asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
    elif command == "break-monitor" and watcher.monitor is not None:
        sock = socket.socket(fileno=os.dup(watcher.monitor.socket_fds()[0]))
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        emit(watcher, broke=True)
    elif command.startswith("scan-stress "):
        asyncio.get_running_loop().create_task(scan_stress(watcher, int(command.split()[1])))
    elif command == "stats":
        times = os.times()
        emit(watcher, cpu_s=times.user + times.system)


async def scan_stress(watcher: Watcher, count: int) -> None:
    """Full enumerations back to back (while the test unplugs devices under them)."""
    context = udevlib.new_context()
    errors: list[str] = []
    for _ in range(count):
        try:
            await asyncio.to_thread(udevlib.enumerate_matches, context, watcher.details.rules)
        except Exception as exc:  # reported to the test, which fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
    emit(watcher, scans=count, errors=errors)


class OneMonitorOnly:
    """A monitor factory whose second call fails, as opening a netlink socket does when the
    process is out of descriptors or memory (``UDEV_RUNNER_ONE_MONITOR=1``)."""

    def __init__(self) -> None:
        self.opened = 0

    def __call__(self, context: Any) -> udevlib.Monitor:
        self.opened += 1
        if self.opened > 1:
            raise OSError(24, "Too many open files")
        return udevlib.Monitor(context)


async def main(details_text: str) -> None:
    details = handler.parse_details(details_text, {})
    if os.environ.get("UDEV_RUNNER_ONE_MONITOR") == "1":
        watcher = Watcher(details, monitor_factory=OneMonitorOnly())
    else:
        watcher = Watcher(details)
    asyncio.get_running_loop().add_reader(sys.stdin.fileno(), on_command, watcher)
    async for devices in watcher.changes():
        emit(watcher, devices=[device_json(d) for d in devices])


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1]))
    except Exception as exc:  # what the agent would put on the Configuration
        sys.stdout.write(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}) + "\n")
        sys.exit(1)
