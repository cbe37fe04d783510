"""A process's CPU time in nanoseconds, thread by thread, for the benchmarks' CPU figures.

``/proc/<pid>/stat``'s utime and stime count 10 ms clock ticks, so an idle
agent that spends a few milliseconds a minute reads 0, 0.03 or 0.06 s per minute over a 20 s
window by chance of where the ticks fall, and a target such as "idle CPU ≤ 0.04 s per minute"
cannot be judged. The scheduler's own count in ``/proc/<pid>/task/<tid>/schedstat`` is in
nanoseconds. Every benchmark that reads a process's CPU over a window uses these two
functions (lifetime totals, which must count ended threads, stay in clock ticks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Per thread of ``pid`` (its id): the nanoseconds it has run on a CPU so far, the first
    field of ``/proc/<pid>/task/<tid>/schedstat`` (brought up to date whenever the thread
    leaves a CPU and at each scheduler tick while it runs). ``/proc/<pid>/schedstat`` alone is
    the main thread's; gRPC and executor threads run beside it, so every thread is read. A
    thread that ends before its line is read is left out."""
    found: dict[int, int] = {}
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            with open(f"{task.path}/schedstat", encoding="ascii") as schedstat:
                found[int(task.name)] = int(schedstat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between the listing and the read
    return found


def cpu_seconds_between(earlier: Mapping[int, int], later: Mapping[int, int]) -> float:
    """CPU seconds the threads alive at ``later`` spent since ``earlier``, taken thread by
    thread: a thread id not in ``earlier``, or one whose count went down (a reused id), is a
    new thread and counts whole. A thread that ended in between is not counted from
    ``earlier`` to its end (the kernel keeps that only in the clock-tick totals), so such a
    window reads low by at most what it spent; a difference of two sums could fall below 0."""
    spent = 0
    for tid, ns in later.items():
        before = earlier.get(tid, 0)
        spent += ns - before if ns >= before else ns
    return spent / 1e9
