"""IPyCam, a third-party ONVIF camera from PyPI, run unmodified in a test network namespace.

Our own simulator (``onvif_camera``) can only agree with our own reading of
ONVIF. IPyCam (``pip install ipycam``, MIT, by Oliver Hamilton; not written by this project)
is a pure-Python virtual IP camera: a WS-Discovery target service, ONVIF device and media
services over HTTP with WS-Security UsernameToken authentication, and MJPEG/RTSP streams of
frames its host feeds it. It writes WS-Discovery and SOAP its own way (a ProbeMatch without
the ProbeMatches wrapper, the EndpointReference in the WS-Discovery namespace, with
credentials configured even GetSystemDateAndTime refused), as deployed cameras do.

It runs here through its own console entry point (``ipycam --source video``: no capture
device, it streams a placeholder frame) and its own JSON config file, in a camera namespace
of a ``NetnsBed`` that is given a default route (as on a real LAN; IPyCam works out its own
address by routing towards 10.255.255.255 and multicasts its Hello and Bye from it). It is
stopped with SIGINT, its own shutdown path, which multicasts a Bye.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.aio_process import terminate
from tests.harness.kube_waits import WAIT_S, until
from tests.harness.onvif_netns import LAN_V4, ROUTER_V4, NetnsBed, in_ns

#: what IPyCam prints once its discovery, ONVIF and stream services are up
READY_TEXT = "IP Camera is running!"
ONVIF_PORT = 8080  # IPyCam's default ``onvif_port``
DEVICE_PATH = "/onvif/device_service"


def _sigint_delivered() -> None:
    """In the child before exec: SIGINT back to its default. A non-interactive shell starts its
    background jobs (``make test &``) with SIGINT ignored, which every child inherits, and a
    Python started so never raises KeyboardInterrupt: IPyCam then ignores the SIGINT its
    shutdown (and its Bye) hangs on, and is killed a grace later without a Bye."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ipycam_command() -> str:
    """IPyCam's console script, beside this interpreter (the project venv) or on PATH."""
    beside = Path(sys.executable).with_name("ipycam")
    found = str(beside) if beside.exists() else shutil.which("ipycam")
    if found is None:
        raise AssertionError(
            "IPyCam is not installed: it is a test dependency (pip install -e '.[test]')"
        )
    return found


@dataclass
class IpyCam:
    """One IPyCam process in its own namespace at ``10.77.1.<host>``."""

    bed: NetnsBed
    host: int
    name: str
    username: str = ""
    password: str = ""
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.bed.workdir / f"ipycam-{self.host}.log"

    @property
    def address(self) -> str:
        return f"{LAN_V4}.{self.host}"

    @property
    def service_url(self) -> str:
        return f"http://{self.address}:{ONVIF_PORT}{DEVICE_PATH}"

    @property
    def name_scope(self) -> str:
        return f"onvif://www.onvif.org/name/{self.name}"

    async def start(self) -> None:
        ns = self.bed.add_camera_ns(self.host)
        in_ns(ns, "ip", "route", "add", "default", "via", ROUTER_V4)
        config = {
            "name": self.name,
            # small and slow: the test needs its services, not its video
            "main_width": 320, "main_height": 240, "main_fps": 2,
            "sub_width": 160, "sub_height": 120, "sub_fps": 2,
            "username": self.username, "password": self.password,
        }
        workdir = self.bed.workdir / f"ipycam-{self.host}"
        workdir.mkdir()
        config_path = workdir / "camera_config.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        command = [ipycam_command(), "--source", "video", "--config", str(config_path)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", ns, *command,
                stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                cwd=workdir, env=env, preexec_fn=_sigint_delivered,
            )
        await until(self._ready, what=f"IPyCam {self.name} ready", within=WAIT_S)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.returncode is not None:
            raise AssertionError(f"IPyCam {self.name} exited: {self.log()}")
        return READY_TEXT in self.log()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    async def stop(self) -> None:
        """SIGINT, IPyCam's own shutdown (it says Bye); killed if it does not end in time."""
        proc, self.proc = self.proc, None
        await terminate(proc, grace_s=WAIT_S, signal_number=signal.SIGINT)
