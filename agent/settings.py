"""The agent's settings, read once from the environment a DaemonSet gives it.

Why this exists: ``main`` is wiring only; tests and the demo build ``AgentSettings`` directly
and run the agent in-process, with short timings where a real node uses long ones.

Each setting is declared once, as a field of ``AgentSettings`` whose metadata is its
``EnvironmentVariable``: the variable's name, its default as ``edgeplug-agent --help`` shows it,
its meaning, and how its value is read. ``from_env``, ``ENVIRONMENT`` and ``help_text`` are
derived from those fields. A field's own default is what a test or the demo gets when it builds
``AgentSettings`` without naming the setting; where that differs from the environment's default
(CDI specs, handler registration: off in-process, on in a DaemonSet) the field says so.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Final, TypeVar

T = TypeVar("T")

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
#: Where a kubelet that rotates its client certificate keeps the current one (key included).
DEFAULT_KUBELET_CLIENT_CERT = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
#: How often the liveness Lease is renewed (with DRA on); the Lease says it lasts three times
#: as long, and the controller's grace is at least that.
DEFAULT_LIVENESS_RENEW_S = 2.0
HELP_WIDTH = 96
_VARIABLE: Final = "environment_variable"


class SettingsError(ValueError):
    """The environment lacks or garbles a setting; the message names the variable."""


#: How a variable's value becomes its setting: (the variable's name, its value or None when
#: unset) -> the setting. Raises SettingsError naming the variable.
Reader = Callable[[str, str | None], Any]


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable the agent reads: its name, its default as ``--help`` shows it, its meaning."""

    name: str
    default: str
    meaning: str
    reader: Reader = field(repr=False, compare=False)

    def read(self, env: Mapping[str, str]) -> Any:
        return self.reader(self.name, env.get(self.name))


def _variable(name: str, default: str, meaning: str, reader: Reader) -> dict[str, Any]:
    """A field's metadata: the variable it is read from."""
    return {_VARIABLE: EnvironmentVariable(name, default, meaning, reader)}


