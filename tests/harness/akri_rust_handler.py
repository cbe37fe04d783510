"""Build and run the Rust discovery handler written to Akri's protocol (``akri_rust_handler/``).

Akri's own handlers are Rust programs serving gRPC with upstream tonic, whose
HTTP/2 layer (h2) checks each request's ``:authority`` as RFC 9113 asks; grpc-go's server (the
Go test handler) and Python's ``h2`` accept any value there. This handler is the stack the agent
has to satisfy. It is built by cargo from crates.io (pinned by its ``Cargo.lock``), its ``.proto``
compiled by grpcio-tools' protoc, and cached in ``~/.cache/edgeplug`` keyed by its sources like
the Go handler; cargo's build directory is kept there too, so a change to ``main.rs`` rebuilds
in seconds. ``RustHandler`` runs it against an agent's discovery-handlers directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.aio_process import ChildProcess
from tests.harness.kubebin import cache_dir, files_digest

SOURCE_DIR = Path(__file__).resolve().parent / "akri_rust_handler"
SOURCE_FILES = ("Cargo.toml", "Cargo.lock", "build.rs", "src/main.rs", "discovery.proto")
BINARY_NAME = "akri-rust-handler"
BUILD_TIMEOUT_S = 900.0
EXIT_TIMEOUT_S = 10.0


def binary() -> Path:
    """The handler binary, built once per version of its sources."""
    target = cache_dir() / f"akrirusthandler-{files_digest(SOURCE_DIR, SOURCE_FILES)}"
    if target.exists():
        return target
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not os.access(cargo, os.X_OK):
        raise RuntimeError("building the Rust Akri test handler needs cargo (not on PATH, "
                           "nor in ~/.cargo/bin)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="akrirusthandler-") as tmp:
        build = Path(tmp)
        for name in SOURCE_FILES:
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SOURCE_DIR / name, build / name)
        protoc = build / "protoc"  # prost-build runs $PROTOC; grpcio-tools carries one
        protoc.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m grpc_tools.protoc "$@"\n')
        protoc.chmod(0o755)
        env = {**os.environ, "PROTOC": str(protoc),
               "CARGO_TARGET_DIR": str(cache_dir() / "akrirusthandler-target")}
        subprocess.run([cargo, "build", "--locked", "--quiet"], cwd=build, env=env, check=True,
                       timeout=BUILD_TIMEOUT_S)
        partial = target.with_suffix(".partial")
        shutil.copy(Path(env["CARGO_TARGET_DIR"]) / "debug" / BINARY_NAME, partial)
        partial.rename(target)
    return target


class RustHandler(ChildProcess):
    """One run of the handler: ``start``, ``kill`` (SIGKILL, as a crashed pod), ``stop``.
    ``refuse`` makes it answer every ``Discover`` with that error (INVALID_ARGUMENT); ``socket``
    serves on that path instead of ``<directory>/<name>.sock``; ``prefix`` goes before every
    device id."""

    grace_s = EXIT_TIMEOUT_S

    def __init__(self, directory: Path, *, name: str = "debugEcho", shared: bool = True,
                 refuse: str | None = None, socket: Path | None = None, prefix: str = "",
                 log_path: Path | None = None) -> None:
        self.directory = directory
        self.args = [f"-name={name}", f"-shared={'true' if shared else 'false'}"]
        if refuse is not None:
            self.args.append(f"-refuse={refuse}")
        if socket is not None:
            self.args.append(f"-socket={socket}")
        if prefix:
            self.args.append(f"-prefix={prefix}")
        self.log_path = log_path
        self.process = None

    def start(self) -> None:
        env = {**os.environ, "DISCOVERY_HANDLERS_DIRECTORY": str(self.directory)}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen([str(binary()), *self.args], env=env, stdout=out,
                                        stderr=out)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
