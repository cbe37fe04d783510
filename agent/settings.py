"""The agent's settings: one tree of grouped frozen dataclasses, declared once.

Every setting is a field here with its default and what it means where it stands: the
environment a DaemonSet gives the agent sets the ones whose metadata names a variable
(``agent.environment``; ``from_env``, ``ENVIRONMENT`` and ``--help`` are made from those), and
every interval, timeout, retry delay and grace period is a field of a group (discovery,
publishing, the API, DRA, liveness, device plugins, slots, the cross-node protocol), set only by
code. ``run_agent`` puts its tree in use for everything it starts (``current``); tests that
shorten a wait build a tree with ``dataclasses.replace``. A field's own default is what a test or
the demo gets when it builds ``AgentSettings`` without naming it; where that differs from the
environment's default (CDI specs, handler registration: off in-process, on in a DaemonSet) the
field says so. docs/agent-settings.md lists the tree (``python -m agent.settings``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from agent.environment import (
    SettingsError,
    doc_of,
    is_read_from_environment,
    optional,
    or_default,
    path_unless_empty,
    positive,
    required,
    switch,
    tuning,
    variable_of,
)

__all__ = ["ENVIRONMENT", "AgentSettings", "SettingsError", "current", "help_text", "in_use",
           "variable_of"]

DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # Prometheus scrapes the pod IP; tests bind 127.0.0.1
DEFAULT_CDI_SPEC_DIR = Path("/var/run/cdi")
#: Akri's discovery-handlers directory: its handler DaemonSets register there.
DEFAULT_DISCOVERY_HANDLERS_DIR = Path("/var/lib/akri")
DEFAULT_EXTERNAL_HANDLER_GRACE = 300.0
#: The kubelet's DRA plugin directories (used only with DRA=on).
DEFAULT_DRA_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_DRA_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
#: Where a kubelet that rotates its client certificate keeps the current one (key included).
DEFAULT_KUBELET_CLIENT_CERT = Path("/var/lib/kubelet/pki/kubelet-client-current.pem")
DEFAULT_LIVENESS_RENEW_S = 2.0
HELP_WIDTH = 96


@dataclass(frozen=True, kw_only=True)
class DiscoverySettings:
    """Discovery runs: restarts, resyncs, out-of-process handlers, Volcano's device info."""

    restart_backoff_base_s: float = field(default=1.0, metadata=tuning(
        "seconds before the first restart of a failed discovery; doubles per failure in a row"))
    restart_backoff_max_s: float = field(default=60.0, metadata=tuning(
        "the longest wait before restarting a failed discovery"))
    resync_interval_s: float = field(default=600.0, metadata=tuning(
        "seconds between a run's re-reads of its Configuration's properties and Instances, the "
        "net under missed events"))
    relist_interval_s: float = field(default=300.0, metadata=tuning(
        "seconds between full lists of Configurations that catch deletions a watch missed"))
    external_handler_grace_s: float = field(
        default=DEFAULT_EXTERNAL_HANDLER_GRACE, metadata=or_default(
            "EXTERNAL_HANDLER_GRACE_SECONDS", DEFAULT_EXTERNAL_HANDLER_GRACE,
            "how long a registered handler may stay unreachable before its registration is "
            "dropped (a built-in of its name serves again)", float, what="a number",
            shown=f"{DEFAULT_EXTERNAL_HANDLER_GRACE:g}"))
    volcano_refresh_s: float = field(default=300.0, metadata=tuning(
        "seconds between rewrites of Volcano's device-info ConfigMap with a new UpdateTime, as "
        "Huawei's plugin does, when nothing changed"))
    volcano_retry_s: float = field(default=5.0, metadata=tuning(
        "seconds before a failed write of Volcano's device-info ConfigMap is tried again"))


