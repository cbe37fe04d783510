"""umockdev test bed, driven over stdin/stdout: emulated USB serial devices that come and go.

Hot-plug needs devices that appear and vanish with real uevents, and no USB
hardware exists here. umockdev (Debian's ``umockdev``, ``gir1.2-umockdev-1.0``) emulates sysfs,
/dev and the uevent sockets for every process that runs under its preload library with the same
``UMOCKDEV_DIR``; the handler under test reads it through the real libudev and pyudev. The
bed's GObject binding works from Debian's own python3 (``/usr/bin/python3``), not the project's
Python, so this script runs there (under ``libumockdev-preload.so.0`` too: umockdev checks
parents through it) and ``tests/harness/udev_testbed.py`` drives it. It stands for the kernel's
USB core and the ftdi_sio driver: the sysfs layout, attributes and uevents of an FTDI FT232R
behind a root hub (``/devices/pci0000:00/0000:00:14.0/usb1/1-N/1-N:1.0/ttyUSBk/tty/ttyUSBk``).

Protocol: one JSON object per line in, one per line out. First line out: ``{"root": dir}``.
Ops: ``plug`` (port, tty, serial, [vendor, product, hub]) → ``{"paths": [...], "t": monotonic,
"stamps": [when each uevent went out]}``;
``unplug`` (port) and ``renumber`` (port, tty) likewise; ``hub`` (port, count, first_tty)
plugs a hub with ``count`` radios at once; ``odd_attribute`` (port, name, hex_bytes) writes raw
bytes into a USB attribute; ``bulk`` (count) adds plain serial ports.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

#: What the bed needs from Debian (.ci/apt/udev.txt, which `make install` installs).
PACKAGES = "umockdev gir1.2-umockdev-1.0 python3-gi"

try:
    import gi

    gi.require_version("UMockdev", "1.0")
    from gi.repository import UMockdev
except (ImportError, ValueError) as missing:
    # The first line out is an error the driver raises, naming what to install.
    print(json.dumps({"error": f"umockdev's GObject binding is not usable from {sys.executable}"
                      f" ({missing}): install the Debian packages {PACKAGES}"
                      " (.ci/apt/udev.txt; `make install` installs them)"}), flush=True)
    sys.exit(1)

ROOT_HUB = "/sys/devices/pci0000:00/0000:00:14.0/usb1"
FTDI = ("0403", "6001")
TTY_MAJOR = 188


class Bed:
    def __init__(self) -> None:
        self.tb = UMockdev.Testbed.new()
        pci = self.tb.add_device("pci", "pci0000:00/0000:00:14.0", None,
                                 ["vendor", "0x8086", "device", "0xa36d", "numa_node", "0"], [])
        self.root_hub = self.tb.add_device(
            "usb", "usb1", pci, ["idVendor", "1d6b", "idProduct", "0002", "busnum", "1",
                                 "devnum", "1"],
            ["DEVTYPE", "usb_device", "DEVNAME", "/dev/bus/usb/001/001"])
        self.ports: dict[str, list[str]] = {}  # port → sysfs paths added, parents first
        self.ids: dict[str, tuple[str, str, str]] = {}  # port → (serial, vendor, product)
        self.devnum = 1
        #: When each uevent of the current op went out (the test compares the gaps between
        #: them with the handler's debounce: a gap the bed itself made may split a burst).
        self.stamps: list[float] = []

    def add_device(self, *args: Any) -> str:
        """The test bed's add_device (which sends the "add" uevent), stamped."""
        path: str = self.tb.add_device(*args)
        self.stamps.append(time.monotonic())
        return path

    def plug(self, port: str, tty: str, serial: str, vendor: str = FTDI[0],
             product: str = FTDI[1], hub: str | None = None) -> list[str]:
        parent = self.ports[hub][0] if hub else self.root_hub
        self.devnum += 1
        usb = self.add_device(
            "usb", port, parent,
            ["idVendor", vendor, "idProduct", product, "serial", serial, "busnum", "1",
             "devnum", str(self.devnum), "manufacturer", "FTDI", "product", "FT232R USB UART"],
            ["DEVTYPE", "usb_device", "DEVNAME", f"/dev/bus/usb/001/{self.devnum:03d}",
             "ID_VENDOR_ID", vendor, "ID_MODEL_ID", product, "ID_SERIAL_SHORT", serial])
        intf = self.add_device("usb", f"{port}:1.0", usb,
                                  ["bInterfaceNumber", "00", "bInterfaceClass", "ff"],
                                  ["DEVTYPE", "usb_interface", "INTERFACE", "255/255/255"])
        self.ports[port] = [usb, intf, *self._add_tty(intf, tty, serial, vendor, product)]
        self.ids[port] = (serial, vendor, product)
        return self.ports[port]

    def _add_tty(self, intf: str, tty: str, serial: str, vendor: str, product: str) -> list[str]:
        minor = int("".join(c for c in tty if c.isdigit()) or "0")
        port_dev = self.add_device("usb-serial", tty, intf, ["port_number", "0"], [])
        link = f"/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_{serial}-if00-port0"
        node = self.add_device(
            "tty", f"tty/{tty}", port_dev, ["dev", f"{TTY_MAJOR}:{minor}"],
            ["DEVNAME", f"/dev/{tty}", "MAJOR", str(TTY_MAJOR), "MINOR", str(minor),
             "DEVLINKS", link, "ID_VENDOR_ID", vendor, "ID_MODEL_ID", product,
             "ID_SERIAL_SHORT", serial])
        return [port_dev, node]

    def unplug(self, port: str) -> list[str]:
        paths = self.ports.pop(port)
        below = paths[0] + "/"
        for child in [p for p, added in self.ports.items() if added[0].startswith(below)]:
            paths = [*self.ports.pop(child), *paths]  # a hub's radios go with it
        self._remove(paths)
        return paths

    def _remove(self, paths: list[str]) -> None:
        for path in sorted(paths, key=len, reverse=True):  # children first, as the kernel does
            self.tb.uevent(path, "remove")
            self.stamps.append(time.monotonic())
            self.tb.remove_device(path)

    def renumber(self, port: str, tty: str) -> list[str]:
        """The tty comes back under a new name on the same port (akri#734)."""
        usb, intf, *old = self.ports[port]
        self._remove(old)
        serial, vendor, product = self.ids[port]
        self.ports[port] = [usb, intf, *self._add_tty(intf, tty, serial, vendor, product)]
        return self.ports[port]

    def hub(self, port: str, count: int, first_tty: int) -> list[str]:
        self.devnum += 1
        hub = self.add_device(
            "usb", port, self.root_hub, ["idVendor", "05e3", "idProduct", "0608",
                                         "bDeviceClass", "09"],
            ["DEVTYPE", "usb_device", "DEVNAME", f"/dev/bus/usb/001/{self.devnum:03d}"])
        self.ports[port] = [hub]
        added = [hub]
        for index in range(count):
            added += self.plug(f"{port}.{index + 1}", f"ttyUSB{first_tty + index}",
                               f"HUB{index:04d}", hub=port)
        return added

    def odd_attribute(self, port: str, name: str, hex_bytes: str) -> list[str]:
        """Give the port's USB device an attribute of arbitrary bytes, and say so (change)."""
        usb = self.ports[port][0]
        self.tb.set_attribute_binary(usb, name, bytes.fromhex(hex_bytes))
        self.tb.uevent(usb, "change")
        self.stamps.append(time.monotonic())
        return [usb]

    def bulk(self, count: int) -> list[str]:
        """``count`` plain serial ports (a console server), each its own device node."""
        parent = self.add_device("platform", "serial8250", None, [], [])
        paths = []
        for index in range(count):
            paths.append(self.add_device(
                "tty", f"tty/ttyS{index}", parent, ["dev", f"4:{64 + index}", "type", "4"],
                ["DEVNAME", f"/dev/ttyS{index}", "MAJOR", "4", "MINOR", str(64 + index)]))
        return paths


def main() -> None:
    bed = Bed()
    print(json.dumps({"root": bed.tb.get_root_dir()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request: dict[str, Any] = json.loads(line)
        op = request.pop("op")
        bed.stamps = []
        try:
            paths = getattr(bed, op)(**request)
            reply: dict[str, Any] = {"paths": paths, "t": time.monotonic(), "stamps": bed.stamps}
        except Exception as exc:  # report, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
