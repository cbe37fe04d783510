"""Run the opcua handler once in a fresh process and print, as JSON, what its first list cost.

The benchmark measures the handler's time to its first complete list and the
memory of a process doing nothing else; importing the benchmark itself (lightkube, the agent)
would blur the memory figure. Usage: ``python -m tests.harness.opcua_runner URL TIMEOUT_S
INTERVAL_S STEADY_S``. asyncua is imported before the clock starts; its cost is printed apart.
With ``STEADY_S`` > 0 discovery keeps running that long after the first list and the CPU it
uses per second is printed too (the steady-state cost of checking every server each interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

MAX_CONCURRENT_CHECKS = 32


def _status_kib(field: str) -> int:
    rows = Path("/proc/self/status").read_text().splitlines()
    return int(next(r for r in rows if r.startswith(field)).split()[1])


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


async def _drain(stream: AsyncIterator[object]) -> None:
    async for _ in stream:
        pass


def main(argv: list[str]) -> None:
    url, timeout_s, interval_s, steady_arg = argv
    steady_s = float(steady_arg)
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

    async def first_list() -> tuple[float, int, int, float]:
        cpu = _cpu_s()
        began = time.perf_counter()
        stream = handler.discover(details)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            devices = await anext(stream)
            elapsed = time.perf_counter() - began
            cpu_ms = int((_cpu_s() - cpu) * 1000)
            steady = 0.0
            if steady_s > 0:  # keep discovery running; what does it cost per second?
                follow = asyncio.ensure_future(_drain(stream))
                cpu = _cpu_s()
                await asyncio.sleep(steady_s)  # a measuring window, not a synchronisation
                steady = (_cpu_s() - cpu) / steady_s
                follow.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follow
        return elapsed, len(devices), cpu_ms, steady

    elapsed, count, cpu_ms, steady = asyncio.run(first_list())
    print(json.dumps({"seconds": elapsed, "devices": count, "cpu_ms": cpu_ms,
                      "steady_cpu_per_s": steady,
                      "import_s": imported, "import_kib": after_import - before_import,
                      "rss_kib": _status_kib("VmRSS"), "hwm_kib": _status_kib("VmHWM"),
                      "base_kib": after_import}))


if __name__ == "__main__":
    main(sys.argv[1:])
