"""Drive the umockdev test bed (``udev_testbed_helper.py``) from the project's Python.

Tests and the benchmark plug and unplug emulated USB radios while the handler
or the agent runs in another process under umockdev's preload library; this class starts the
helper with Debian's python3, hands out the environment those processes need, and turns each
operation into one request/reply with a deadline.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.aio_process import stop_popen

#: Debian's interpreter, where the UMockdev GObject binding is installed.
SYSTEM_PYTHON = "/usr/bin/python3"
PRELOAD = "libumockdev-preload.so.0"
HELPER = Path(__file__).with_name("udev_testbed_helper.py")
#: The bed stands for the kernel, which a busy machine does not starve: run it (and the
#: discovery it feeds) ahead of other work, so a hub's uevents come as one burst, as they do
#: from a kernel. Its uevent sockets hold only ``net.unix.max_dgram_qlen`` (10) messages, and
#: umockdev's sender exits when a reader lags further behind.
_PRIORITY = ["nice", "-n", "-5"] if os.geteuid() == 0 else []
#: The kernel queues uevents on a netlink socket by bytes (udev's monitors ask for 128 MiB);
#: umockdev's emulation sends them over Unix datagram sockets, which queue at most
#: ``net.unix.max_dgram_qlen`` messages (10 by default, read when the reader's socket is made),
#: and its sender aborts on the eleventh when the reader lags: a hub's 41 uevents then killed
#: the bed under load ("sendmsg failed: Resource temporarily unavailable", 1 full run in 6).
#: As root the bed raises the limit (never lowers it) before any reader exists.
UEVENT_QUEUE = 1024
QLEN_SYSCTL = Path("/proc/sys/net/unix/max_dgram_qlen")
#: One bed operation (a hub of ten radios included) answers well within this.
REPLY_DEADLINE_S = 30.0
#: How long the discovery process may take to exit on SIGTERM before it is killed.
STOP_GRACE_S = 10.0


class TestbedError(RuntimeError):
    """The helper failed an operation or stopped answering."""


def _room_for_a_burst() -> None:
    """Let a uevent socket queue as a kernel's would (see UEVENT_QUEUE); root only."""
    if os.geteuid() != 0:
        return
    if int(QLEN_SYSCTL.read_text()) < UEVENT_QUEUE:
        QLEN_SYSCTL.write_text(f"{UEVENT_QUEUE}\n")


