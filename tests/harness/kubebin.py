"""Find or build the Kubernetes control-plane binaries the tests and the demo run.

Why this exists: edgeplug is tested against a real etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (and nodes whose device side is the kubelet's own device manager, the
``devicenode`` command), and this machine has no release binaries of them. We build one
multi-call Go program (``tests/harness/kubebin``) from Kubernetes' and etcd's Go modules,
cache it outside the repository keyed by the hash of its sources, and reuse it until the
pinned versions change. A user who already has envtest binaries points ``KUBEBUILDER_ASSETS``
at them and those are used for whatever commands they contain.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KUBE_VERSION = "v1.36.3"
SOURCE_DIR = Path(__file__).resolve().parent / "kubebin"


def source_files() -> list[str]:
    """go.mod, go.sum and every Go file of the program: what the binary is built from."""
    return ["go.mod", "go.sum", *sorted(p.name for p in SOURCE_DIR.glob("*.go"))]


COMMANDS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")


def cache_dir() -> Path:
    """Where built binaries live: ``$EDGEPLUG_CACHE`` or ``~/.cache/edgeplug``."""
    root = os.environ.get("EDGEPLUG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgeplug"
    )
    return Path(root)


def go_build(source_dir: Path, target: Path, *, what: str, package: str = ".",
             ldflags: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Build ``package`` of the Go module in ``source_dir`` into ``target`` (through a
    ``.partial`` file, so an interrupted build never looks done); fails naming ``what`` where Go
    is missing. Every cached Go binary of the harness is built here."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"building {what} needs the Go toolchain ('go' not on PATH)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    flags = ["-ldflags", ldflags] if ldflags is not None else []
    subprocess.run(
        [go, "build", "-trimpath", "-buildvcs=false", *flags, "-o", str(partial), package],
        cwd=source_dir, check=True, env=dict(env) if env is not None else None,
    )
    partial.rename(target)
    return target


def source_digest() -> str:
    """A short digest of the Go sources; a change to any pin gives a new binary."""
    digest = hashlib.sha256()
    for name in source_files():
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def cached_binary() -> Path:
    return cache_dir() / f"kubebin-{KUBE_VERSION}-{source_digest()}"


def build(*, force: bool = False) -> Path:
    """Build the multi-call binary unless an up-to-date one is cached; return its path."""
    target = cached_binary()
    if target.exists() and not force:
        return target
    major, minor = KUBE_VERSION.lstrip("v").split(".")[:2]
    ldflags = " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={KUBE_VERSION}",
            f"-X k8s.io/component-base/version.gitMajor={major}",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
        ]
    )
    log.info("building kube-apiserver, scheduler, controller-manager and etcd into %s", target)
    started = time.monotonic()
    go_build(SOURCE_DIR, target, what="the control plane", ldflags=ldflags)
    log.info("control plane built in %.0f s", time.monotonic() - started)
    return target


@dataclass(frozen=True)
class Binaries:
    """How to run each control-plane command: an argv prefix per command name."""

    argv: dict[str, tuple[str, ...]]

    def command(self, name: str, *args: str) -> list[str]:
        return [*self.argv[name], *args]


def resolve() -> Binaries:
    """Prefer ``KUBEBUILDER_ASSETS`` binaries, fall back to (building) the multi-call binary."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    argv: dict[str, tuple[str, ...]] = {}
    if assets:
        for name in COMMANDS:
            candidate = Path(assets) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                argv[name] = (str(candidate),)
    missing = [name for name in COMMANDS if name not in argv]
    if missing:
        multi = str(build())
        for name in missing:
            argv[name] = (multi, name)
    return Binaries(argv=argv)


def main() -> None:
    """``python -m tests.harness.kubebin``: build (or find) the binaries and print the path."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build())


if __name__ == "__main__":
    main()
