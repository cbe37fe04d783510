"""What both kubelet stand-ins are made of: the node's name, API server, plugin folder, optional
pod-resources socket, labels and CDI folders.

``NodeEmulator`` (Python) and ``DeviceNode`` (the kubelet's own device manager)
take the same constructor, since a test may get either (``NodeEmulator`` hands its arguments on
to a ``DeviceNode`` when ``EDGEPLUG_KUBELET=devicenode``); this class keeps that one signature,
and what it stores, in one place. A stand-in builds its own parts in ``_build``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.harness.kube_waits import NodeWaits
from tests.harness.kubelet_devices import KUBELET_SOCKET


class NodeStandIn(NodeWaits):
    """A kubelet stand-in's identity and paths; ``wait_for`` from ``NodeWaits``."""

    def __init__(self, *, node_name: str, kubeconfig: Path, plugin_dir: Path,
                 pod_resources_socket: Path | None = None,
                 labels: Mapping[str, str] | None = None,
                 cdi_spec_dirs: Sequence[Path] | None = None) -> None:
        """``cdi_spec_dirs``: where the node's runtime resolves CDI names (the agent's CDI
        directory); None is a runtime with CDI disabled, which ignores them."""
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.plugin_dir = plugin_dir
        self.pod_resources_socket = pod_resources_socket
        self.labels = dict(labels or {})
        self.cdi_spec_dirs = tuple(cdi_spec_dirs or ())
        self._build()

    def _build(self) -> None:
        """Make the stand-in's own parts from the fields above (nothing is started)."""

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET
