"""The fleet benchmark's readings of a process (tests/harness/fleet.py) on real sockets.

``bench_fleet`` reports the bytes each agent received from the API server
from ``ss``'s per-socket counters and its CPU and memory from ``/proc``; a change in either
format would silently read as 0. These read this test's own process.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from tests.harness.fleet import ProcessReading, received_from_port

PAYLOAD = 200_000
#: CPU seconds a thread spends before a reading (a few scheduler ticks: the count of a running
#: thread is brought up to date at each).
THREAD_CPU_S = 0.05
ENDED_DEADLINE_S = 10.0


def test_bytes_received_on_a_loopback_connection_count_for_its_process() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            peer, _ = server.accept()
            with peer:
                before = received_from_port(port).get(os.getpid(), 0)
                sender = threading.Thread(target=peer.sendall, args=(b"x" * PAYLOAD,))
                sender.start()
                got = 0
                while got < PAYLOAD:
                    got += len(client.recv(65536))
                sender.join()
                after = received_from_port(port).get(os.getpid(), 0)
    assert after - before == PAYLOAD


def test_a_reading_shows_cpu_spent_and_resident_memory() -> None:
    first = ProcessReading.of(os.getpid(), {})
    started = time.thread_time()
    while time.thread_time() - started < THREAD_CPU_S:
        sum(range(10_000))
    second = ProcessReading.of(os.getpid(), {os.getpid(): 123})
    assert second.cpu_per_minute(first) > 0
    assert second.rss_kib > 1024
    assert second.received == 123


def test_the_cpu_of_every_thread_counts_and_an_ended_thread_takes_none_away() -> None:
    """A thread beside the main one spends CPU and waits: the reading counts it; once it has
    ended the next window's CPU is not negative and says a thread ended."""
    spent, done = threading.Event(), threading.Event()

    def spin() -> None:
        while time.thread_time() < THREAD_CPU_S:
            sum(range(10_000))
        spent.set()
        done.wait()

    first = ProcessReading.of(os.getpid(), {})
    worker = threading.Thread(target=spin)
    worker.start()
    assert spent.wait(timeout=60)
    second = ProcessReading.of(os.getpid(), {})
    done.set()
    worker.join()
    # join returns once Python has let go of the thread, a moment before the kernel's task ends
    task = Path(f"/proc/{os.getpid()}/task/{worker.native_id}")
    deadline = time.monotonic() + ENDED_DEADLINE_S
    while task.exists():
        assert time.monotonic() < deadline, f"{task} still there"
        time.sleep(0.001)  # polling for the task's end
    third = ProcessReading.of(os.getpid(), {})
    assert second.cpu_since(first) >= THREAD_CPU_S
    assert third.cpu_since(second) >= 0
    assert third.ended_since(second) == 1
