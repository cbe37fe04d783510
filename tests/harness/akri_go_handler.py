"""Build and run the Go discovery handler written to Akri's protocol (``akri_handler/``).

An Akri user's handler is another process in another language, speaking Akri's
``v0`` gRPC API. The test handler is compiled from its own copy of the ``.proto`` (protoc from
grpcio-tools with the Go plugins built from their modules, the module proxy supplying them) and
cached in ``~/.cache/edgeplug`` keyed by its sources, like the control plane. ``GoHandler``
runs it against an agent's discovery-handlers directory and kills or restarts it.
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

SOURCE_DIR = Path(__file__).resolve().parent / "akri_handler"
SOURCE_FILES = ("go.mod", "go.sum", "main.go", "discovery.proto")
PLUGINS = ("google.golang.org/protobuf/cmd/protoc-gen-go",
           "google.golang.org/grpc/cmd/protoc-gen-go-grpc")
BUILD_TIMEOUT_S = 600.0
EXIT_TIMEOUT_S = 10.0


def binary() -> Path:
    """The handler binary, built once per version of its sources."""
    target = cache_dir() / f"akrihandler-{files_digest(SOURCE_DIR, SOURCE_FILES)}"
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("building the Akri test handler needs Go ('go' not on PATH)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="akrihandler-") as tmp:
        build = Path(tmp)
        for name in SOURCE_FILES:
            shutil.copy(SOURCE_DIR / name, build / name)
        (build / "bin").mkdir()
        (build / "v0").mkdir()
        _run(build, go, "build", "-o", f"{build / 'bin'}/", *PLUGINS)
        _run(build,
            sys.executable, "-m", "grpc_tools.protoc", "-I.",
            f"--plugin=protoc-gen-go={build / 'bin' / 'protoc-gen-go'}",
            f"--plugin=protoc-gen-go-grpc={build / 'bin' / 'protoc-gen-go-grpc'}",
            "--go_out=v0", "--go_opt=paths=source_relative",
            "--go-grpc_out=v0", "--go-grpc_opt=paths=source_relative", "discovery.proto",
        )
        partial = target.with_suffix(".partial")
        _run(build, go, "build", "-trimpath", "-buildvcs=false", "-o", str(partial), ".")
        partial.rename(target)
    return target


def _run(cwd: Path, *args: str) -> None:
    subprocess.run(args, cwd=cwd, check=True, timeout=BUILD_TIMEOUT_S)


class GoHandler(ChildProcess):
    """One run of the handler: ``start``, ``kill`` (SIGKILL, as a crashed pod), ``stop``."""

    grace_s = EXIT_TIMEOUT_S

    def __init__(self, directory: Path, *, name: str = "debugEcho", shared: bool = True,
                 network: bool = False, log_path: Path | None = None) -> None:
        self.directory = directory
        self.args = [f"-name={name}", f"-shared={'true' if shared else 'false'}",
                     f"-network={'true' if network else 'false'}"]
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
