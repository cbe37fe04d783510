"""Resolve CDI device names as a CDI-enabled container runtime does, for tests and the emulator.

The agent writes CDI spec files and returns CDI names from ``Allocate``;
containerd and CRI-O resolve those names through the CDI project's Go module and fail container
creation when one does not resolve. ``tests/harness/cditool`` is a small Go program over that
same module (built once through the Go module proxy and cached beside the control plane); this
module builds it and turns its JSON into Python values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.kubebin import cache_dir, go_build

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "cditool"
SOURCE_FILES = ("go.mod", "go.sum", "main.go")
TOOL_TIMEOUT_S = 30.0


class CdiUnresolvable(Exception):
    """A CDI name the runtime could not resolve; the message is the CDI module's."""


@dataclass(frozen=True)
class CdiDeviceNode:
    path: str
    type: str
    major: int
    minor: int
    permissions: str


@dataclass(frozen=True)
class CdiEdits:
    """What the runtime injected into the container for the resolved names."""

    env: Mapping[str, str]
    device_nodes: tuple[CdiDeviceNode, ...]
    mounts: tuple[tuple[str, str, tuple[str, ...]], ...]  # (host source, container path, options)


def tool() -> Path:
    """The cditool binary, built once per source version."""
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        digest.update((SOURCE_DIR / name).read_bytes())
    target = cache_dir() / f"cditool-{digest.hexdigest()[:16]}"
    if target.exists():
        return target
    log.info("building cditool (a resolver over the CDI project's Go module) into %s", target)
    started = time.monotonic()
    built = go_build(SOURCE_DIR, target, what="cditool")
    log.info("cditool built in %.0f s", time.monotonic() - started)
    return built


def _run(args: Sequence[str]) -> str:
    done = subprocess.run(
        [str(tool()), *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise CdiUnresolvable(done.stderr.strip() or f"cditool exited {done.returncode}")
    return done.stdout


def validate(spec_dirs: Sequence[Path]) -> tuple[list[str], dict[str, list[str]]]:
    """Every device name the specs define, and the parse/validation errors per spec file."""
    report = json.loads(_run(["validate", *map(str, spec_dirs)]))
    return list(report["devices"]), dict(report["errors"])


def resolve(spec_dirs: Sequence[Path], names: Sequence[str]) -> CdiEdits:
    """Inject ``names`` into an empty OCI spec; raises ``CdiUnresolvable`` like a runtime fails."""
    report = json.loads(_run(["resolve", *map(str, spec_dirs), "--", *names]))
    env = dict(item.split("=", 1) for item in report["env"] or [])
    nodes = tuple(
        CdiDeviceNode(n["path"], n["type"], n["major"], n["minor"], n.get("permissions") or "")
        for n in report["deviceNodes"]
    )
    mounts = tuple(
        (m["source"], m["destination"], tuple(m["options"] or ())) for m in report["mounts"]
    )
    return CdiEdits(env=env, device_nodes=nodes, mounts=mounts)


def main() -> None:
    """``python -m tests.harness.cdi``: build (or find) cditool and print its path."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(tool())


if __name__ == "__main__":
    main()
