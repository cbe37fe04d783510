"""One real Kubernetes node for the tests: the kubelet itself, containerd 2, runc and CNI.

``devicenode`` runs only the kubelet's device manager; everything else a node
does (pod admission as a whole, CDI resolution by the runtime, device nodes and env inside a
real container, pod status and logs from a runtime) needs the real thing. ``RealNode`` starts it
on this machine, as root, without touching the host's node paths:

* a holder process owns a mount namespace and a network namespace of the node's own, where
  ``/var/lib/kubelet``, ``/run/containerd``, ``/var/run/cdi``, ``/etc/cdi``, ``/var/log/pods``,
  ``/var/log/containers``, ``/var/lib/cni`` and ``/var/lib/akri`` are bind mounts of
  directories under the node's temporary root (the host gets empty mount points at most), and
  the kernel settings the kubelet writes are plain files;
* containerd runs in both namespaces (pods' bridge ``cni0`` lives in the node's network
  namespace), the kubelet and the agent in the mount namespace only (the kubelet reaches the
  harness API server on loopback);
* the kubelet joins with a client certificate signed by the harness CA (``system:node:<name>``
  in ``system:nodes``), which the harness API server's Node authorizer and NodeRestriction
  confine to the node; the same certificate and key lie in the node's
  ``/var/lib/kubelet/pki/kubelet-client-current.pem``, where the agent reads claims with it;
* the pause and busybox images are imported from local OCI archives (no registry);
* every cgroup the node makes is under ``/edgeplug-<name>``, removed when it stops.

A missing piece (binary, package, kernel feature) stops the start with its log; there is no
fallback to a stand-in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.harness import realnode_config as config
from tests.harness import realnode_images as images
from tests.harness import realnodebin
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import until

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
SOCKET_TIMEOUT_S = 30.0
KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
REGISTRATION_LINE = "Got registration request from device plugin with resource"
TOOLS = ("unshare", "nsenter", "mount", "ip", "sleep")


def _mount_name(path: str) -> str:
    return path.strip("/").replace("/", "_")


class RealNode:
    """One node: holder namespaces, containerd, kubelet; extra processes via ``spawn``."""

    def __init__(self, cp: ControlPlane, *, node_name: str,
                 labels: Mapping[str, str] | None = None,
                 dev_nodes: Mapping[str, tuple[int, int]] | None = None,
                 host_dirs: Mapping[str, Path] | None = None) -> None:
        """``dev_nodes``: character devices (name -> major, minor) the node's ``/dev`` has
        besides the host's (hardware this machine lacks); the node's ``/dev`` is then an overlay
        of the host's, which stays unchanged. ``host_dirs``: node path -> host directory
        bind-mounted there (the mount point is made on the host if missing)."""
        self.cp = cp
        self.node_name = node_name
        self.labels = dict(labels or {})
        self.dev_nodes = dict(dev_nodes or {})
        self.host_dirs = dict(host_dirs or {})
        # The host directories made as mount points for host_dirs, removed by cleanup.
        self._made: list[Path] = sorted({_first_missing(Path(t)) for t in self.host_dirs
                                         if not Path(t).exists()})
        self.root = Path(tempfile.mkdtemp(prefix=f"ep-rn-{node_name}-"))
        self.cgroup_root = f"/edgeplug-{node_name}"
        self.bin_dir = Path()
        self.kubelet_port = 0
        self._kubelet_log_offset = 0
        self._holder: subprocess.Popen[bytes] | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    # -- paths -----------------------------------------------------------------------------

    def host_path(self, node_path: str) -> Path:
        """Where a path under one of the node's own mount points lies on the host."""
        for mount in config.NODE_PATHS:
            if node_path == mount or node_path.startswith(mount + "/"):
                return self.root / "mnt" / _mount_name(mount) / node_path[len(mount):].lstrip("/")
        raise ValueError(f"{node_path} is not under one of the node's own paths")

    def log_path(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_path(name)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the namespaces, containerd (images imported) and the kubelet; wait for Ready."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(f"the real node needs {missing} (util-linux, iproute2)")
        self.bin_dir = realnodebin.build()
        runc = realnodebin.runc()
        self._write_files(runc)
        self._boot(import_images=True)

    def _boot(self, *, import_images: bool,
              before_kubelet: Callable[[], None] | None = None) -> None:
        try:
            self._make_cgroup_root()
            self._start_holder()
            self.start_containerd()
            if import_images:
                self._import_images()
            if before_kubelet is not None:
                before_kubelet()
            self.start_kubelet()
        except BaseException:
            self.stop()
            raise

    def reboot(self, *, before_kubelet: Callable[[], None] | None = None) -> None:
        """A node reboot: every process of the node ends (its containers, and the processes
        ``spawn`` started: the test starts its agent again), ``/run`` is emptied as a tmpfs is
        (containerd's state, the CDI specs in ``/var/run/cdi``), the disk keeps what it holds
        (the kubelet's device checkpoint, containerd's images and metadata); then containerd
        and the kubelet start again and the Node is Ready. ``before_kubelet`` runs once the
        node's namespaces and containerd are up, before the kubelet starts (an agent that
        comes up first)."""
        self.stop()
        for tmpfs in ("/run/containerd", "/var/run/cdi"):
            shutil.rmtree(self.host_path(tmpfs))
            self.host_path(tmpfs).mkdir()
        self._boot(import_images=False, before_kubelet=before_kubelet)

    def _write_files(self, runc: Path) -> None:
        for mount in config.NODE_PATHS:
            (self.root / "mnt" / _mount_name(mount)).mkdir(parents=True)
        sysctl_dir = self.root / "sysctl"
        sysctl_dir.mkdir()
        for name, value in config.KUBELET_SYSCTLS.items():
            (sysctl_dir / _mount_name(name)).write_text(value + "\n")
        pki = self.cp.ca_cert.parent
        creds = config.node_credentials(pki / "ca.crt", pki / "ca.key", self.node_name,
                                        self.root / "pki")
        config.kubeconfig(self.cp.server, self.cp.ca_cert, creds, self.root / "kubeconfig")
        # Where a kubelet that rotates its certificate keeps the current one with its key (the
        # agent's KUBELET_CLIENT_CERT default): the agent reads the claims it prepares with it.
        current = self.host_path("/var/lib/kubelet/pki/kubelet-client-current.pem")
        current.parent.mkdir(parents=True, exist_ok=True)
        current.write_bytes(creds.client_cert.read_bytes() + creds.client_key.read_bytes())
        current.chmod(0o600)
        self.kubelet_port = free_port()
        config.kubelet_config(path=self.root / "kubelet.yaml", ca_cert=self.cp.ca_cert,
                              creds=creds, port=self.kubelet_port, healthz_port=free_port(),
                              cgroup_root=self.cgroup_root)
        config.cni_conflist(self.root / "cni", self.root / "mnt" / "var_lib_cni" / "networks")
        config.containerd_config(path=self.root / "containerd.toml",
                                 root=self.root / "containerd", cni_bin=self.bin_dir / "cni",
                                 cni_conf=self.root / "cni", runc=runc,
                                 restrict_oom=not config.has_cap_sys_resource())

    def _cgroup_dirs(self) -> list[Path]:
        return [d / self.cgroup_root.lstrip("/") for d in sorted(CGROUP_FS.iterdir())
                if d.is_dir() and not d.is_symlink()]

    def _make_cgroup_root(self) -> None:
        for directory in self._cgroup_dirs():
            directory.mkdir(exist_ok=True)
            if directory.parent.name == "cpuset":  # a new cpuset is empty until given these
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (directory / name).write_text((directory.parent / name).read_text())

    def _start_holder(self) -> None:
        lines = ["set -e", "ip link set lo up"]
        for mount in config.NODE_PATHS:
            source = self.root / "mnt" / _mount_name(mount)
            lines += [f"mkdir -p {mount}", f"mount --bind {source} {mount}"]
        for name in config.KUBELET_SYSCTLS:
            lines.append(f"mount --bind {self.root / 'sysctl' / _mount_name(name)} "
                         f"/proc/sys/{name}")
        for target, source in sorted(self.host_dirs.items()):
            lines += [f"mkdir -p {shlex.quote(target)}",
                      f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}"]
        if self.dev_nodes:
            lines += self._dev_overlay()
        lines += ["echo ready", "exec sleep infinity"]
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private", "--",
             "sh", "-c", "\n".join(lines)],
            stdout=subprocess.PIPE, stderr=self._log("holder"), stdin=subprocess.DEVNULL,
            start_new_session=True)
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != b"ready":
            self._holder.wait(STOP_TIMEOUT_S)
            raise RuntimeError(f"the node's namespaces could not be set up "
                               f"(exit {self._holder.returncode}):\n{self.log_tail('holder')}")

    def _dev_overlay(self) -> list[str]:
        """Shell lines: ``/dev`` becomes an overlay (the host's below, the node's nodes above),
        its submounts (pts, shm, ...) bound again, then the node's own nodes made."""
        base = self.root / "dev"
        lines = [f"mkdir -p {base}/host {base}/upper {base}/work",
                 f"mount --rbind /dev {base}/host",
                 f"mount -t overlay overlay -o lowerdir={base}/host,upperdir={base}/upper,"
                 f"workdir={base}/work /dev",
                 f"for sub in pts shm mqueue hugepages; do if mountpoint -q {base}/host/$sub; "
                 f"then mount --rbind {base}/host/$sub /dev/$sub; fi; done"]
        for name, (major, minor) in sorted(self.dev_nodes.items()):
            lines.append(f"mknod -m 666 /dev/{shlex.quote(name)} c {major} {minor}")
        return lines

    def _log(self, name: str) -> IO[bytes]:
        handle = self.log_path(name).open("ab")
        self._logs.append(handle)
        return handle

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              net: bool = False, cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Run a process in the node's mount namespace (and network namespace if ``net``)."""
        assert self._holder is not None
        ns = ["--mount", "--net"] if net else ["--mount"]
        if cwd is not None:  # entering a mount namespace moves to its root otherwise
            ns.append(f"--wd={cwd}")
        process = subprocess.Popen(
            ["nsenter", f"--target={self._holder.pid}", *ns, "--", *argv],
            stdout=self._log(name), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env if env is not None else self._env()), start_new_session=True)
        self._processes[name] = process
        return process

    def _env(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.bin_dir), os.environ.get("PATH", "")])
        return {**os.environ, "PATH": path}

    def _alive(self, name: str) -> None:
        process = self._processes[name]
        if process.poll() is not None:
            raise RuntimeError(f"{name} of node {self.node_name} exited with "
                               f"{process.returncode}; its log ends:\n{self.log_tail(name)}")

    def _wait(self, name: str, check: Any, what: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not check():
            self._alive(name)
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.node_name}: {what} not within {within:.0f} s; "
                                   f"{name} log ends:\n{self.log_tail(name)}")
            time.sleep(0.1)

    def start_containerd(self) -> None:
        self.spawn("containerd", [str(self.bin_dir / "containerd"), "--config",
                                  str(self.root / "containerd.toml")], net=True)
        socket = self.host_path(config.CONTAINERD_SOCKET)
        self._wait("containerd", socket.exists, "containerd's socket", SOCKET_TIMEOUT_S)

    def forward_api(self) -> int:
        """Make the API server reachable at 127.0.0.1:<its port> in the node's network
        namespace (tests/harness/realnode_forward.py); returns the port."""
        assert self._holder is not None
        port = int(self.cp.server.rsplit(":", 1)[1])
        self.spawn("api-forward", [sys.executable, "-m", "tests.harness.realnode_forward",
                                   f"/proc/{self._holder.pid}/ns/net", str(port)],
                   cwd=Path(__file__).resolve().parents[2])
        log = self.log_path("api-forward")
        self._wait("api-forward", lambda: "ready" in log.read_text(errors="replace"),
                   "the API server forwarded into the node", SOCKET_TIMEOUT_S)
        return port

    def ctr(self, *args: str, timeout: float = 60) -> str:
        """Run ``ctr`` (namespace k8s.io) against the node's containerd; its stdout."""
        assert self._holder is not None
        done = subprocess.run(
            ["nsenter", f"--target={self._holder.pid}", "--mount", "--",
             str(self.bin_dir / "ctr"), "--address", config.CONTAINERD_SOCKET, "-n", "k8s.io",
             *args], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _import_images(self) -> None:
        archives = self.root / "images"
        archives.mkdir()
        pause = images.pause_archive(self.bin_dir / "pause", archives / "pause.tar",
                                     config.PAUSE_IMAGE)
        busybox = images.busybox_archive(archives / "busybox.tar")
        for archive in (pause, busybox):
            self.ctr("images", "import", "--platform", f"linux/{images.ARCH}", str(archive))

    def start_kubelet(self) -> None:
        argv = [str(self.bin_dir / "kubelet"), f"--config={self.root / 'kubelet.yaml'}",
                f"--kubeconfig={self.root / 'kubeconfig'}",
                f"--hostname-override={self.node_name}", "--node-ip=127.0.0.1", "--v=2"]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in
                                                    sorted(self.labels.items())))
        log = self.log_path("kubelet")
        self._kubelet_log_offset = log.stat().st_size if log.exists() else 0
        self.spawn("kubelet", argv)
        self._wait("kubelet", self._registered, "Node registered", START_TIMEOUT_S)
        self._publish_address()
        self._wait("kubelet", self.ready, "Node Ready", START_TIMEOUT_S)
        self._wait("kubelet", self._serving_plugins, "kubelet.sock served", START_TIMEOUT_S)

    def _serving_plugins(self) -> bool:
        """Whether this kubelet's device plugin registration socket accepts a connection (a
        restarted kubelet's Node is Ready in the API before it serves again)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.host_path(KUBELET_SOCKET)))
            except OSError:
                return False
        return True

    def _registered(self) -> bool:
        return self.cp.get_json(f"/api/v1/nodes/{self.node_name}") is not None

    def _publish_address(self) -> None:
        """Give the Node its loopback address, which the kubelet refuses to report.

        The kubelet rejects a loopback ``--node-ip`` (it logs "nodeIP can't be loopback address"
        at each status update and leaves ``status.addresses`` alone), and the node may listen on
        loopback only; the API server reaches the kubelet (``kubectl logs``) at the address
        written here, which the kubelet then keeps. No ``Hostname`` address: the API server
        would try it first, and the node's name resolves nowhere."""
        addresses = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}
        self.cp.kubectl("patch", "node", self.node_name, "--subresource=status",
                        "--type=merge", "-p", json.dumps(addresses))

    def stop_kubelet(self) -> None:
        self._terminate("kubelet")

    def kill_process(self, name: str) -> None:
        """SIGKILL a process ``spawn`` started, and reap it."""
        process = self._processes.pop(name)
        process.kill()
        process.wait()

    def pid(self, name: str) -> int:
        """The process id of what ``spawn`` started as ``name`` (nsenter execs it in place)."""
        return self._processes[name].pid

    def stop_process(self, name: str) -> None:
        """Stop a process ``spawn`` started (SIGTERM, then SIGKILL after a grace)."""
        self._terminate(name)

    def registrations(self, resource: str) -> int:
        """How often a device plugin registered ``resource`` with this node's kubelets."""
        return self._registrations(resource, 0)

    def _registrations(self, resource: str, offset: int) -> int:
        with self.log_path("kubelet").open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
        return sum(1 for line in text.splitlines()
                   if REGISTRATION_LINE in line and f'"{resource}"' in line)

    def resource_registered(self, resource: str) -> bool:
        """Whether a device plugin registered ``resource`` with the kubelet since it started
        (the device manager's log line: the kubelet has no API that says so)."""
        return self._registrations(resource, self._kubelet_log_offset) > 0

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again; containerd and the containers keep running."""
        self.stop_kubelet()
        self.start_kubelet()

    def ready(self) -> bool:
        node = self.cp.get_json(f"/api/v1/nodes/{self.node_name}")
        if node is None:
            return False
        status: dict[str, Any] = node.get("status") or {}  # type: ignore[assignment]
        conditions: list[dict[str, Any]] = status.get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    async def wait_ready(self, within: float = START_TIMEOUT_S) -> None:
        await until(lambda: self.ready(), what=f"node {self.node_name} Ready", within=within)

    def _terminate(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        """Stop everything the node started: kubelet, containers, shims, containerd, holder."""
        for name in [n for n in self._processes if n not in ("kubelet", "containerd")]:
            self._terminate(name)
        self._terminate("kubelet")
        self._kill_containers()
        self._terminate("containerd")
        self._kill_namespace_members()
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait()
            self._holder = None
        self._remove_cgroups()
        for handle in self._logs:
            handle.close()
        self._logs.clear()

    def _kill_containers(self) -> None:
        """SIGKILL every process in the node's cgroups (its containers), by pid."""
        for hierarchy in self._cgroup_dirs():
            if not hierarchy.is_dir():
                continue
            for directory in _cgroup_tree(hierarchy):
                try:
                    pids = (directory / "cgroup.procs").read_text().split()
                except OSError:  # the runtime removed it meanwhile
                    continue
                for pid in pids:
                    _kill(int(pid))

    def _kill_namespace_members(self) -> None:
        """SIGKILL the processes left in the node's mount namespace (runc shims), by pid."""
        if self._holder is None:
            return
        try:
            ours = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        except OSError:
            return
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self._holder.pid:
                continue
            try:
                if os.readlink(entry / "ns" / "mnt") == ours:
                    _kill(int(entry.name))
            except OSError:
                continue

    def _remove_cgroups(self) -> None:
        for hierarchy in self._cgroup_dirs():
            if not hierarchy.is_dir():
                continue
            for directory in sorted(_cgroup_tree(hierarchy), key=lambda d: len(d.parts),
                                    reverse=True):
                _rmdir(directory)

    def cleanup(self) -> None:
        """``stop`` and remove the node's temporary root."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        for top in self._made:  # empty mount points only: never what someone put there
            for directory in sorted((d for d in top.rglob("*") if d.is_dir()),
                                    key=lambda d: len(d.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _first_missing(path: Path) -> Path:
    """The topmost directory of ``path`` that does not exist yet."""
    while not path.parent.exists():
        path = path.parent
    return path


def _cgroup_tree(top: Path) -> list[Path]:
    """``top`` and every cgroup below it; a cgroup the runtime removes while this walks
    (a container ending) is skipped, not an error."""
    return [Path(root) for root, _, _ in os.walk(top, onerror=lambda error: None)]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _rmdir(directory: Path) -> None:
    for _ in range(50):  # a cgroup whose last task just died is busy for a moment
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    log.warning("cgroup %s could not be removed", directory)
