"""udev handler figures: hot-plug → Instance → allocatable, enumeration of 1,000 devices, idle CPU.

The udev handler's targets (hot-plug → Instance in ≤ 300 ms median where Akri
re-enumerates every 10 s; enumeration and memory at 1,000 devices; ~0 CPU while idle, since
nothing polls) are met here, never in pass/fail tests. Devices come from the umockdev test bed
(tests/harness/udev_testbed_helper.py); the agent runs as ``python -m agent.main`` under
umockdev's preload library against a real control plane and the node emulator; discovery alone
runs in ``tests.harness.udev_runner``. Prints median/p95 and the machine's speed. Asserts nothing.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import yaml

from crds.naming import instance_name, instance_resource_name
from discovery_handlers.udev.watch import DEBOUNCE_QUIET_S
from tests.bench.bench_agent_setup import bench_node, quiet_logs
from tests.bench.stats import floor_ratio_line, machine_speed_line, summary
from tests.harness.agent_process import apply
from tests.harness.controlplane import ControlPlane
from tests.harness.udev_testbed import DiscoveryProcess, UmockdevBed, bare_enumeration

PLUG_RUNS = 20
HANDLER_PLUG_RUNS = 20
SCALE_DEVICES = 1000
SCALE_RUNS = 3
IDLE_WINDOW_S = 10.0  # a measuring window for idle CPU, not a wait for a condition
PORT_ID = "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0"
RADIO = "usb: {vendor: '0403', product: '6001'}"
#: Five rules over a console server's 1,000 ports: two select all, three select none.
FIVE_RULES = yaml.safe_dump({"udevRules": [
    'SUBSYSTEM=="tty", KERNEL=="ttyS*"',
    'KERNEL=="ttyS[0-9]*", ATTR{type}=="4"',
    'SUBSYSTEM=="tty", ATTRS{idVendor}=="0403"',
    'SUBSYSTEM=="video4linux"',
    'ENV{ID_SERIAL}=="nothing*"',
]})


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


async def bench_agent_hotplug(plane: ControlPlane) -> None:
    """Plug → Instance seen by a watch → allocatable on the Node, through the whole agent (with
    1,000 other devices on the node), and the agent's memory after the runs."""
    with UmockdevBed() as bed:
        bed.bulk(SCALE_DEVICES)  # a console server's ports beside the radio: not selected
        async with bench_node(plane, label="udev", env=bed.env()) as node:
            state = node.state
            name = instance_name("radio", PORT_ID, shared=False, node=node.name)
            resource = instance_resource_name(name)
            apply(plane, node.namespace, {
                "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
                "metadata": {"name": "radio"},
                "spec": {"discoveryHandler": {"name": "udev", "discoveryDetails": RADIO},
                         "capacity": 1}})
            to_instance, to_allocatable = [], []
            for run in range(PLUG_RUNS):
                started = time.monotonic()
                bed.plug("1-1", "ttyUSB0", "A50285BI")
                seen = asyncio.create_task(state.until(lambda: name in state.instances,
                                                       what=f"run {run}: Instance {name}"))
                ready = await state.until(lambda: state.allocatable.get(resource) == "1",
                                          what=f"run {run}: {resource}=1")
                to_instance.append(await seen - started)
                to_allocatable.append(ready - started)
                bed.unplug("1-1")
                await state.until(lambda: name not in state.instances,
                                  what=f"run {run}: Instance gone")
                await state.until(lambda: state.allocatable.get(resource, "0") == "0",
                                  what=f"run {run}: {resource} no longer allocatable")
            print(summary("  plug → Instance exists (watch) [target median ≤ 300 ms]",
                          to_instance))
            print(summary("  plug → allocatable on the Node (watch)", to_allocatable))
            print(f"  agent with {SCALE_DEVICES + 1} devices on the node: "
                  f"{_status_kib(node.pid, 'VmRSS') / 1024:.1f} MiB resident, "
                  f"peak {_status_kib(node.pid, 'VmHWM') / 1024:.1f} MiB")


def bench_handler_hotplug() -> None:
    """The handler alone: the helper's uevent sent → the runner's new list printed."""
    latencies = []
    with UmockdevBed() as bed, DiscoveryProcess(bed, RADIO) as discovery:
        discovery.next_list()
        for _ in range(HANDLER_PLUG_RUNS):
            plugged = bed.plug("1-1", "ttyUSB0", "A50285BI")
            line, _ = discovery.until(lambda ds: len(ds) == 1, what="the radio")
            latencies.append(line["t"] - plugged["t"])
            bed.unplug("1-1")
            discovery.until(lambda ds: ds == [], what="the radio gone")
    quiet_ms = DEBOUNCE_QUIET_S * 1000
    print(summary(f"  handler: last uevent sent → new list ({quiet_ms:.0f} ms quiet window "
                  "included)", latencies))


def bench_scale(runs: int = SCALE_RUNS) -> None:
    """1,000 devices, 5 rules: first enumeration (beside a bare pyudev enumeration of the same
    tree, its floor), discovery's memory, CPU while idle."""
    scans, rss, rss_empty, idle_cpu, floors = [], [], [], [], []
    for _ in range(runs):
        with UmockdevBed() as bed:
            with DiscoveryProcess(bed, FIVE_RULES) as empty:
                rss_empty.append(empty.next_list()["hwm_kib"] / 1024)
            bed.bulk(SCALE_DEVICES)
            with DiscoveryProcess(bed, FIVE_RULES) as discovery:
                first = discovery.next_list(deadline_s=120)
                found = len(first["devices"])
                scans.append(first["scan_s"])
                rss.append(first["hwm_kib"] / 1024)
                before = discovery.poll_stats(lambda s: True, what="stats")
                window_end = time.monotonic() + IDLE_WINDOW_S
                while (left := window_end - time.monotonic()) > 0:
                    time.sleep(min(left, 1.0))  # a measuring window, not a synchronisation
                after = discovery.poll_stats(lambda s: True, what="stats")
                idle_cpu.append((after["cpu_s"] - before["cpu_s"]) / IDLE_WINDOW_S)
            floors.append(bare_enumeration(bed))
    print(f"  {SCALE_DEVICES} devices, 5 rules ({found} matched):")
    print(summary("    first enumeration", scans))
    print(floor_ratio_line(f"a bare pyudev enumeration of the same tree, "
                           f"{floors[0]['devices']} devices with their properties read",
                           scans, [f["seconds"] for f in floors], unit="ms", scale=1000.0))
    print(f"    discovery process peak RSS (VmHWM): median {statistics.median(rss):.1f} MiB "
          f"(same process, empty bed: {statistics.median(rss_empty):.1f} MiB)")
    print(f"    CPU while idle: median {statistics.median(idle_cpu) * 100:.3f} % of one core "
          f"over {IDLE_WINDOW_S:.0f} s windows (n={len(idle_cpu)})")


async def _bench_with_plane() -> None:
    with ControlPlane() as plane:
        await bench_agent_hotplug(plane)


def main(argv: list[str]) -> None:
    """``--scale-only [--runs N]``: the 1,000-device enumeration alone (no control plane)."""
    quiet_logs()
    print(machine_speed_line())
    if "--scale-only" in argv:
        bench_scale(int(argv[argv.index("--runs") + 1]) if "--runs" in argv else SCALE_RUNS)
        return
    bench_handler_hotplug()
    bench_scale()
    asyncio.run(_bench_with_plane())


if __name__ == "__main__":
    main(sys.argv[1:])
