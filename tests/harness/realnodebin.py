"""Find or build the binaries of the tests' real node: kubelet, containerd 2, its shim, ctr, CNI.

The real-node tests (tests/harness/realnode.py) run the kubelet itself with
containerd 2 and runc, and this machine has no release binaries of them. The kubelet is built
from ``k8s.io/kubernetes`` at the control plane's pin through a module of its own
(``tests/harness/realnodebin``: Kubernetes needs replace directives, so ``go install
pkg@version`` refuses it), which also holds the sandbox image's ``pause``. containerd, its runc
shim, ``ctr`` (to import the test images) and the CNI ``bridge``, ``loopback`` and
``host-local`` plugins are built with ``go install pkg@version``, so their dependencies are
exactly the ones upstream pins. runc is Debian's (``.ci/apt/realnode.txt``). Everything lands in
one directory of ``~/.cache/edgeplug`` named after the pins and the sources' digest, and is
reused until they change. A missing piece stops with a message naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.harness.kubebin import (
    KUBE_VERSION,
    cache_dir,
    module_file,
    version_flags,
    version_ldflags,
)

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "realnodebin"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_VERSION = "v2.4.2"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
CNI_MODULE = "github.com/containernetworking/plugins"
CNI_VERSION = "v1.10.0"
CNI_PLUGINS = ("main/bridge", "main/loopback", "ipam/host-local")
TIMINGS_FILE = "build-seconds.json"


def source_files() -> list[Path]:
    """The selected version's module and sum files and every Go file (``kubebin``'s scheme)."""
    mod = module_file()
    return [SOURCE_DIR / mod, SOURCE_DIR / (mod.removesuffix(".mod") + ".sum"),
            *sorted(SOURCE_DIR.rglob("*.go"))]


def cached_dir() -> Path:
    """The directory for these pins and sources (it exists only once a build finished)."""
    digest = hashlib.sha256(f"{CONTAINERD_VERSION} {CNI_VERSION}".encode())
    for path in source_files():
        digest.update(str(path.relative_to(SOURCE_DIR)).encode())
        digest.update(path.read_bytes())
    return cache_dir() / f"realnode-{KUBE_VERSION}-{CONTAINERD_VERSION}-{digest.hexdigest()[:12]}"


def runc() -> Path:
    """Debian's runc: containerd's shim runs it by name, so it must be on PATH."""
    found = shutil.which("runc")
    if found is None:
        raise RuntimeError("the real node needs runc on PATH (Debian package 'runc', "
                           "listed in .ci/apt/realnode.txt)")
    return Path(found)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("building the real node needs the Go toolchain ('go' not on PATH)")
    return go


def _run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, cwd=cwd, env=env, check=True)
    return time.monotonic() - started


def _build_into(partial: Path) -> dict[str, float]:
    go = _go()
    kube_ldflags = f"-s -w {version_ldflags()}"
    base = ["-trimpath", "-buildvcs=false"]
    env = dict(os.environ)
    static = {**env, "CGO_ENABLED": "0"}
    seconds: dict[str, float] = {}
    seconds["kubelet"] = _run(
        [go, "build", *base, *version_flags(), "-ldflags", kube_ldflags,
         "-o", str(partial / "kubelet"), "."],
        cwd=SOURCE_DIR, env=env)
    seconds["pause"] = _run(
        [go, "build", *base, *version_flags(), "-ldflags", "-s -w",
         "-o", str(partial / "pause"), "./pause"],
        cwd=SOURCE_DIR, env=static)
    containerd_ldflags = f"-s -w -X {CONTAINERD_MODULE}/version.Version={CONTAINERD_VERSION}"
    seconds["containerd"] = _run(
        [go, "install", *base, "-ldflags", containerd_ldflags,
         *(f"{CONTAINERD_MODULE}/cmd/{name}@{CONTAINERD_VERSION}" for name in CONTAINERD_COMMANDS)],
        cwd=partial, env={**static, "GOBIN": str(partial), "GOFLAGS": ""})
    (partial / "cni").mkdir()
    seconds["cni"] = _run(
        [go, "install", *base, "-ldflags", "-s -w",
         *(f"{CNI_MODULE}/plugins/{name}@{CNI_VERSION}" for name in CNI_PLUGINS)],
        cwd=partial, env={**static, "GOBIN": str(partial / "cni"), "GOFLAGS": ""})
    return seconds


def build(*, force: bool = False) -> Path:
    """Build the real node's binaries unless an up-to-date set is cached; return the directory."""
    target = cached_dir()
    if target.is_dir() and not force:
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log.info("building kubelet %s, containerd %s, runc shim, ctr and CNI plugins %s into %s",
             KUBE_VERSION, CONTAINERD_VERSION, CNI_VERSION, target)
    started = time.monotonic()
    seconds = _build_into(partial)
    seconds["total"] = time.monotonic() - started
    (partial / TIMINGS_FILE).write_text(json.dumps(seconds, indent=1))
    if force:
        shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log.info("real node built in %.0f s (%s)", seconds["total"],
             ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items() if k != "total"))
    return target


def main() -> None:
    """``python -m tests.harness.realnodebin``: build (or find) the binaries, print the dir."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runc()
    print(build())


if __name__ == "__main__":
    main()