@dataclass(frozen=True, kw_only=True)
class PublishingSettings:
    """Instances written from device lists."""

    serve_batch_s: float = field(default=0.25, metadata=tuning(
        "the shortest batch of newly written devices handed to the node's device table at once "
        "(one CDI write each)"))
    deleted_memory_s: float = field(default=60.0, metadata=tuning(
        "seconds a deletion of an Instance of this node is remembered, to tell it from a label "
        "that went"))
    writes_in_flight: int = field(default=64, metadata=tuning(
        "Instance writes (creates, applies, first verdicts) in flight at once: each device's "
        "calls go in order, devices at once; the API server's round trips, not its CPU, bound "
        "fewer"))


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The API server: watches, the wait for the right to offer, the node's own account."""

    watch_retry_base_s: float = field(default=0.5, metadata=tuning(
        "first wait before reopening a failed watch; doubles on each failure"))
    watch_retry_max_s: float = field(default=2.0, metadata=tuning(
        "the longest wait before reopening a failed watch: a returning API server is seen "
        "this soon"))
    offer_first_wait_s: float = field(default=0.1, metadata=tuning(
        "the first wait between two questions whether the node may offer a Configuration; "
        "doubles up to offer_max_wait_s"))
    offer_max_wait_s: float = field(default=5.0, metadata=tuning(
        "the longest wait between two such questions"))
    offer_warn_after_s: float = field(default=30.0, metadata=tuning(
        "seconds of waiting for that right before a warning is logged"))
    node_token_s: int = field(default=3600, metadata=tuning(
        "seconds the node's own account's tokens are asked to last"))
    node_account_retry_s: float = field(default=10.0, metadata=tuning(
        "seconds before a failed creation of the node's account or token is tried again"))


@dataclass(frozen=True, kw_only=True)
class DraSettings:
    """The DRA driver: the node's ResourceSlices and the kubelet plugin."""

    publish_retry_s: float = field(default=1.0, metadata=tuning(
        "seconds before a failed pass over the node's ResourceSlices runs again"))
    min_pass_interval_s: float = field(default=0.5, metadata=tuning(
        "the shortest time between two passes that write, in a burst of changes"))
    quiet_s: float = field(default=0.1, metadata=tuning(
        "a change this long after the last pass that wrote is written at once, not paced"))
    resync_s: float = field(default=300.0, metadata=tuning(
        "seconds between relists of the node's ResourceSlices, the net under missed events"))
    plugin_stop_grace_s: float = field(default=0.5, metadata=tuning(
        "seconds the kubelet plugin's gRPC server is given to finish its calls when stopping"))
    health_refresh_s: float = field(default=20.0, metadata=tuning(
        "seconds between resends of an unchanged device-health list to the kubelet (KEP-4680)"))
    health_timeout_s: int = field(default=60, metadata=tuning(
        "seconds the kubelet takes a device-health report as current "
        "(health_check_timeout_seconds; three refreshes)"))


@dataclass(frozen=True, kw_only=True)
class LivenessSettings:
    """The node's liveness Lease (with DRA on)."""

    renew_s: float = field(default=DEFAULT_LIVENESS_RENEW_S, metadata=or_default(
        "LIVENESS_RENEW_SECONDS", DEFAULT_LIVENESS_RENEW_S,
        "seconds between renewals of the liveness Lease", positive,
        what="a number above 0", shown=f"{DEFAULT_LIVENESS_RENEW_S:g}"))


@dataclass(frozen=True, kw_only=True)
class DevicePluginSettings:
    """The kubelet's device-plugin and pod-resources APIs: serving, registering, listing."""

    register_timeout_s: float = field(default=5.0, metadata=tuning(
        "seconds one registration with the kubelet may take"))
    register_retry_s: float = field(default=1.0, metadata=tuning(
        "seconds before a failed registration is tried again"))
    kubelet_watch_interval_s: float = field(default=0.1, metadata=tuning(
        "seconds between looks at the kubelet's socket where inotify cannot watch its directory"))
    watch_retry_s: float = field(default=10.0, metadata=tuning(
        "seconds before inotify is tried again on the kubelet's directory"))
    safety_check_s: float = field(default=60.0, metadata=tuning(
        "seconds between checks that every plugin is registered, the net under a missed restart "
        "of the kubelet"))
    hung_up_s: float = field(default=1.0, metadata=tuning(
        "seconds after the kubelet hung up on a plugin's ListAndWatch before it registers again"))
    pod_resources_timeout_s: float = field(default=5.0, metadata=tuning(
        "seconds one pod-resources List may take"))
    stop_grace_s: float = field(default=0.5, metadata=tuning(
        "seconds a plugin's gRPC server is given to finish its calls when stopping"))


