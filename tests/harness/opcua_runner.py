"""Run the opcua handler once in a fresh process and print, as JSON, what its first list cost.

Why this exists: the benchmark measures the handler's time to its first complete list and the
memory of a process doing nothing else; importing the benchmark itself (lightkube, the agent)
would blur the memory figure. Usage: ``python -m tests.harness.opcua_runner URL TIMEOUT_S
INTERVAL_S``. asyncua is imported before the clock starts; its cost is printed apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import time
from pathlib import Path

MAX_CONCURRENT_CHECKS = 32


def _status_kib(field: str) -> int:
    rows = Path("/proc/self/status").read_text().splitlines()
    return int(next(r for r in rows if r.startswith(field)).split()[1])


def main(argv: list[str]) -> None:
    url, timeout_s, interval_s = argv
    before_import = _status_kib("VmRSS")
    started = time.perf_counter()
    import discovery_handlers.opcua.monitor  # noqa: F401  (asyncua: measured apart)
    from discovery_handlers.opcua import handler

    imported = time.perf_counter() - started
    after_import = _status_kib("VmRSS")
    details = handler.parse_details(
        f"opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{url}]\n"
        f"timeoutSeconds: {timeout_s}\ndiscoveryIntervalSeconds: {interval_s}\n"
        f"maxConcurrentChecks: {MAX_CONCURRENT_CHECKS}\n", {})

    async def first_list() -> tuple[float, int, int]:
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        stream = handler.discover(details)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            devices = await anext(stream)
            elapsed = time.perf_counter() - began
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
        return elapsed, len(devices), int(cpu_s * 1000)

    elapsed, count, cpu_ms = asyncio.run(first_list())
    print(json.dumps({"seconds": elapsed, "devices": count, "cpu_ms": cpu_ms,
                      "import_s": imported, "import_kib": after_import - before_import,
                      "rss_kib": _status_kib("VmRSS"), "hwm_kib": _status_kib("VmHWM"),
                      "base_kib": after_import}))


if __name__ == "__main__":
    main(sys.argv[1:])
