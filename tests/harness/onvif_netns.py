"""A private network of network namespaces for ONVIF tests: real multicast, nothing leaves.

WS-Discovery is multicast, and loopback does not show whether Probes, Hellos
and Byes really cross a link. This builds, from namespaces of its own making:

- ``<p>-br``: a bridge ``br0`` (the LAN segment 10.77.1.0/24, fd77:1::/64);
- ``<p>-h``: the handler's side, ``10.77.1.1`` / ``fd77:1::1`` on the bridge, and a route to
  10.77.2.0/24 through the router;
- camera namespaces on the bridge (``add_camera_ns``), each with its own addresses;
- ``<p>-r``: a router between the bridge and ``<p>-far`` (10.77.2.0/24): unicast crosses it,
  multicast does not (no multicast routing), as on a real routed network.

Every address is private and lives only inside these namespaces; the host's own interfaces are
never touched. ``close`` deletes every namespace (and with them every veth and the bridge).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.aio_process import terminate
from tests.harness.kube_waits import WAIT_S

REPO = Path(__file__).resolve().parents[2]
LAN_V4 = "10.77.1"
LAN_V6 = "fd77:1::"
FAR_V4 = "10.77.2"
HANDLER_V4 = f"{LAN_V4}.1"
#: How long a process in the camera network may take to exit on SIGTERM before it is killed.
STOP_GRACE_S = 10.0
ROUTER_V4 = f"{LAN_V4}.254"
LINE_LIMIT_BYTES = 64 * 1024 * 1024  # one printed device list of hundreds of cameras


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def in_ns(ns: str, *args: str) -> None:
    ip("netns", "exec", ns, *args)


@dataclass
class NetnsBed:
    prefix: str = field(default_factory=lambda: f"eponv{uuid_module.uuid4().hex[:6]}")
    namespaces: list[str] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="onvif-bed-")))
    _veths: int = 0

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    @property
    def handler_ns(self) -> str:
        return f"{self.prefix}-h"

    @property
    def far_ns(self) -> str:
        return f"{self.prefix}-far"

    def _ns(self, name: str) -> str:
        ip("netns", "add", name)
        self.namespaces.append(name)
        in_ns(name, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0")
        in_ns(name, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
        in_ns(name, "ip", "link", "set", "lo", "up")
        return name

    def _veth(self, ns: str, name: str, addresses: list[str], *, peer_ns: str) -> None:
        self._veths += 1
        peer = f"p{self._veths}"
        ip("link", "add", name, "netns", ns, "type", "veth", "peer", "name", peer, "netns", peer_ns)
        for address in addresses:
            in_ns(ns, "ip", "addr", "add", address, "dev", name, "nodad")
        in_ns(ns, "ip", "link", "set", name, "up")
        if peer_ns == self.bridge_ns:
            in_ns(peer_ns, "ip", "link", "set", peer, "master", "br0")
        in_ns(peer_ns, "ip", "link", "set", peer, "up")

    def build(self) -> None:
        self._ns(self.bridge_ns)
        in_ns(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        in_ns(self.bridge_ns, "ip", "link", "set", "br0", "up")
        self._ns(self.handler_ns)
        self._veth(
            self.handler_ns, "eth0", [f"{HANDLER_V4}/24", f"{LAN_V6}1/64"], peer_ns=self.bridge_ns
        )
        router = self._ns(f"{self.prefix}-r")
        in_ns(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._veth(router, "lan", [f"{ROUTER_V4}/24"], peer_ns=self.bridge_ns)
        self._ns(self.far_ns)
        self._veth(self.far_ns, "eth0", [f"{FAR_V4}.10/24"], peer_ns=router)
        in_ns(router, "ip", "addr", "add", f"{FAR_V4}.1/24", "dev", f"p{self._veths}")
        in_ns(self.far_ns, "ip", "route", "add", "default", "via", f"{FAR_V4}.1")
        in_ns(self.handler_ns, "ip", "route", "add", f"{FAR_V4}.0/24", "via", ROUTER_V4)

    def add_camera_ns(self, host: int) -> str:
        """A camera namespace on the LAN at ``10.77.1.<host>`` and ``fd77:1::<host>``."""
        name = self._ns(f"{self.prefix}-c{host}")
        self._veth(
            name, "eth0", [f"{LAN_V4}.{host}/24", f"{LAN_V6}{host:x}/64"], peer_ns=self.bridge_ns
        )
        return name

    def __enter__(self) -> NetnsBed:
        """Built on entry (what a half-built bed made is removed), closed on exit."""
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for name in reversed(self.namespaces):
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "del", name)
        self.namespaces.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


class LineProcess:
    """A child process in a namespace that prints JSON lines; stdin takes JSON commands."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.lines: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, ns: str | None, module: str, config: Any, workdir: Path) -> LineProcess:
        """Run ``module`` with ``config`` in namespace ``ns`` (None: here, on loopback only)."""
        name = f"{module.rsplit('.', 1)[1]}-{uuid_module.uuid4().hex[:6]}"
        config_path = workdir / f"{name}.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        stderr_path = workdir / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with stderr_path.open("wb") as stderr:
            prefix = ["ip", "netns", "exec", ns] if ns else []
            proc = await asyncio.create_subprocess_exec(
                *prefix, sys.executable, "-m", module, str(config_path),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=REPO,
                env=env,
                limit=LINE_LIMIT_BYTES,
            )
        return cls(proc, stderr_path)

    async def _read_line(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        raw = await self.proc.stdout.readline()
        if not raw:
            return None
        text = raw.decode().strip()
        line: dict[str, Any] = {"text": text} if text == "READY" else json.loads(text)
        self.lines.append(line)
        return line

    async def wait_for(
        self,
        check: Callable[[dict[str, Any]], bool],
        *,
        what: str,
        within: float = WAIT_S,
        after: int = 0,
    ) -> dict[str, Any]:
        """The first line from index ``after`` on (read or still to come) that passes ``check``."""
        for line in self.lines[after:]:
            if check(line):
                return line
        try:
            async with asyncio.timeout(within):
                while True:
                    got = await self._read_line()
                    if got is None:
                        raise AssertionError(f"process ended before {what}: {self.stderr()}")
                    if check(got):
                        return got
        except TimeoutError:
            raise AssertionError(f"waited {within:.0f}s for {what}") from None

    async def command(self, **cmd: Any) -> dict[str, Any]:
        """Send one command; return the simulator's answer to it."""
        assert self.proc.stdin is not None
        seen = len(self.lines)
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.wait_for(
            lambda line: "ok" in line or "probes_seen" in line, what=f"answer to {cmd}", after=seen
        )

    def rss_kib(self) -> int:
        """The process's resident memory now (``ip netns exec`` execs, so the pid is Python's)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text(encoding="ascii")
        line = next(row for row in status.splitlines() if row.startswith("VmRSS:"))
        return int(line.split()[1])

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    async def stop(self) -> None:
        await terminate(self.proc, grace_s=STOP_GRACE_S)


async def start_cameras(
    bed: NetnsBed | None, ns: str | None, config: dict[str, Any], *, workdir: Path | None = None
) -> LineProcess:
    """Simulated cameras in ``ns`` (None: on loopback, with ``multicast: false`` in config)."""
    where = workdir or (bed.workdir if bed else Path(tempfile.mkdtemp(prefix="onvif-")))
    process = await LineProcess.start(ns, "tests.harness.onvif_camera", config, where)
    await process.wait_for(lambda line: line.get("text") == "READY", what="cameras ready")
    return process


async def start_runner(
    bed: NetnsBed, configs: dict[str, Any], ns: str | None = None
) -> LineProcess:
    return await LineProcess.start(
        ns or bed.handler_ns, "tests.harness.onvif_runner", configs, bed.workdir
    )


async def cameras_and_runner(
    bed: NetnsBed, processes: list[LineProcess], host: int, config: dict[str, Any],
    details: str,
) -> tuple[LineProcess, LineProcess]:
    """Cameras (``config``) in a camera namespace of their own at ``LAN_V4.host``, and the
    handler's runner with ``details``, both added to ``processes`` (which the test's
    ``processes`` fixture stops after it)."""
    cameras = await start_cameras(bed, bed.add_camera_ns(host), config)
    processes.append(cameras)
    runner = await start_runner(bed, {"c": {"details": details}})
    processes.append(runner)
    return cameras, runner


def camera(index: int, host: str, **fields: Any) -> dict[str, Any]:
    """A camera for the simulator's config, with a uuid derived from its index."""
    return {
        "index": index,
        "uuid": f"00000000-0000-4000-8000-{index:012d}",
        "host": host,
        "port": 8080,
        "mac": f"02:00:00:00:{index // 256:02x}:{index % 256:02x}",
        **fields,
    }


def clock_near_boot() -> list[str]:
    """The command prefix that runs a process in a new time namespace whose monotonic clock
    reads about one second, as it does just after a host boots (``unshare --time``)."""
    return ["unshare", "--time", f"--monotonic=-{max(int(time.monotonic()) - 1, 0)}", "--fork"]


async def edgeplug_discover(
    bed: NetnsBed, configuration: str, *arguments: str, near_boot: bool = False
) -> tuple[int, str, str]:
    """``edgeplug discover -o json`` of a Configuration's YAML, run in the handler's namespace
    (with its monotonic clock near its origin when ``near_boot``): exit status, standard output,
    standard error."""
    path = bed.workdir / f"configuration-{uuid_module.uuid4().hex[:6]}.yaml"
    path.write_text(configuration, encoding="utf-8")
    clock = clock_near_boot() if near_boot else []
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", bed.handler_ns, *clock, sys.executable, "-m", "cli", "discover",
        "-f", str(path), "-o", "json", "--timeout", "20", *arguments,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )
    async with asyncio.timeout(WAIT_S):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
