"""The agent's settings, read once from the environment a DaemonSet gives it.

Why this exists: ``main`` is wiring only; tests and the demo build ``AgentSettings`` directly
and run the agent in-process, with short timings where a real node uses long ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # Prometheus scrapes the pod IP; tests bind 127.0.0.1


class SettingsError(ValueError):
    """The environment lacks or garbles a setting; the message names the variable."""


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent needs to start. ``namespace`` None watches every namespace."""

    node_name: str
    kubeconfig: Path | None = None
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    namespace: str | None = None
    serve_device_plugins: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        """``NODE_NAME`` (required), ``KUBECONFIG`` (else in-cluster), ``PLUGIN_DIR``,
        ``POD_RESOURCES_SOCKET`` (empty: none), ``METRICS_PORT`` (unset: no metrics server),
        ``METRICS_ADDRESS`` (what the metrics server binds; default all addresses),
        ``WATCH_NAMESPACE`` (unset: all namespaces), ``DEVICE_PLUGINS`` (``off``: discovery
        only, no kubelet plugins)."""
        env = os.environ if env is None else env
        node_name = env.get("NODE_NAME", "").strip()
        if not node_name:
            raise SettingsError("NODE_NAME is required (the DaemonSet sets it from spec.nodeName)")
        metrics_port: int | None = None
        if env.get("METRICS_PORT"):
            try:
                metrics_port = int(env["METRICS_PORT"])
            except ValueError as exc:
                raise SettingsError(f"METRICS_PORT must be an integer: {exc}") from exc
        pod_resources = env.get("POD_RESOURCES_SOCKET", str(DEFAULT_POD_RESOURCES_SOCKET))
        return cls(
            node_name=node_name,
            kubeconfig=Path(env["KUBECONFIG"]) if env.get("KUBECONFIG") else None,
            plugin_dir=Path(env.get("PLUGIN_DIR") or DEFAULT_PLUGIN_DIR),
            pod_resources_socket=Path(pod_resources) if pod_resources else None,
            metrics_port=metrics_port,
            metrics_address=env.get("METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
            namespace=env.get("WATCH_NAMESPACE") or None,
            serve_device_plugins=env.get("DEVICE_PLUGINS", "on").lower() != "off",
        )
