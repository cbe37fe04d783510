"""A device plugin on another gRPC stack (grpc-go), run for tests of the kubelet stand-ins.

A kubelet stand-in speaks as the kubelet does only if plugins built on other
gRPC stacks work through it. The ``testplugin`` command of the multi-call binary
(tests/harness/kubebin/testplugin.go) is such a plugin: it refuses calls whose HTTP/2
``:authority`` is not a plain host (as tonic/h2 plugins such as Akri's do), prints each
authority it is called with, registers and serves its devices, and registers again after a
kubelet restart deletes its socket. ``GoPlugin`` starts and stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from tests.harness import kubebin
from tests.harness.aio_process import terminate

#: How long the plugin may take to register (the kubelet dials it back inside Register).
REGISTER_TIMEOUT_S = 60.0
#: How long it may take to exit after SIGTERM.
STOP_TIMEOUT_S = 10.0


class GoPluginFailed(Exception):
    """The plugin exited before it registered; the message holds what it printed."""


class GoPlugin:
    """One grpc-go device plugin for ``resource`` with ``devices`` (all healthy)."""

    def __init__(self, *, plugin_dir: Path, resource: str, devices: Sequence[str],
                 socket_name: str = "go-testplugin.sock") -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.devices = tuple(devices)
        self.socket_name = socket_name
        self.authorities: list[str] = []  # every :authority it was called with, first seen first
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the plugin and return once its registration was accepted."""
        self._process = await asyncio.create_subprocess_exec(
            str(kubebin.build()), "testplugin", "--plugin-dir", str(self.plugin_dir),
            "--resource", self.resource, "--socket-name", self.socket_name,
            "--devices", ",".join(self.devices),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        assert self._process.stdout is not None
        printed: list[str] = []
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                line = (await self._process.stdout.readline()).decode().strip()
                if not line:
                    await self._process.wait()
                    raise GoPluginFailed("\n".join(printed))
                printed.append(line)
                if line.startswith("authority "):
                    self.authorities.append(line.removeprefix("authority "))
                if line == "registered":
                    return

    async def stop(self) -> None:
        process, self._process = self._process, None
        await terminate(process, grace_s=STOP_TIMEOUT_S)
