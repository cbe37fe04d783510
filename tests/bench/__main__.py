"""``python -m tests.bench`` (or ``make bench``): run every benchmark and print its figures.

Speed and memory targets are met in benchmarks, never in pass/fail tests. Each
``tests/bench/bench_*.py`` module has a ``main(argv)`` that prints medians over several runs;
this runner finds them so one command runs them all (``python -m tests.bench NAME`` runs one).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import tests.bench


def main(argv: list[str]) -> int:
    """``NAME ...`` selects benchmarks (all without one); options from the first ``-...`` on
    go to each selected one (``python -m tests.bench faults --parts handoff``)."""
    first_option = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    wanted, options = set(argv[:first_option]), argv[first_option:]
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(tests.bench.__path__)
        if info.name.startswith("bench_")
    )
    for name in names:
        if wanted and name not in wanted and name.removeprefix("bench_") not in wanted:
            continue
        module = importlib.import_module(f"tests.bench.{name}")
        print(f"== {name}", flush=True)
        started = time.monotonic()
        module.main(options)
        print(f"== {name} done in {time.monotonic() - started:.0f} s\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
