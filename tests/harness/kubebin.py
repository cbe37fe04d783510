"""Find or build the Kubernetes control-plane binaries the tests and the demo run.

Edgeplug is tested against a real etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (and nodes whose device side is the kubelet's own device manager, the
``devicenode`` command), and this machine has no release binaries of them. We build one
multi-call Go program (``tests/harness/kubebin``) from Kubernetes' and etcd's Go modules,
cache it outside the repository keyed by the hash of its sources, and reuse it until the
pinned versions change. A user who already has envtest binaries points ``KUBEBUILDER_ASSETS``
at them and those are used for whatever commands they contain.

Two Kubernetes minors are pinned: the newest (what ``make demo`` and the suite run) and the
oldest minor upstream still supports (the compatibility run). The Go sources are the same for
both; each version has its own module file (``go.mod``, or ``go.<minor>.mod`` beside it, built
with ``go build -modfile``), so each pin is one file and its ``go.sum``. ``EDGEPLUG_KUBE_VERSION``
chooses the version a process and the tests it starts run (default: the newest).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "kubebin"
#: The newest minor: what ``make demo`` and the suite run unless told otherwise.
NEWEST_VERSION = "v1.37.2"
#: The oldest minor upstream still supports: the compatibility run (README, "Versions").
OLDEST_VERSION = "v1.35.4"
#: Each pinned version and the module file (in a Go module directory) that pins it.
MODULE_FILES: Mapping[str, str] = {NEWEST_VERSION: "go.mod", OLDEST_VERSION: "go.v1.35.mod"}
#: The Go build tag of a version whose kubelet internals differ from the newest's
#: (``kubebin/kubeapi_v135.go``; the newest's are ``kubeapi_newest.go``).
BUILD_TAGS: Mapping[str, str] = {OLDEST_VERSION: "kube135"}
#: The environment variable that chooses the version: a key of ``MODULE_FILES``, or one of
#: ``ALIASES`` (the Makefile says ``oldest``, so the pin is written only here).
VERSION_ENV = "EDGEPLUG_KUBE_VERSION"
ALIASES: Mapping[str, str] = {"newest": NEWEST_VERSION, "oldest": OLDEST_VERSION}


def selected_version() -> str:
    """The version ``$EDGEPLUG_KUBE_VERSION`` names, the newest by default; an unpinned one is an
    error naming the pinned ones."""
    wanted = os.environ.get(VERSION_ENV) or NEWEST_VERSION
    version = ALIASES.get(wanted, wanted)
    if version not in MODULE_FILES:
        raise RuntimeError(f"{VERSION_ENV}={version!r}: the harness pins only "
                           f"{', '.join(MODULE_FILES)}")
    return version


KUBE_VERSION = selected_version()


def module_file(version: str = KUBE_VERSION) -> str:
    """The module file that pins ``version`` (its ``go.sum`` is the same name, ``.sum``)."""
    return MODULE_FILES[version]


def version_flags(version: str = KUBE_VERSION) -> list[str]:
    """``go build`` flags that build against ``version``'s module file, with its build tag."""
    name = module_file(version)
    flags = [] if name == "go.mod" else [f"-modfile={name}"]
    if version in BUILD_TAGS:
        flags.append(f"-tags={BUILD_TAGS[version]}")
    return flags


def version_ldflags(version: str = KUBE_VERSION) -> str:
    """Linker flags that make the binaries report ``version`` (as a release build does)."""
    major, minor = version.lstrip("v").split(".")[:2]
    return " ".join([
        f"-X k8s.io/component-base/version.gitVersion={version}",
        f"-X k8s.io/component-base/version.gitMajor={major}",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
    ])


def source_files() -> list[str]:
    """The version's module and sum files and every Go file: what the binary is built from."""
    mod = module_file()
    return [mod, mod.removesuffix(".mod") + ".sum",
            *sorted(p.name for p in SOURCE_DIR.glob("*.go"))]


COMMANDS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")


def cache_dir() -> Path:
    """Where built binaries live: ``$EDGEPLUG_CACHE`` or ``~/.cache/edgeplug``."""
    root = os.environ.get("EDGEPLUG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgeplug"
    )
    return Path(root)


def go_build(source_dir: Path, target: Path, *, what: str, package: str = ".",
             ldflags: str | None = None, env: Mapping[str, str] | None = None,
             flags: tuple[str, ...] = ()) -> Path:
    """Build ``package`` of the Go module in ``source_dir`` into ``target`` (through a
    ``.partial`` file, so an interrupted build never looks done); fails naming ``what`` where Go
    is missing. Every cached Go binary of the harness is built here."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"building {what} needs the Go toolchain ('go' not on PATH)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    link = ["-ldflags", ldflags] if ldflags is not None else []
    subprocess.run(
        [go, "build", "-trimpath", "-buildvcs=false", *flags, *link, "-o", str(partial), package],
        cwd=source_dir, check=True, env=dict(env) if env is not None else None,
    )
    partial.rename(target)
    return target


def files_digest(source_dir: Path, names: Iterable[str]) -> str:
    """A short digest of the named files of ``source_dir`` (names and contents): the key of
    every binary the harness builds and caches from sources in the repository."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update((source_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def source_digest() -> str:
    """A short digest of the Go sources; a change to any pin gives a new binary."""
    return files_digest(SOURCE_DIR, source_files())


def cached_binary() -> Path:
    return cache_dir() / f"kubebin-{KUBE_VERSION}-{source_digest()}"


def build(*, force: bool = False) -> Path:
    """Build the multi-call binary unless an up-to-date one is cached; return its path."""
    target = cached_binary()
    if target.exists() and not force:
        return target
    log.info("building kube-apiserver, scheduler, controller-manager and etcd %s from their Go "
             "modules into %s (a few minutes on a fresh machine; once)", KUBE_VERSION, target)
    started = time.monotonic()
    go_build(SOURCE_DIR, target, what="the control plane", ldflags=f"-s -w {version_ldflags()}",
             flags=tuple(version_flags()))
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
