"""The kubelet stand-ins' set-up, written once for the tests that hold them to the kubelet.

Tests/integration/test_devicenode_parity.py runs each of its tests against
both stand-ins (the Python ``NodeEmulator`` and ``DeviceNode``, the kubelet's own device
manager), and test_devicenode.py the DeviceNode-only ones. Both need the same set-up: short
temporary directories (a Unix socket path must fit in 108 bytes) for the plugin sockets and for
the CDI specs the node's runtime reads, a node on the real control plane that is stopped and its
Node deleted afterwards, and fresh resource names.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests.harness.devicenode import DeviceNode
from tests.harness.node_emulator import NodeEmulator

HEALTHY = "Healthy"

#: A stand-in class: ``NodeEmulator`` (whichever ``EDGEPLUG_KUBELET`` picks) or ``DeviceNode``.
Node = TypeVar("Node", NodeEmulator, DeviceNode)


@dataclass(frozen=True)
class NodeDirs:
    """Where a stand-in keeps its sockets and where its runtime reads CDI specs."""

    plugin_dir: Path
    cdi_dir: Path

    @property
    def pod_resources_socket(self) -> Path:
        return self.plugin_dir.parent / f"{self.plugin_dir.name}.pr"


@contextmanager
def node_dirs() -> Iterator[NodeDirs]:
    """Fresh directories under /tmp (short socket paths), removed afterwards."""
    dirs = NodeDirs(plugin_dir=Path(tempfile.mkdtemp(prefix="ep-dnp-", dir="/tmp")),
                    cdi_dir=Path(tempfile.mkdtemp(prefix="ep-cdi-", dir="/tmp")))
    try:
        yield dirs
    finally:
        shutil.rmtree(dirs.plugin_dir, ignore_errors=True)
        shutil.rmtree(dirs.cdi_dir, ignore_errors=True)
        dirs.pod_resources_socket.unlink(missing_ok=True)


@asynccontextmanager
async def running_node(kind: type[Node], kubeconfig: Path, dirs: NodeDirs) -> AsyncIterator[Node]:
    """A started stand-in of ``kind`` serving pod-resources and resolving CDI names from
    ``dirs.cdi_dir``; stopped, and its Node deleted, on the way out."""
    node = kind(node_name=f"sn-{uuid.uuid4().hex[:8]}", kubeconfig=kubeconfig,
                plugin_dir=dirs.plugin_dir, pod_resources_socket=dirs.pod_resources_socket,
                cdi_spec_dirs=[dirs.cdi_dir])
    await node.start()
    try:
        yield node
    finally:
        await node.stop(delete_node=True)


def new_resource(prefix: str = "dev") -> str:
    """A resource name no other test uses."""
    return f"test.edgeplug.io/{prefix}-{uuid.uuid4().hex[:8]}"
