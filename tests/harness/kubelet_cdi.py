"""The emulated runtime's part in container creation: resolve CDI names as containerd/CRI-O do.

Why this exists: the kubelet hands the CDI names a plugin's Allocate returned to the container
runtime, and a CDI-enabled runtime resolves them from the spec files in its spec directories at
container creation; a name it cannot resolve fails the container. The emulator does the same
through ``tests/harness/cdi.py`` (the CDI project's own Go module) for the spec directories it is
given; without any it is a runtime with CDI disabled, which ignores the names.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from tests.harness import cdi
from tests.harness.kubelet_records import ContainerAllocation

#: The reason a runtime's failure to create a container is reported with.
CREATE_CONTAINER_ERROR = "CreateContainerError"


class ContainerCreateError(Exception):
    """The runtime could not create a container (an unresolvable CDI name)."""

    def __init__(self, container: str, message: str) -> None:
        super().__init__(message)
        self.container = container


async def create_containers(allocations: Sequence[ContainerAllocation],
                            spec_dirs: Sequence[Path] | None) -> list[ContainerAllocation]:
    """The allocations with each container's CDI names resolved (``cdi_edits``), container by
    container in pod order; ContainerCreateError for the first container that fails."""
    if not spec_dirs:
        return list(allocations)
    names: dict[str, list[str]] = {}
    for allocation in allocations:
        names.setdefault(allocation.container, []).extend(allocation.cdi_devices)
    edits: dict[str, cdi.CdiEdits] = {}
    for container, wanted in names.items():
        if not wanted:
            continue
        try:
            edits[container] = await asyncio.to_thread(cdi.resolve, spec_dirs, wanted)
        except cdi.CdiUnresolvable as error:
            raise ContainerCreateError(container, str(error)) from error
    return [dataclasses.replace(a, cdi_edits=edits.get(a.container)) for a in allocations]