class UmockdevBed:
    """A running umockdev test bed; use as a context manager."""

    __test__ = False  # not a pytest class

    def __init__(self) -> None:
        self.root = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> UmockdevBed:
        _room_for_a_burst()
        env = {k: v for k, v in os.environ.items() if k != "UMOCKDEV_DIR"}
        env["LD_PRELOAD"] = PRELOAD
        self._proc = subprocess.Popen(
            [*_PRIORITY, SYSTEM_PYTHON, str(HELPER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=sys.stderr, text=True, env=env)
        first = self._reply()
        if "error" in first:  # the helper could not load umockdev (it names the packages)
            self.__exit__()
            raise TestbedError(str(first["error"]))
        self.root = str(first["root"])
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to see this bed as its /sys and /dev."""
        return {"UMOCKDEV_DIR": self.root, "LD_PRELOAD": PRELOAD}

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        proc.stdin.flush()
        reply = self._reply()
        if "error" in reply:
            raise TestbedError(f"test bed {op} {args}: {reply['error']}")
        return reply

    def plug(self, port: str, tty: str, serial: str, **args: Any) -> dict[str, Any]:
        return self.call("plug", port=port, tty=tty, serial=serial, **args)

    def unplug(self, port: str) -> dict[str, Any]:
        return self.call("unplug", port=port)

    def renumber(self, port: str, tty: str) -> dict[str, Any]:
        return self.call("renumber", port=port, tty=tty)

    def hub(self, port: str, count: int, first_tty: int) -> dict[str, Any]:
        return self.call("hub", port=port, count=count, first_tty=first_tty)

    def odd_attribute(self, port: str, name: str, raw: bytes) -> dict[str, Any]:
        return self.call("odd_attribute", port=port, name=name, hex_bytes=raw.hex())

    def bulk(self, count: int) -> dict[str, Any]:
        return self.call("bulk", count=count)

    def _reply(self) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        deadline = time.monotonic() + REPLY_DEADLINE_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TestbedError(f"test bed gave no answer within {REPLY_DEADLINE_S}s")
            ready, _, _ = select.select([proc.stdout], [], [], remaining)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    raise TestbedError(f"test bed exited (status {proc.poll()})")
                reply: dict[str, Any] = json.loads(line)
                return reply


class DiscoveryProcess:
    """``python -m tests.harness.udev_runner`` under a bed: the handler's discovery, with each
    device list it yields read back as a dict (see ``udev_runner``)."""

    def __init__(self, bed: UmockdevBed, details: str,
                 extra_env: dict[str, str] | None = None) -> None:
        env = dict(os.environ)
        env.update(bed.env())
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [*_PRIORITY, sys.executable, "-m", "tests.harness.udev_runner", details], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
            cwd=Path(__file__).resolve().parents[2])
        self._lines: queue.Queue[str] = queue.Queue()
        self.skipped: list[dict[str, Any]] = []  # lines next_list() passed over
        threading.Thread(target=self._read, daemon=True, name="udev-runner-out").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # a thread: select() cannot see Python's read buffer
            self._lines.put(line)
        self._lines.put("")

    def __enter__(self) -> DiscoveryProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop_popen(self.proc, grace_s=STOP_GRACE_S)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def next_line(self, *, deadline_s: float = REPLY_DEADLINE_S) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=deadline_s)
        except queue.Empty:
            raise TestbedError(f"discovery printed nothing within {deadline_s}s") from None
        if not line:
            raise TestbedError(f"discovery exited (status {self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def poll_stats(self, check: Any, *, what: str, deadline_s: float = REPLY_DEADLINE_S
                   ) -> dict[str, Any]:
        """Ask for the counters until ``check(stats)`` holds; fail naming ``what``."""
        end = time.monotonic() + deadline_s
        while True:
            self.send("stats")
            while "cpu_s" not in (line := self.next_line(deadline_s=deadline_s)):
                pass
            if check(line):
                return line
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")

    def next_list(self, *, deadline_s: float = REPLY_DEADLINE_S) -> dict[str, Any]:
        """The next line that carries a device list."""
        while True:
            line = self.next_line(deadline_s=deadline_s)
            if "devices" in line:
                return line
            self.skipped.append(line)

    def line_with(self, key: str, *, deadline_s: float = REPLY_DEADLINE_S) -> dict[str, Any]:
        """The first line holding ``key``, among those skipped so far or still to come."""
        for line in self.skipped:
            if key in line:
                self.skipped.remove(line)
                return line
        while key not in (line := self.next_line(deadline_s=deadline_s)):
            pass
        return line

    def until(self, check: Any, *, what: str, deadline_s: float = REPLY_DEADLINE_S
              ) -> tuple[dict[str, Any], int]:
        """Read lists until ``check(devices)`` holds; returns that line and how many lists it
        took. Fails naming ``what`` at the deadline."""
        end = time.monotonic() + deadline_s
        lists = 0
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
            line = self.next_list(deadline_s=remaining)
            lists += 1
            if check(line["devices"]):
                return line, lists


def bare_enumeration(bed: UmockdevBed) -> dict[str, Any]:
    """A bare pyudev enumeration of the bed's tree in a process of its own, started as
    ``DiscoveryProcess`` starts the handler (``tests.harness.udev_floor``): the floor of the
    handler's first enumeration. ``{"seconds": ..., "devices": ...}``."""
    out = subprocess.run(
        [*_PRIORITY, sys.executable, "-m", "tests.harness.udev_floor"],
        env={**os.environ, **bed.env()}, capture_output=True, text=True, check=True,
        timeout=REPLY_DEADLINE_S * 4, cwd=Path(__file__).resolve().parents[2])
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
