"""One read of a process's Prometheus ``/metrics`` on loopback, as series → value.

The DRA tests and the allocation-mode benchmark read the agent's own
histograms (prepare, Allocate) the same way; one reader keeps them alike.
"""

from __future__ import annotations

import urllib.request

SCRAPE_TIMEOUT_S = 5


def scrape(port: int) -> dict[str, float]:
    """Every sample line of ``http://127.0.0.1:<port>/metrics`` (comments left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=SCRAPE_TIMEOUT_S) as response:
        text: str = response.read().decode()
    samples = (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
    return {series: float(value) for series, _, value in samples if series}
