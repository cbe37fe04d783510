"""The emulated runtime's part in container creation: resolve CDI names as containerd/CRI-O do.

The kubelet hands the CDI names a plugin's Allocate returned to the container
runtime, and a CDI-enabled runtime resolves them from the spec files in its spec directories at
container creation; a name it cannot resolve fails the container. The emulator does the same
through ``tests/harness/cdi.py`` (the CDI project's own Go module) for the spec directories it is
given; without any it is a runtime with CDI disabled, which ignores the names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from tests.harness import cdi

#: Reasons a container that could not be created is reported with: the kubelet's own step
#: failed (GetDeviceRunContainerOptions, e.g. PreStartContainer), or the runtime's did.
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
CREATE_CONTAINER_ERROR = "CreateContainerError"


class ContainerCreateError(Exception):
    """A container could not be created; ``reason`` says which step failed."""

    def __init__(self, container: str, message: str, *,
                 reason: str = CREATE_CONTAINER_ERROR) -> None:
        super().__init__(message)
        self.container = container
        self.reason = reason


async def resolve_cdi(container: str, names: Sequence[str],
                      spec_dirs: Sequence[Path] | None) -> cdi.CdiEdits | None:
    """The runtime's edits for one container's CDI names (None: no names, or CDI disabled);
    ContainerCreateError when a name does not resolve."""
    if not spec_dirs or not names:
        return None
    try:
        return await asyncio.to_thread(cdi.resolve, spec_dirs, names)
    except cdi.CdiUnresolvable as error:
        raise ContainerCreateError(container, str(error)) from error
