"""A real local Kubernetes control plane: etcd, apiserver, scheduler, controller-manager.

Every integration test, every end-to-end test and the demo need a real API
server (CRD validation, server-side apply, watches, the scheduler's binding, the garbage
collector's cascades) and no hand-written fake of it. ``ControlPlane`` starts the four servers
on loopback with free ports in a private directory, waits until each is ready, writes an admin
kubeconfig, installs edgeplug's CRDs and stops everything it started, in reverse order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.harness import kubebin, pki

log = logging.getLogger(__name__)

#: How often ``get_json`` asks again after a 429 from a starting API server.
GET_429_ATTEMPTS = 10

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "crds" / "manifests"
READY_TIMEOUT_S = 120.0
READY_POLL_S = 0.1
#: How long a server gets to exit on SIGTERM before SIGKILL when a test stops it or the whole
#: plane goes. An API server stopped within seconds of its start has stopped listening at once
#: but then waits out any timeout on its start-up hooks, which only lengthened every outage and
#: teardown; its clients see the same connection errors either way.
STOP_GRACE_S = 3.0
SERVICE_CIDR = "10.96.0.0/16"  # bookkeeping only: nothing ever routes to it


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Process:
    name: str
    args: list[str]
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes]


@dataclass
class ControlPlane:
    """Owns the servers of one local cluster. Use as a context manager or call start/stop."""

    workdir: Path | None = None
    install_crds: bool = True
    apiserver_args: tuple[str, ...] = ()
    kubeconfig: Path = field(init=False)
    server: str = field(init=False, default="")
    token: str = field(init=False, default="")
    ca_cert: Path = field(init=False)
    _processes: list[_Process] = field(init=False, default_factory=list)
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(init=False, default=None)
    binaries: kubebin.Binaries = field(init=False)

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="edgeplug-cp-")
            self.workdir = Path(self._tempdir.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binaries = kubebin.resolve()
        try:
            certs = pki.create(self.workdir / "pki")
            self.ca_cert = certs.ca_cert
            self.token = secrets.token_hex(16)
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url, certs)
            self.kubeconfig = self._write_kubeconfig()
            self._start_scheduler()
            self._start_controller_manager(certs)
            if self.install_crds:
                self.apply_crds()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server this object started, newest first, then remove the directory."""
        for process in reversed(self._processes):
            _terminate(process)
        self._processes.clear()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    # -- the servers -----------------------------------------------------------------------

    def restart(self, name: str) -> None:
        """Stop one server and start it again with the same flags, as an operator would."""
        self.start_server(name, self.stop_server(name))

    def stop_server(self, name: str) -> list[str]:
        """Stop one server (clients then see connection errors); returns its flags."""
        index, process = next(
            (i, p) for i, p in enumerate(self._processes) if p.name == name
        )
        _terminate(process)
        del self._processes[index]
        return process.args

    def start_server(self, name: str, args: list[str]) -> None:
        """Start a server stopped by ``stop_server``; for the API server, wait until ready."""
        self._spawn(name, args)
        if name == "kube-apiserver":
            self._wait_ready(name, f"{self.server}/readyz", tls=True)

    def pids(self) -> dict[str, int]:
        """Each running server's process id, by name (etcd, kube-apiserver, ...)."""
        return {p.name: p.popen.pid for p in self._processes if p.popen.poll() is None}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.workdir is not None
        log_file = (self.workdir / f"{name}.log").open("ab")
        popen = subprocess.Popen(
            self.binaries.command(name, *args),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            start_new_session=True,
        )
        self._processes.append(_Process(name=name, args=args, popen=popen, log_file=log_file))
        return popen

    def _start_etcd(self) -> str:
        assert self.workdir is not None
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",  # a test cluster: durability across power loss is moot
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_ready("etcd", f"{client_url}/health", tls=False)
        return client_url

    def _start_apiserver(self, etcd_url: str, certs: pki.Pki) -> None:
        assert self.workdir is not None
        port = free_port()
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(f'{self.token},admin,admin,"system:masters"\n')
        tokens.chmod(0o600)
        self.server = f"https://127.0.0.1:{port}"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Since v1.37 the endpoint reconcilers refuse a loopback address for the
                # `kubernetes` Service; nothing here routes to that Service (SERVICE_CIDR), so
                # no reconciler writes its endpoints.
                "--endpoint-reconciler-type=none",
                f"--secure-port={port}",
                f"--tls-cert-file={certs.serving_cert}",
                f"--tls-private-key-file={certs.serving_key}",
                f"--client-ca-file={certs.ca_cert}",
                f"--token-auth-file={tokens}",
                # As every real cluster: kubelets' identities confined to their own node
                # (the Node authorizer, NodeRestriction) beside RBAC for everyone else.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={certs.service_account_key}",
                f"--service-account-signing-key-file={certs.service_account_key}",
                "--allow-privileged=true",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--event-ttl=1h",
                *self.apiserver_args,
            ],
        )
        self._wait_ready("kube-apiserver", f"{self.server}/readyz", tls=True)

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )

    def _start_controller_manager(self, certs: pki.Pki) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={certs.service_account_key}",
                f"--root-ca-file={certs.ca_cert}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        # Pods cannot be created in a namespace until its "default" ServiceAccount exists,
        # and the controller-manager creates it: wait for that, it proves the KCM works.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.get_json("/api/v1/namespaces/default/serviceaccounts/default") is None:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("kube-controller-manager never made the default ServiceAccount")
            time.sleep(READY_POLL_S)

    # -- readiness and requests -------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def _check_alive(self) -> None:
        for process in self._processes:
            code = process.popen.poll()
            if code is not None:
                tail = self.log_tail(process.name)
                raise RuntimeError(f"{process.name} exited with {code}; its log ends:\n{tail}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        assert self.workdir is not None
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _wait_ready(self, name: str, url: str, *, tls: bool) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            self._check_alive()
            try:
                request = urllib.request.Request(url)
                if tls:
                    request.add_header("Authorization", f"Bearer {self.token}")
                context = self._ssl_context() if tls else None
                with urllib.request.urlopen(request, timeout=2, context=context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready at {url}; log ends:\n{self.log_tail(name)}")
            time.sleep(READY_POLL_S)

    def get_json(self, path: str) -> dict[str, object] | None:
        """GET an API path as admin; None on 404. A 429 (a freshly started API server's
        priority-and-fairness answers it until its configuration is loaded) is asked again
        after the server's Retry-After, a bounded number of times."""
        request = urllib.request.Request(self.server + path)
        request.add_header("Authorization", f"Bearer {self.token}")
        for attempt in range(GET_429_ATTEMPTS):
            try:
                with urllib.request.urlopen(
                    request, timeout=10, context=self._ssl_context()
                ) as resp:
                    body: dict[str, object] = json.load(resp)
                    return body
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                if error.code != 429 or attempt == GET_429_ATTEMPTS - 1:
                    raise
                wait = error.headers.get("Retry-After", "1")
                time.sleep(min(float(wait) if wait.isdecimal() else 1.0, 5.0))
        raise AssertionError("unreachable")

    def _write_kubeconfig(self) -> Path:
        assert self.workdir is not None
        path = self.workdir / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "edgeplug-local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_cert)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "edgeplug-local",
                    "context": {"cluster": "edgeplug-local", "user": "admin"},
                }
            ],
            "current-context": "edgeplug-local",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    # -- conveniences for tests and the demo ------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment a client process needs to reach this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl (the one built with the control plane) against this cluster."""
        return subprocess.run(
            self.binaries.command("kubectl", f"--kubeconfig={self.kubeconfig}", *args),
            check=check,
            capture_output=True,
            text=True,
            input=stdin,
            timeout=timeout,
        )

    def apply_crds(self) -> None:
        self.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/configurations.edgeplug.io", "crd/instances.edgeplug.io",
        )


def _terminate(process: _Process) -> None:
    if process.popen.poll() is None:
        process.popen.send_signal(signal.SIGTERM)
        try:
            process.popen.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()
    process.log_file.close()


@contextlib.contextmanager
def running(**kwargs: object) -> Iterator[ControlPlane]:
    """``with running() as cp:``: a started control plane, stopped on exit."""
    plane = ControlPlane(**kwargs)  # type: ignore[arg-type]
    with plane:
        yield plane
