"""Real node-opcua servers on loopback, each its own Node.js process, and node-opcua's install.

Node-opcua is the OPC-UA stack of Node-RED's OPC-UA nodes and of many gateways,
and it refuses an untrusted client certificate differently from asyncua and open62541: with a
ServiceFault inside the secured OpenSecureChannel reply, which asyncua cannot read. The opcua
handler's tests run against it beside asyncua and open62541.

node-opcua comes from the npm registry, pinned with every dependency in
``tests/harness/opcua_nodeopcua/package-lock.json`` (a version whose engines accept the Node.js
20 of the machine image; later ones need 22). ``install`` runs ``npm ci`` from that lock into the
harness cache (``~/.cache/edgeplug/node-opcua-<version>-<digest of the pins>``, through a
``.partial`` folder, so an interrupted install never looks done; npm's own download cache is kept
there too), never into the work tree or the user's npm folders, and reuses it until the pins
change. The first server a run starts installs it (so ``make test`` and CI install it through
the tests themselves); ``python -m tests.harness.opcua_nodeopcua`` installs it ahead. Node.js
and npm come with the machine image, like Go.

Each server (``tests/harness/opcua_nodeopcua/server.js``) runs as its own process, so a test stops
it with SIGKILL as a device losing power goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.harness.kubebin import cache_dir
from tests.harness.opcua_servers import ServerIdentity

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "opcua_nodeopcua"
PINS = ("package.json", "package-lock.json")
PACKAGE = "node-opcua"
START_WITHIN_S = 90.0  # node-opcua loads its standard nodeset at start (~1 s); never a timing
POLL_S = 0.05
PRODUCT_URI = "NodeOPCUA-Server"  # what node-opcua servers say unless configured otherwise


def version() -> str:
    """The node-opcua version package.json pins."""
    pinned: dict[str, Any] = json.loads((SOURCE_DIR / "package.json").read_text())
    return str(pinned["dependencies"][PACKAGE])


def installed_dir() -> Path:
    digest = hashlib.sha256()
    for name in PINS:
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    return cache_dir() / f"node-opcua-{version()}-{digest.hexdigest()[:16]}"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"the node-opcua test servers need Node.js and npm ('{name}' not on "
                           "PATH; the machine image ships both)")
    return found


def install() -> Path:
    """Install the pinned node-opcua unless the cache has it; return its ``node_modules``."""
    target = installed_dir()
    modules = target / "node_modules"
    if modules.is_dir():
        return modules
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second install (another pytest, make) waits
        if modules.is_dir():
            return modules
        npm = _tool("npm")
        partial = target.with_name(f"{target.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for name in PINS:
            shutil.copyfile(SOURCE_DIR / name, partial / name)
        log.info("installing node-opcua %s into %s", version(), target)
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts",
             "--cache", str(cache_dir() / "npm-cache")],
            cwd=partial, check=True, stdin=subprocess.DEVNULL)
        partial.rename(target)
    return modules


class NodeOpcuaServer(ServerIdentity):
    """One node-opcua server process on ``127.0.0.1:port``; ``stop`` kills it, ``start`` again
    brings it back on the same port. ``secure_with``: Basic256Sha256 SignAndEncrypt with the
    certificates' server pair, trusting their client certificate and no other."""

    def __init__(self, name: str, **identity: Any) -> None:
        """``identity``: ``ServerIdentity``'s (port, application URI, secure_with)."""
        super().__init__(name, **identity)
        if self._discovery or self._register_to is not None:
            raise ValueError("the node-opcua harness runs plain servers only")
        self.url = f"opc.tcp://127.0.0.1:{self.port}"  # as node-opcua announces it: no slash
        self._process: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix=f"edgeplug-node-opcua-{name}-"))

    def _settings(self, ready: Path) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "port": self.port, "applicationUri": self.application_uri, "name": self.name,
            "pki": str(self._dir / "pki"), "ready": str(ready)}
        if self._secure_with is not None:
            certs = self._secure_with
            settings |= {"certificate": str(certs.server_cert),
                         "privateKey": str(certs.server_key), "trust": [str(certs.client_cert)]}
        return settings

    async def start(self) -> NodeOpcuaServer:
        """Start the process; return once it listens."""
        assert self._process is None, f"{self.name} already running"
        modules = await asyncio.to_thread(install)
        ready = self._dir / "ready"
        self._process = self._spawn(modules, ready)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_WITHIN_S
        while not ready.exists():
            if self._process.poll() is not None or loop.time() > deadline:
                await self.stop()
                raise AssertionError(f"node-opcua server {self.name} did not start; its log:\n"
                                     f"{self.log_tail()}")
            await asyncio.sleep(POLL_S)
        return self

    def _spawn(self, modules: Path, ready: Path) -> subprocess.Popen[bytes]:
        ready.unlink(missing_ok=True)
        settings = self._dir / "settings.json"
        settings.write_text(json.dumps(self._settings(ready)))
        with (self._dir / "log").open("ab") as log_file:
            return subprocess.Popen(
                [_tool("node"), str(SOURCE_DIR / "server.js"), str(settings)],
                cwd=self._dir, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, "NODE_PATH": str(modules)})

    async def stop(self) -> None:
        """SIGKILL: the server vanishes without a goodbye, as a device losing power does."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait)

    def log_tail(self, lines: int = 40) -> str:
        path = self._dir / "log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def close(self) -> None:
        await self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(install())
