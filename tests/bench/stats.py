"""Summaries for benchmark samples, written with a noisy 2-core machine in mind.

Every benchmark reports the same way (median, p95, p99, spread over several runs), so figures in
README.md can be compared run to run.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; ``fraction`` in [0, 1]."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(label: str, samples: Sequence[float], unit: str = "ms", scale: float = 1000.0) -> str:
    """One line: median, p95, p99, min, max and the sample count."""
    scaled = [value * scale for value in samples]
    return (
        f"{label}: median {statistics.median(scaled):.2f} {unit}, "
        f"p95 {percentile(scaled, 0.95):.2f}, p99 {percentile(scaled, 0.99):.2f}, "
        f"min {min(scaled):.2f}, max {max(scaled):.2f} (n={len(scaled)})"
    )


#: Iterations of the fixed pure-Python loop that shows the machine's speed beside the figures.
CALIBRATION_LOOPS = 2_000_000
CALIBRATION_RUNS = 3


def machine_speed(loops: int = CALIBRATION_LOOPS) -> float:
    """Seconds for a fixed pure-Python loop: the machine's speed, beside the figures."""
    started = time.perf_counter()
    total = 0
    for value in range(loops):
        total += value & 7
    return time.perf_counter() - started


def machine_speed_line() -> str:
    """The line every benchmark prints so its figures can be compared across machines: CPUs,
    load average, and the time of a fixed pure-Python loop."""
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    seconds = statistics.median(machine_speed() for _ in range(CALIBRATION_RUNS))
    return (f"machine: {os.cpu_count()} CPUs, load {load} (1, 5, 15 min); speed loop "
            f"{CALIBRATION_LOOPS:,} iterations in {seconds * 1000:.0f} ms "
            f"(median of {CALIBRATION_RUNS})")


def floor_ratio_line(what: str, ours: Sequence[float], floor: Sequence[float],
                     unit: str = "s", scale: float = 1.0) -> str:
    """The floor measured in the same run beside our figure, and their ratio: on a shared
    machine the ratio says how much of the figure is ours (median over median)."""
    ours_median = statistics.median(ours) * scale
    floor_median = statistics.median(floor) * scale
    return (f"   floor ({what}): median {floor_median:.3f} {unit} (n={len(floor)}); "
            f"ours {ours_median:.3f} {unit} → ratio ours/floor {ours_median / floor_median:.1f}x")