def _converted(name: str, raw: str, convert: Callable[[str], T], what: str) -> T:
    try:
        return convert(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be {what}: {exc}") from exc


def _positive(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{raw!r} is not a finite number above 0")
    return value


def required(name: str, meaning: str) -> dict[str, Any]:
    """Unset or blank: refused. Surrounding blanks are dropped."""
    def read(var: str, raw: str | None) -> str:
        value = (raw or "").strip()
        if not value:
            raise SettingsError(f"{var} is required ({meaning}); see edgeplug-agent --help")
        return value
    return _variable(name, "(required)", meaning, read)


def or_default(name: str, default: T, meaning: str, convert: Callable[[str], T], *,
               what: str = "", shown: str | None = None) -> dict[str, Any]:
    """Unset or empty: ``default``; else ``convert`` of the value (``what`` it must be)."""
    def read(var: str, raw: str | None) -> T:
        return _converted(var, raw, convert, what) if raw else default
    return _variable(name, str(default) if shown is None else shown, meaning, read)


def optional(name: str, unset: str, meaning: str, convert: Callable[[str], T], *,
             what: str = "") -> dict[str, Any]:
    """Unset or empty: None (``unset`` says what that means in ``--help``)."""
    def read(var: str, raw: str | None) -> T | None:
        return _converted(var, raw, convert, what) if raw else None
    return _variable(name, unset, meaning, read)


def path_unless_empty(name: str, default: Path, meaning: str) -> dict[str, Any]:
    """Unset: ``default``; empty: None (the feature off); else the path given."""
    def read(var: str, raw: str | None) -> Path | None:
        value = str(default) if raw is None else raw
        return Path(value) if value else None
    return _variable(name, str(default), meaning, read)


def switch(name: str, default: bool, meaning: str) -> dict[str, Any]:
    """``on``/``off`` (any case); only the word opposite to ``default`` changes it."""
    opposite = "off" if default else "on"

    def read(var: str, raw: str | None) -> bool:
        return (not default) if (raw or "").lower() == opposite else default
    return _variable(name, "on" if default else "off", meaning, read)


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Everything the agent needs to start, each field read from the variable its metadata
    names (``from_env``), in the order ``--help`` lists them."""

    node_name: str = field(metadata=required(
        "NODE_NAME", "this node's name; the DaemonSet sets it from spec.nodeName"))
    kubeconfig: Path | None = field(default=None, metadata=optional(
        "KUBECONFIG", "(in-cluster)", "kubeconfig file; unset: the pod's ServiceAccount", Path))
    plugin_dir: Path = field(default=DEFAULT_PLUGIN_DIR, metadata=or_default(
        "PLUGIN_DIR", DEFAULT_PLUGIN_DIR,
        "the kubelet's device-plugin directory (kubelet.sock and plugin sockets)", Path))
    pod_resources_socket: Path | None = field(
        default=DEFAULT_POD_RESOURCES_SOCKET, metadata=path_unless_empty(
            "POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET,
            "the kubelet's pod-resources socket, to free slots of vanished pods; empty: none"))
    #: In-process default None: no CDI specs, no CDI names.
    cdi_spec_dir: Path | None = field(default=None, metadata=path_unless_empty(
        "CDI_SPEC_DIR", DEFAULT_CDI_SPEC_DIR,
        "where CDI spec files for served devices are written (a CDI-enabled containerd or "
        "CRI-O reads them); empty: no CDI specs, no CDI names"))
    metrics_port: int | None = field(default=None, metadata=optional(
        "METRICS_PORT", "(unset)",
        "port of the Prometheus /metrics server; unset: no metrics server", int,
        what="an integer"))
    metrics_address: str = field(default=DEFAULT_METRICS_ADDRESS, metadata=or_default(
        "METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS, "address the metrics server binds", str))
    #: None: every namespace.
    namespace: str | None = field(default=None, metadata=optional(
        "WATCH_NAMESPACE", "(all)", "the one namespace whose Configurations this agent serves",
        str))
    serve_device_plugins: bool = field(default=True, metadata=switch(
        "DEVICE_PLUGINS", True, "off: discovery and Instances only, no kubelet device plugins"))
    #: In-process default None: no handler registration service.
    discovery_handlers_dir: Path | None = field(default=None, metadata=path_unless_empty(
        "DISCOVERY_HANDLERS_DIRECTORY", DEFAULT_DISCOVERY_HANDLERS_DIR,
        "where Akri's out-of-process discovery handlers register (agent-registration.sock); "
        "empty: no registration service"))
    external_handler_grace: float = field(
        default=DEFAULT_EXTERNAL_HANDLER_GRACE, metadata=or_default(
            "EXTERNAL_HANDLER_GRACE_SECONDS", DEFAULT_EXTERNAL_HANDLER_GRACE,
            "how long a registered handler may stay unreachable before its registration is "
            "dropped (a built-in of its name serves again)", float, what="a number",
            shown=f"{DEFAULT_EXTERNAL_HANDLER_GRACE:g}"))
    serve_dra: bool = field(default=False, metadata=switch(
        "DRA", False, "on: also publish this node's devices as DRA ResourceSlices "
        "(resource.k8s.io/v1, driver edgeplug.io; docs/dra.md)"))
    dra_plugins_dir: Path = field(default=DEFAULT_DRA_PLUGINS_DIR, metadata=or_default(
        "DRA_PLUGINS_DIR", DEFAULT_DRA_PLUGINS_DIR,
        "with DRA=on: the kubelet's plugins directory (the DRA service socket and the "
        "prepared-claims record go under edgeplug.io/)", Path))
    dra_registry_dir: Path | None = field(
        default=DEFAULT_DRA_REGISTRY_DIR, metadata=path_unless_empty(
            "DRA_REGISTRY_DIR", DEFAULT_DRA_REGISTRY_DIR,
            "with DRA=on: the kubelet's plugins_registry directory; empty: no kubelet DRA "
            "plugin (slices only)"))
    #: In-process default None: this node's pods and claims are read with the agent's client.
    kubelet_client_cert: Path | None = field(default=None, metadata=path_unless_empty(
        "KUBELET_CLIENT_CERT", DEFAULT_KUBELET_CLIENT_CERT,
        "the kubelet's client certificate, with which the pods bound here and the claims the "
        "kubelet asks to prepare are read (the Node authorizer allows only this node's); "
        "empty: read with the agent's own token (deploy/README.md)"))
    #: In-process default None: Secrets and ConfigMaps are read with the agent's own client.
    node_accounts_namespace: str | None = field(default=None, metadata=optional(
        "NODE_ACCOUNTS_NAMESPACE", "(unset)",
        "the namespace of the nodes' own ServiceAccounts (node-<node>), as which this node "
        "reads the Secrets and ConfigMaps its Configurations name (deploy/README.md; the "
        "DaemonSets set edgeplug-system-nodes); unset: read with the agent's own token", str))
    volcano_device_info: bool = field(default=False, metadata=switch(
        "VOLCANO_DEVICE_INFO", False,
        "on: keep Huawei's device-info ConfigMap kube-system/mindx-dl-deviceinfo-<node> for "
        "Volcano's Ascend scheduling, from this node's ascend chips (docs/handlers/ascend.md; "
        "the right is deploy/ascend's)"))
    kubelet_client_key: Path | None = field(default=None, metadata=optional(
        "KUBELET_CLIENT_KEY", "(in the certificate file)",
        "the key of KUBELET_CLIENT_CERT, where it is a file of its own", Path))
    #: In-process default None: no liveness Lease.
    liveness_namespace: str | None = field(default=None, metadata=optional(
        "LIVENESS_LEASE_NAMESPACE", "(unset)",
        "with DRA=on: the namespace of this node's liveness Lease, edgeplug-agent-<node> "
        "(the install's; the controller stops offering the node's devices when it is not "
        "renewed: docs/dra.md); unset: no Lease", str))
    liveness_renew_s: float = field(default=DEFAULT_LIVENESS_RENEW_S, metadata=or_default(
        "LIVENESS_RENEW_SECONDS", DEFAULT_LIVENESS_RENEW_S,
        "seconds between renewals of the liveness Lease", _positive,
        what="a number above 0", shown=f"{DEFAULT_LIVENESS_RENEW_S:g}"))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        """Read the variables ``ENVIRONMENT`` lists."""
        env = os.environ if env is None else env
        return cls(**{f.name: variable_of(f).read(env) for f in fields(cls)})


def variable_of(setting: Field[Any]) -> EnvironmentVariable:
    """The variable an ``AgentSettings`` field is read from."""
    found: EnvironmentVariable = setting.metadata[_VARIABLE]
    return found


#: Every variable the agent reads, in the order ``--help`` lists them.
ENVIRONMENT: Final = tuple(variable_of(f) for f in fields(AgentSettings))


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
