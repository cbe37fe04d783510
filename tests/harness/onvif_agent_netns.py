"""The real agent inside the ONVIF test network, still talking to the real API server.

To show Instances following cameras' Hello and Bye, the agent must run where
the multicast is: in the test's handler namespace. The API server listens on the host's
loopback, which a namespace cannot reach, and giving the namespace a route to the host would
let the agent's Probes out onto the host's interfaces. So the API connection crosses through a
Unix socket (a file, visible from every namespace) instead: a relay here accepts on the Unix
socket and connects to the API server; ``python -m tests.harness.onvif_agent_netns PORT PATH``
inside the namespace accepts on ``127.0.0.1:PORT`` and connects to the Unix socket. TLS passes
through untouched, so the agent's kubeconfig works as it is. Device-plugin sockets are files
too, so an emulated kubelet could reach the agent the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.harness import hermetic
from tests.harness.aio_process import terminate
from tests.harness.controlplane import ControlPlane
from tests.harness.onvif_netns import REPO
from tests.harness.stream_splice import splice

STOP_TIMEOUT_S = 10.0


async def unix_to_tcp(path: Path, host: str, port: int) -> asyncio.Server:
    """Accept on the Unix socket ``path``; connect each client to ``host:port`` (this netns)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            other = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await splice(reader, writer, other)

    return await asyncio.start_unix_server(serve, path=str(path))


async def _tcp_to_unix(port: int, path: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            other = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await splice(reader, writer, other)

    server = await asyncio.start_server(serve, host="127.0.0.1", port=port)
    print("READY", flush=True)
    async with server:
        await server.serve_forever()


class NetnsAgent:
    """``python -m agent.main`` in namespace ``ns``, reaching ``plane``'s API through relays."""

    def __init__(
        self, plane: ControlPlane, *, ns: str, node_name: str, namespace: str, workdir: Path
    ) -> None:
        self._plane = plane
        self._ns = ns
        self._node = node_name
        self._namespace = namespace
        self._socket = workdir / "api.sock"
        self.log_path = workdir / "agent.log"
        self._server: asyncio.Server | None = None
        self._relay: asyncio.subprocess.Process | None = None
        self._agent: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        api = urlsplit(self._plane.server)
        assert api.hostname
        assert api.port
        self._server = await unix_to_tcp(self._socket, api.hostname, api.port)
        self._relay = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self._ns, sys.executable, "-m",
            "tests.harness.onvif_agent_netns", str(api.port), str(self._socket),
            stdout=asyncio.subprocess.PIPE, cwd=REPO,
        )
        assert self._relay.stdout is not None
        async with asyncio.timeout(30):
            ready = await self._relay.stdout.readline()
        assert ready.strip() == b"READY", "the namespace's API relay did not start"
        env = {
            **os.environ,
            "NODE_NAME": self._node,
            "KUBECONFIG": str(self._plane.kubeconfig),
            "WATCH_NAMESPACE": self._namespace,
            "POD_RESOURCES_SOCKET": "",
            "CDI_SPEC_DIR": "",
            "DEVICE_PLUGINS": "off",
            # No Akri handler registration: its default directory is the machine's one.
            "DISCOVERY_HANDLERS_DIRECTORY": "",
            "PYTHONPATH": str(REPO),
        }
        hermetic.refuse_host_environment(env, what=f"the agent in namespace {self._ns}")
        with self.log_path.open("ab") as log:
            self._agent = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", self._ns, sys.executable, "-m", "agent.main",
                env=env, stdout=log, stderr=log, cwd=REPO,
            )

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    async def stop(self) -> None:
        for proc in (self._agent, self._relay):
            await terminate(proc, grace_s=STOP_TIMEOUT_S)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


if __name__ == "__main__":
    asyncio.run(_tcp_to_unix(int(sys.argv[1]), sys.argv[2]))