@dataclass(frozen=True, kw_only=True)
class SlotSettings:
    """Slots of the device-plugin allocator: passes, sweeps, freeing, recording, display."""

    resync_s: float = field(default=300.0, metadata=tuning(
        "seconds between reconcile passes when nothing changed, the net under missed events"))
    retry_s: float = field(default=1.0, metadata=tuning(
        "seconds before a pass that failed in part runs again"))
    sweep_s: float = field(default=1.0, metadata=tuning(
        "seconds between sweeps of pod-resources while this node holds a slot (the kubelet never "
        "says that a pod has gone)"))
    sweep_awaited_s: float = field(default=0.25, metadata=tuning(
        "seconds between those sweeps while another node's pods wait for a slot this node holds"))
    orphan_grace_s: float = field(default=5.0, metadata=tuning(
        "seconds every pod-resources List since a hand-out must have missed a slot's pod before "
        "the slot is freed"))
    gather_s: float = field(default=0.05, metadata=tuning(
        "seconds promised slots are gathered into one recording write"))
    display_delay_s: float = field(default=0.5, metadata=tuning(
        "seconds after a change before an Instance's display fields (status.used, status.nodes) "
        "are written"))


@dataclass(frozen=True, kw_only=True)
class CrossNodeSettings:
    """The compatibility mode's cross-node protocol: giving a shared device's slot away."""

    withdrawn_within_s: float = field(default=5.0, metadata=tuning(
        "seconds the Node's lowered count may take to show before a give-away is given up"))
    first_poll_s: float = field(default=0.005, metadata=tuning(
        "the first wait between reads of the Node's count; doubles up to max_poll_s"))
    max_poll_s: float = field(default=0.1, metadata=tuning(
        "the longest wait between those reads"))


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Everything the agent needs to start: the settings read from the environment (in the
    order ``--help`` lists them), then the groups of timings."""

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
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    publishing: PublishingSettings = field(default_factory=PublishingSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    dra: DraSettings = field(default_factory=DraSettings)
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    device_plugins: DevicePluginSettings = field(default_factory=DevicePluginSettings)
    slots: SlotSettings = field(default_factory=SlotSettings)
    cross_node: CrossNodeSettings = field(default_factory=CrossNodeSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        """Read the variables ``ENVIRONMENT`` lists."""
        env = os.environ if env is None else env
        read: AgentSettings = _read(cls, env)
        return read


def _read(kind: Any, env: Mapping[str, str]) -> Any:
    given: dict[str, Any] = {}
    for f in fields(kind):
        if is_read_from_environment(f):
            given[f.name] = variable_of(f).read(env)
        elif kind is AgentSettings and f.name in _GROUPS:
            given[f.name] = _read(_GROUPS[f.name], env)
    return kind(**given)


#: The groups of ``AgentSettings``, by field name.
_GROUPS: Final[dict[str, type]] = {
    "discovery": DiscoverySettings, "publishing": PublishingSettings, "api": ApiSettings,
    "dra": DraSettings, "liveness": LivenessSettings, "device_plugins": DevicePluginSettings,
    "slots": SlotSettings, "cross_node": CrossNodeSettings,
}


def leaves(kind: type = AgentSettings, prefix: str = "") -> Iterator[tuple[str, Field[Any]]]:
    """Every setting of the tree, as (dotted path, field), in declaration order."""
    for f in fields(kind):
        if f.name in _GROUPS and kind is AgentSettings:
            yield from leaves(_GROUPS[f.name], f"{f.name}.")
        else:
            yield prefix + f.name, f


#: Every variable the agent reads, in the order ``--help`` lists them.
ENVIRONMENT: Final = tuple(variable_of(f) for _, f in leaves() if is_read_from_environment(f))


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


_IN_USE: Final[contextvars.ContextVar[AgentSettings]] = contextvars.ContextVar("agent_settings")
_DEFAULT: Final = AgentSettings(node_name="")


def current() -> AgentSettings:
    """The tree in use where this runs: the one ``run_agent`` (or ``in_use``) put there, which
    every task it starts inherits; the defaults elsewhere."""
    return _IN_USE.get(_DEFAULT)


@contextlib.contextmanager
def in_use(settings: AgentSettings) -> Iterator[AgentSettings]:
    """Put ``settings`` in use for what runs inside (and the tasks it starts)."""
    token = _IN_USE.set(settings)
    try:
        yield settings
    finally:
        _IN_USE.reset(token)


def reference() -> str:
    """The table of docs/agent-settings.md: every setting, its variable, default and meaning."""
    rows = ["| setting | variable | default | what it is |", "| --- | --- | --- | --- |"]
    for path, f in leaves():
        if is_read_from_environment(f):
            variable = variable_of(f)
            name, default = f"`{variable.name}`", variable.default
        else:
            name, default = "-", repr(f.default)
        rows.append(f"| `{path}` | {name} | `{default}` | {doc_of(f)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # the table of docs/agent-settings.md
    print(reference(), end="")
