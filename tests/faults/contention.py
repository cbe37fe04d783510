"""A loaded machine for the fault suite: one busy process per core while a scenario runs.

The slot guarantees must hold on a node whose cores are busy with brokers
(video pipelines, PLC pollers), not only on an idle test machine; an admission race once
showed only under load. ``CpuHog`` starts one spinning process per core at the default
priority (nice 0, as a broker would run), each ending by itself after ``HOG_LIMIT_S`` so a test
killed hard cannot leave them behind, and stops them all when the scenario ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

#: No hog outlives this, whatever happens to the test that started it.
HOG_LIMIT_S = 600
_SPIN = (
    "import time\n"
    "end = time.monotonic() + {limit}\n"
    "while time.monotonic() < end:\n"
    "    sum(range(1000))\n"
)


@dataclass
class CpuHog:
    """One spinning process per core (``os.cpu_count()``) while entered."""

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> CpuHog:
        code = _SPIN.format(limit=HOG_LIMIT_S)
        self._procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.cores)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs = []

    @property
    def running(self) -> int:
        return sum(1 for p in self._procs if p.poll() is None)
