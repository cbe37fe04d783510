"""Summarise a ``py-spy record --format raw`` profile: the functions with the most samples.

docs/benchmarks.md ("Where the agent's time goes") quotes where the agent spends its CPU on each
change path; ``python -m tests.bench.profile_summary FILE [TOP] [--under SUBSTRING]`` prints,
for the samples whose stack holds SUBSTRING (all without it), the share of samples each function
is on the stack of (inclusive) and at the top of (self), with the milliseconds that share is at
the sampling rate (``--rate``, 250 Hz in bench_agent_changes).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

RATE_HZ = 250


def summarise(path: Path, top: int, under: str | None) -> list[str]:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or (under and under not in stack):
            continue
        frames = [f.split(" (")[0] + " " + f[f.find("("):] for f in stack.split(";")]
        total += int(count)
        leaf[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    ms = 1000 / RATE_HZ
    lines = [f"{path.name}: {total} samples ({total * ms:.0f} ms of CPU at {RATE_HZ} Hz)"
             + (f" under {under!r}" if under else "")]
    for title, counter in (("inclusive", inclusive), ("self", leaf)):
        lines.append(f"-- {title}")
        lines += [f"{100 * n / max(total, 1):5.1f}% {n * ms:8.0f} ms  {frame[:140]}"
                  for frame, n in counter.most_common(top)]
    return lines


def main(argv: list[str]) -> None:
    under = None
    if "--under" in argv:
        index = argv.index("--under")
        under = argv[index + 1]
        del argv[index:index + 2]
    top = int(argv[1]) if len(argv) > 1 else 25
    print("\n".join(summarise(Path(argv[0]), top, under)))


if __name__ == "__main__":
    main(sys.argv[1:])
