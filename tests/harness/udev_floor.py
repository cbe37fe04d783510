"""The udev benchmark's floor: a bare pyudev enumeration of the same umockdev tree.

The handler's first enumeration of 1,000 devices under five rules means little
on a shared machine without the time libudev itself takes to list that tree. Started like
``udev_runner`` (under the bed's preload library and ``UMOCKDEV_DIR``), this process lists every
device once with pyudev and reads each one's properties (what any rule needs to be checked),
then prints one JSON line: ``seconds`` and ``devices``. pyudev is imported before the clock
starts, as the handler's process imports it before its first scan.
"""

from __future__ import annotations

import json
import time

import pyudev


def main() -> None:
    started = time.perf_counter()
    context = pyudev.Context()
    count = 0
    for device in context.list_devices():
        dict(device.properties)
        count += 1
    print(json.dumps({"seconds": time.perf_counter() - started, "devices": count}), flush=True)


if __name__ == "__main__":
    main()
