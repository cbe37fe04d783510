"""The fleet benchmark's readings of a process (tests/harness/fleet.py) on real sockets.

Why this exists: ``bench_fleet`` reports the bytes each agent received from the API server
from ``ss``'s per-socket counters and its CPU and memory from ``/proc``; a change in either
format would silently read as 0. These read this test's own process.
"""

from __future__ import annotations

import os
import socket
import threading

from tests.harness.fleet import ProcessReading, received_from_port

PAYLOAD = 200_000
#: Bound on the CPU-spending loop (about 10 s of work; 0.05 s of CPU is enough).
SPIN_ROUNDS = 50_000


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
    for _ in range(SPIN_ROUNDS):  # spend CPU until the kernel's clock ticks count some
        sum(range(10_000))
        if ProcessReading.of(os.getpid(), {}).cpu_s - first.cpu_s >= 0.05:
            break
    second = ProcessReading.of(os.getpid(), {os.getpid(): 123})
    assert second.cpu_per_minute(first) > 0
    assert second.rss_kib > 1024
    assert second.received == 123
