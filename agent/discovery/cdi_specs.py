"""CDI spec files for the devices this node serves, so a CDI-enabled runtime can resolve them.

``CdiSpecs.write`` writes one Configuration's spec atomically (or removes it with the last device);
``render`` builds its body. A CDI name is handed out only once its spec is on disk
(docs/handlers.md, "CDI"; docs/architecture.md, "The agent's discovery modules").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.discovery.container_devices import broker_envs
from agent.discovery.node_devices import NodeDevice
from crds.api import GROUP
from discovery_handlers.contract import ComposingHandler

log = logging.getLogger(__name__)

#: CDI spec version written: the lowest that carries device-node ``hostPath`` and
#: ``permissions`` (0.5.0) and that containerd 1.7+, containerd 2.x and CRI-O all accept.
CDI_VERSION = "0.6.0"
#: Prefix of every spec file the agent owns (so a sweep never touches another vendor's).
FILE_PREFIX = f"{GROUP}-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def spec_path(directory: Path, namespace: str, configuration: str) -> Path:
    """``<dir>/edgeplug.io-<namespace>_<configuration>.json`` (names made file-safe)."""
    name = _UNSAFE.sub("_", f"{namespace}_{configuration}")
    return directory / f"{FILE_PREFIX}{name}.json"


def device_name(cdi_name: str) -> str:
    """``edgeplug.io/cam=1a2b3c`` → ``1a2b3c``."""
    return cdi_name.partition("=")[2]


#: Handler class → whether it is a ``ComposingHandler`` (``isinstance`` against a
#: runtime-checkable Protocol walks its members each call, as ``node_devices._prepares`` says;
#: a spec renders every device of its Configuration).
_COMPOSING: dict[type, bool] = {}


def _composes(handler: object) -> bool:
    known = _COMPOSING.get(type(handler))
    if known is None:
        known = _COMPOSING[type(handler)] = isinstance(handler, ComposingHandler)
    return known


def _edits(device: NodeDevice) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if not _composes(device.handler):
        envs = broker_envs(device.instance, device.properties)
        if envs:
            edits["env"] = [f"{k}={v}" for k, v in sorted(envs.items())]
    nodes = [
        {"path": s.container_path, "hostPath": s.host_path, "permissions": s.permissions}
        for s in device.device.device_specs
    ]
    if nodes:
        edits["deviceNodes"] = nodes
    mounts = [
        {
            "hostPath": m.host_path,
            "containerPath": m.container_path,
            "options": ["bind", "ro"] if m.read_only else ["bind"],
        }
        for m in device.device.mounts
    ]
    if mounts:
        edits["mounts"] = mounts
    return edits


def render(configuration: str, devices: Iterable[NodeDevice]) -> dict[str, Any]:
    """The spec holding ``devices`` (all of one Configuration, each with its ``cdi_name``)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": f"{GROUP}/{configuration}",
        "devices": [
            {"name": device_name(d.cdi_name), "containerEdits": _edits(d)}
            for d in sorted(devices, key=lambda d: d.cdi_name)
        ],
    }


class CdiSpecs:
    """Writes and removes this agent's spec files in one directory (None: CDI off)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def remove_all(self) -> None:
        """At start: drop every spec an earlier run left (runs write theirs again)."""
        if self.directory is None or not self.directory.is_dir():
            return
        for path in self.directory.glob(f"{FILE_PREFIX}*.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def write(self, namespace: str, configuration: str, devices: list[NodeDevice]) -> bool:
        """Make the spec hold exactly ``devices`` (each with its ``cdi_name``); no devices
        removes it. True when the spec is on disk afterwards."""
        if self.directory is None:
            return False
        path = spec_path(self.directory, namespace, configuration)
        if not devices:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return False
        body = json.dumps(render(configuration, devices), indent=1)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if path.read_text(encoding="utf-8") == body:
                    return True
            fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
        except OSError as error:
            log.warning(
                "cannot write CDI spec %s (%s); Allocate answers without CDI names", path, error,
                extra={"configuration": f"{namespace}/{configuration}"},
            )
            return False
        return True
