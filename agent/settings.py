"""The agent's settings, read once from the environment a DaemonSet gives it.

Why this exists: ``main`` is wiring only; tests and the demo build ``AgentSettings`` directly
and run the agent in-process, with short timings where a real node uses long ones.
``ENVIRONMENT`` lists every variable the agent reads, with its default and meaning, and is what
``edgeplug-agent --help`` prints.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # Prometheus scrapes the pod IP; tests bind 127.0.0.1
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
#: Akri's discovery-handlers directory: its handler DaemonSets register there.
DEFAULT_DISCOVERY_HANDLERS_DIR = Path("/var/lib/akri")
#: Seconds an out-of-process handler may stay unreachable before its name is free again.
DEFAULT_EXTERNAL_HANDLER_GRACE = 300.0
#: The kubelet's DRA plugin directories (used only with DRA=on).
DEFAULT_DRA_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_DRA_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
HELP_WIDTH = 96


@dataclass(frozen=True)
class EnvironmentVariable:
    name: str
    default: str
    meaning: str


#: Every variable the agent reads: (name, default as shown, meaning).
ENVIRONMENT = (
    EnvironmentVariable("NODE_NAME", "(required)",
                        "this node's name; the DaemonSet sets it from spec.nodeName"),
    EnvironmentVariable("KUBECONFIG", "(in-cluster)",
                        "kubeconfig file; unset: the pod's ServiceAccount"),
    EnvironmentVariable("PLUGIN_DIR", str(DEFAULT_PLUGIN_DIR),
                        "the kubelet's device-plugin directory (kubelet.sock and plugin sockets)"),
    EnvironmentVariable("POD_RESOURCES_SOCKET", str(DEFAULT_POD_RESOURCES_SOCKET),
                        "the kubelet's pod-resources socket, to free slots of vanished pods; "
                        "empty: none"),
    EnvironmentVariable("CDI_SPEC_DIR", str(DEFAULT_CDI_SPEC_DIR),
                        "where CDI spec files for served devices are written (a CDI-enabled "
                        "containerd or CRI-O reads them); empty: no CDI specs, no CDI names"),
    EnvironmentVariable("METRICS_PORT", "(unset)",
                        "port of the Prometheus /metrics server; unset: no metrics server"),
    EnvironmentVariable("METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS,
                        "address the metrics server binds"),
    EnvironmentVariable("WATCH_NAMESPACE", "(all)",
                        "the one namespace whose Configurations this agent serves"),
    EnvironmentVariable("DEVICE_PLUGINS", "on",
                        "off: discovery and Instances only, no kubelet device plugins"),
    EnvironmentVariable("DISCOVERY_HANDLERS_DIRECTORY", str(DEFAULT_DISCOVERY_HANDLERS_DIR),
                        "where Akri's out-of-process discovery handlers register "
                        "(agent-registration.sock); empty: no registration service"),
    EnvironmentVariable("EXTERNAL_HANDLER_GRACE_SECONDS", f"{DEFAULT_EXTERNAL_HANDLER_GRACE:g}",
                        "how long a registered handler may stay unreachable before its "
                        "registration is dropped (a built-in of its name serves again)"),
    EnvironmentVariable("DRA", "off",
                        "on: also publish this node's devices as DRA ResourceSlices "
                        "(resource.k8s.io/v1, driver edgeplug.io; docs/dra.md)"),
    EnvironmentVariable("DRA_PLUGINS_DIR", str(DEFAULT_DRA_PLUGINS_DIR),
                        "with DRA=on: the kubelet's plugins directory (the DRA service socket "
                        "and the prepared-claims record go under edgeplug.io/)"),
    EnvironmentVariable("DRA_REGISTRY_DIR", str(DEFAULT_DRA_REGISTRY_DIR),
                        "with DRA=on: the kubelet's plugins_registry directory; empty: no "
                        "kubelet DRA plugin (slices only)"),
)


class SettingsError(ValueError):
    """The environment lacks or garbles a setting; the message names the variable."""


@dataclass(frozen=True)
class AgentSettings:
    """Everything the agent needs to start. ``namespace`` None watches every namespace;
    ``cdi_spec_dir`` None writes no CDI specs (the environment's default is ``/var/run/cdi``);
    ``discovery_handlers_dir`` None hosts no handler registration (the environment's default is
    Akri's ``/var/lib/akri``)."""

    node_name: str
    kubeconfig: Path | None = None
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    namespace: str | None = None
    serve_device_plugins: bool = True
    cdi_spec_dir: Path | None = None
    discovery_handlers_dir: Path | None = None
    external_handler_grace: float = DEFAULT_EXTERNAL_HANDLER_GRACE
    serve_dra: bool = False
    dra_plugins_dir: Path = DEFAULT_DRA_PLUGINS_DIR
    dra_registry_dir: Path | None = DEFAULT_DRA_REGISTRY_DIR

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        """Read the variables ``ENVIRONMENT`` lists."""
        env = os.environ if env is None else env
        node_name = env.get("NODE_NAME", "").strip()
        if not node_name:
            raise SettingsError(
                "NODE_NAME is required (the DaemonSet sets it from spec.nodeName); "
                "see edgeplug-agent --help"
            )
        metrics_port: int | None = None
        if env.get("METRICS_PORT"):
            try:
                metrics_port = int(env["METRICS_PORT"])
            except ValueError as exc:
                raise SettingsError(f"METRICS_PORT must be an integer: {exc}") from exc
        pod_resources = env.get("POD_RESOURCES_SOCKET", str(DEFAULT_POD_RESOURCES_SOCKET))
        cdi_dir = env.get("CDI_SPEC_DIR", str(DEFAULT_CDI_SPEC_DIR))
        handlers_dir = env.get("DISCOVERY_HANDLERS_DIRECTORY", str(DEFAULT_DISCOVERY_HANDLERS_DIR))
        registry = env.get("DRA_REGISTRY_DIR", str(DEFAULT_DRA_REGISTRY_DIR))
        try:
            grace = float(env.get("EXTERNAL_HANDLER_GRACE_SECONDS")
                          or DEFAULT_EXTERNAL_HANDLER_GRACE)
        except ValueError as exc:
            raise SettingsError(f"EXTERNAL_HANDLER_GRACE_SECONDS must be a number: {exc}") from exc
        return cls(
            node_name=node_name,
            kubeconfig=Path(env["KUBECONFIG"]) if env.get("KUBECONFIG") else None,
            plugin_dir=Path(env.get("PLUGIN_DIR") or DEFAULT_PLUGIN_DIR),
            pod_resources_socket=Path(pod_resources) if pod_resources else None,
            metrics_port=metrics_port,
            metrics_address=env.get("METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
            namespace=env.get("WATCH_NAMESPACE") or None,
            serve_device_plugins=env.get("DEVICE_PLUGINS", "on").lower() != "off",
            cdi_spec_dir=Path(cdi_dir) if cdi_dir else None,
            discovery_handlers_dir=Path(handlers_dir) if handlers_dir else None,
            external_handler_grace=grace,
            serve_dra=env.get("DRA", "off").lower() == "on",
            dra_plugins_dir=Path(env.get("DRA_PLUGINS_DIR") or DEFAULT_DRA_PLUGINS_DIR),
            dra_registry_dir=Path(registry) if registry else None,
        )


def help_text() -> str:
    """What ``edgeplug-agent --help`` prints."""
    width = max(len(v.name) for v in ENVIRONMENT)
    lines = [
        "usage: edgeplug-agent [--help]",
        "",
        "The edgeplug node agent: runs the discovery handlers that Configurations selecting this",
        "node name, publishes one Instance per device and serves each as a kubelet device plugin.",
        "It takes no arguments; it reads these environment variables:",
        "",
    ]
    indent = " " * (width + 4)
    for var in ENVIRONMENT:
        text = f"{var.meaning} (default: {var.default})"
        wrapped = textwrap.wrap(text, HELP_WIDTH - len(indent))
        lines.append(f"  {var.name:<{width}}  {wrapped[0]}")
        lines.extend(indent + line for line in wrapped[1:])
    return "\n".join(lines)
