"""Real open62541 servers and Local Discovery Servers on loopback, each in its own process.

The opcua handler was written and first tested against asyncua servers; a
user's PLCs and gateways run other stacks, most often open62541 (the C stack many vendors
embed). The PyPI package ``o6`` wraps open62541 with a server and an LDS, so the handler's
integration tests run against both. Each open62541 server runs as its own process
(``python -m tests.harness.opcua_open62541``), so a test can kill it (SIGKILL), freeze it
(SIGSTOP) and restart it on the same port as a real device would go away.

Two facts of this build the tests depend on, found by trying it:

- ``o6`` without a licence credential runs in "script mode": importing it starts a ten-minute
  timer that ends the process. A test server therefore lives in a child process started for
  one test module (never imported by pytest itself), and a module's open62541 tests take well
  under ten minutes.
- its ``deregisterDiscovery`` cannot reach an LDS (its registration client insists on
  SignAndEncrypt with no policy configured: ``BadIdentityTokenRejected``). The tests deregister
  the way the protocol defines it instead: ``RegisterServer`` with ``IsOnline=false`` on the
  wire (``opcua_servers.deregister``), which the open62541 LDS honours.

``ServerStatus.State`` of an open62541 server is computed by the stack and cannot be written,
so "a server that is not Running" is tested against asyncua only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.harness.opcua_servers import (
    VALUE,
    VALUE_IDENTIFIER,
    VALUE_NAME,
    ServerIdentity,
)

PRODUCT_URI = "http://open62541.org"  # what open62541 servers say unless configured otherwise
START_WITHIN_S = 90.0  # importing o6 takes ~5 s on a loaded 2-core machine; never a timing
POLL_S = 0.05
_DISCOVERY_SERVER = 3  # OPC-UA ApplicationType.DiscoveryServer
_OBJECTS = "i=85"  # the Objects folder
#: The value a broker reads, in the server's own namespace (index 1, the application URI's), where
#: open62541 devices put their nodes (asyncua's test servers register one more: index 2).
VALUE_NAMESPACE = 1
VALUE_NODE = f"ns={VALUE_NAMESPACE};s={VALUE_IDENTIFIER}"
_ROOT = Path(__file__).resolve().parents[2]


class Open62541Server(ServerIdentity):
    """One open62541 server process on ``127.0.0.1:port``; ``stop`` kills it, ``start`` again
    brings it back on the same port (and so under the same URL and device id)."""

    def __init__(self, name: str, *, secure_only: bool = False, **identity: Any) -> None:
        """``identity``: ``ServerIdentity``'s (port, application URI, discovery, register_to,
        secure_with)."""
        super().__init__(name, **identity)
        self._secure_only = secure_only
        self._process: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix=f"edgeplug-open62541-{name}-"))

    def _command(self, ready: Path) -> list[str]:
        command = [sys.executable, "-m", "tests.harness.opcua_open62541", "--name", self.name,
                   "--port", str(self.port), "--application-uri", self.application_uri,
                   "--ready", str(ready)]
        if self._discovery:
            command.append("--discovery")
        if self._register_to is not None:
            command += ["--register-to", self._register_to]
        if self._secure_with is not None:
            certs = self._secure_with
            command += ["--certificate", str(certs.server_cert), "--private-key",
                        str(certs.server_key), "--trust", str(certs.client_cert)]
            if self._secure_only:
                command.append("--secure-only")
        return command

    async def start(self) -> Open62541Server:
        """Start the process; return once it listens (and has asked its LDS to register it)."""
        assert self._process is None, f"{self.name} already running"
        ready = self._dir / "ready"
        self._process = self._spawn(ready)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_WITHIN_S
        while not ready.exists():
            if self._process.poll() is not None or loop.time() > deadline:
                await self.stop()
                raise AssertionError(f"open62541 server {self.name} did not start; its log:\n"
                                     f"{self.log_tail()}")
            await asyncio.sleep(POLL_S)
        return self

    def _spawn(self, ready: Path) -> subprocess.Popen[bytes]:
        ready.unlink(missing_ok=True)
        with (self._dir / "log").open("ab") as log:
            return subprocess.Popen(self._command(ready), cwd=_ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    async def stop(self) -> None:
        """SIGKILL: the server vanishes without a goodbye, as a device losing power does."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)  # a frozen process is killed all the same
            process.kill()
        await asyncio.to_thread(process.wait)

    def freeze(self) -> None:
        """SIGSTOP: the port stays open and nothing answers (a hung device)."""
        assert self._process is not None, f"{self.name} not running"
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None, f"{self.name} not running"
        self._process.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        path = self._dir / "log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def close(self) -> None:
        await self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


async def _serve(args: argparse.Namespace) -> None:
    # starts o6's ten-minute script-mode timer: imported only in this process
    from o6 import Server  # type: ignore[import-untyped]

    secure: dict[str, object] = {}
    if args.certificate is not None:
        secure = {"certificate": args.certificate, "privateKey": args.private_key,
                  "trustList": list(args.trust), "secureOnly": args.secure_only}
    server = Server(port=args.port, applicationUri=args.application_uri, **secure)
    url = f"opc.tcp://127.0.0.1:{args.port}/"
    description = server.config.applicationDescription
    description.applicationName = f"en:{args.name}"
    description.discoveryUrls = [url]
    server.config.applicationDescription = description
    if args.discovery:
        server.config.applicationType = _DISCOVERY_SERVER
    server.start()
    await server.waitReady()
    await server.addVariable(VALUE_NAME, _OBJECTS, VALUE, nodeId=VALUE_NODE, ns=VALUE_NAMESPACE)
    if args.register_to is not None:
        await server.registerDiscovery(args.register_to)
    _say_ready(args.ready, url)
    await asyncio.Event().wait()


def _say_ready(path: str, url: str) -> None:
    Path(path).write_text(url)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run one open62541 (o6) test server until killed")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--application-uri", required=True)
    parser.add_argument("--ready", required=True, help="file written once the server listens")
    parser.add_argument("--discovery", action="store_true", help="be a Local Discovery Server")
    parser.add_argument("--register-to", help="the LDS to register with")
    parser.add_argument("--certificate")
    parser.add_argument("--private-key")
    parser.add_argument("--trust", action="append", default=[])
    parser.add_argument("--secure-only", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
