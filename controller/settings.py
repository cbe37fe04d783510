"""The controller's settings: one tree of grouped frozen dataclasses, declared once.

Every interval, timeout, retry delay and grace period the controller uses is a field here, with
its doc and default where it stands; a field with a flag carries it (``controller.options``), and
``--help`` and docs/controller-settings.md are made from the tree. ``main`` hands each part its
group; tests shorten waits by building a tree (``dataclasses.replace``) or passing flags.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.options import add_options, option, settings_from, tuning

PRIORITY_MAX: Final = 2**31 - 1
#: The namespace the controller is installed in when the pod cannot say.
DEFAULT_NAMESPACE: Final = "edgeplug-system"
#: Where a pod learns its own namespace (the service-account volume).
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_ANY_ADDRESSES: Final = frozenset({"0.0.0.0", "::", ""})


def own_namespace() -> str:
    """The controller's own namespace: $POD_NAMESPACE, else the pod's, else the default."""
    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def _random_priority() -> int:
    # Replicas of one Deployment share their arguments; kopf pauses replicas of equal priority,
    # so each draws its own (and the highest live one is active).
    return random.SystemRandom().randint(1, PRIORITY_MAX)


def _kubeconfig(given: Path | None, _: argparse.Namespace) -> Path | None:
    return given or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)


def _peering_name(given: str, args: argparse.Namespace) -> str | None:
    return None if args.standalone else given


def _priority(given: int | None, _: argparse.Namespace) -> int:
    return given if given is not None else _random_priority()


def _webhook_namespace(given: str | None, _: argparse.Namespace) -> str:
    return given or own_namespace()


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """The engine: watches into the state, the work queue."""

    resync_interval_s: float = field(default=300.0, metadata=option(
        "--resync-interval", "seconds between full reconciles of everything, the net under"
        " missed events: watch events make the controller react at once and deadlines are"
        " timers, so it is rare (default: %(default)s)", type=float, metavar="S"))
    queue_retry_first_s: float = field(default=0.5, metadata=tuning(
        "seconds before a key whose reconcile failed runs again; doubles per failure in a row"))
    queue_retry_max_s: float = field(default=30.0, metadata=tuning(
        "the longest wait before a failed key runs again"))


@dataclass(frozen=True, kw_only=True)
class PeeringSettings:
    """High availability: which replica acts (kopf's peering)."""

    name: str | None = field(default="edgeplug-controller", metadata=option(
        "--peering-name", "name of the KopfPeering (or ClusterKopfPeering) object the replicas"
        " elect the active one through (default: %(default)s)", metavar="NAME",
        extra=(("--standalone", {"action": "store_true", "help": "no peering: this replica"
                                 " always acts (run one replica only; default: off)"}),),
        finish=_peering_name))
    lifetime_s: int = field(default=5, metadata=option(
        "--peering-lifetime", "seconds a replica that stopped heart-beating still counts as"
        " alive: the standby takes over this long after the active replica dies; kopf"
        " heart-beats every second up to 6 s, so stalls shorter than this keep the active"
        " replica in place (default: %(default)s)", type=int, metavar="S"))
    priority: int = field(default_factory=_random_priority, metadata=option(
        "--priority", "peering priority, 1 to 2**31-1: the highest live replica acts"
        " (default: random, so replicas of one Deployment differ)", type=int, metavar="N",
        finish=_priority))
    setup_retry_s: float = field(default=2.0, metadata=tuning(
        "seconds between attempts to create the peering object while the API is unreachable"))
    expiry_margin_s: float = field(default=0.05, metadata=tuning(
        "seconds past a peer's expiry the standby looks again (the timer fires just after it)"))
    kopf_first_backoffs_s: tuple[float, ...] = field(default=(0.5, 1.0, 2.0), metadata=tuning(
        "kopf's first retry delays for its API requests (peering keep-alive, its watches)"))
    kopf_backoff_max_s: float = field(default=3.0, metadata=tuning(
        "kopf's retry delay after its first ones, forever: a returning API server is seen"
        " quickly and an outage of any length is ridden out"))


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The API client layer: requests, watches, writes in flight."""

    request_timeout_s: float = field(default=30.0, metadata=tuning(
        "seconds one REST request (not a watch) may take in all"))
    writes_in_flight: int = field(default=20, metadata=tuning(
        "broker creates and deletes in flight at once (the write connections' pool)"))
    watch_timeout_s: int = field(default=300, metadata=tuning(
        "seconds a watch asks the API server to keep it open before it is reopened"))
    watch_timeout_jitter_s: int = field(default=60, metadata=tuning(
        "up to this many seconds added at random to each watch's timeout, so watches do not"
        " all reopen at once"))
    watch_read_margin_s: float = field(default=30.0, metadata=tuning(
        "seconds past its timeout a silent watch is given before it counts as broken"))
    watch_retry_first_s: float = field(default=0.25, metadata=tuning(
        "seconds before a broken watch is reopened; doubles per failure in a row"))
    watch_retry_max_s: float = field(default=2.0, metadata=tuning(
        "the longest wait before reopening a broken watch"))


@dataclass(frozen=True, kw_only=True)
class BrokerSettings:
    """Brokers: their pods' lifecycle, Configurations' status, nodes that left."""

    pending_grace_s: float = field(default=300.0, metadata=option(
        "--pending-grace", "seconds a broker pod may stay Pending before it is recreated"
        " (default: %(default)s)", type=float, metavar="S"))
    restart_backoff_base_s: float = field(default=1.0, metadata=option(
        "--restart-backoff-base", "seconds before a failed or finished broker is recreated the"
        " first time; doubles per recreation (default: %(default)s)", type=float, metavar="S"))
    restart_backoff_max_s: float = field(default=300.0, metadata=option(
        "--restart-backoff-max", "the longest wait, in seconds, before recreating a failed"
        " broker (default: %(default)s)", type=float, metavar="S"))
    node_not_ready_grace_s: float = field(default=300.0, metadata=option(
        "--node-not-ready-grace", "seconds a node may be NotReady before it is removed from its"
        " Instances and its slots freed (default: %(default)s)", type=float, metavar="S"))
    orphan_instance_grace_s: float = field(default=30.0, metadata=option(
        "--orphan-instance-grace", "seconds an Instance whose Configuration is gone is kept"
        " before it is deleted (left over from a Configuration deleted while the controller"
        " was down) (default: %(default)s)", type=float, metavar="S"))
    node_missing_grace_s: float = field(default=10.0, metadata=tuning(
        "seconds a node an Instance lists may be absent from the API before it counts as"
        " deleted (a node just registering is not yet in the watch)"))
    status_debounce_s: float = field(default=1.0, metadata=tuning(
        "seconds a Configuration's status write waits for more changes to gather"))
    refusal_retry_s: float = field(default=30.0, metadata=tuning(
        "seconds creates are held back after the API server refused one for that generation"
        " (a spec change retries at once)"))
    recent_create_s: float = field(default=5.0, metadata=tuning(
        "seconds an object just created is not created again while the watch has not shown it"))
    event_window_s: float = field(default=1.0, metadata=tuning(
        "seconds routine creations and deletions on a Configuration gather into one Event"))


@dataclass(frozen=True, kw_only=True)
class DraSettings:
    """The scheduler's allocator (DRA): classes, shared pools, agents' liveness, usage."""

    enabled: bool = field(default=False, metadata=option(
        "--dra", "keep one DRA DeviceClass (resource.k8s.io/v1) per Configuration, for claims"
        " on the devices agents with DRA=on publish, and the Instances' servedBy and claims"
        " display fields; needed by brokerDeviceAccess: dra (default: off)",
        action="store_true"))
    agent_grace_s: float = field(default=6.0, metadata=option(
        "--agent-grace", "with --dra: seconds an agent's liveness Lease may go unrenewed"
        " (at least its own leaseDurationSeconds) before its node stops being offered its"
        " devices; 0: never (default: %(default)s)", type=float, metavar="S"))
    extended_resources: bool = field(default=False, metadata=option(
        "--dra-extended-resources", "with --dra: each DeviceClass also maps the Configuration's"
        " configuration-level resource, so pods asking for it are served through DRA on nodes"
        " without the device plugin (default: off)", action="store_true"))
    classes_retry_s: float = field(default=5.0, metadata=tuning(
        "seconds before a failed DeviceClass pass or Configuration watch is tried again"))
    instance_classes_retry_s: float = field(default=5.0, metadata=tuning(
        "seconds before a failed per-Instance DeviceClass pass or watch is tried again"))
    instance_classes_pass_delay_s: float = field(default=0.05, metadata=tuning(
        "seconds per-Instance DeviceClass changes gather before one pass writes them"))
    instance_classes_writes_in_flight: int = field(default=16, metadata=tuning(
        "per-Instance DeviceClass writes in flight at once"))
    shared_pools_retry_s: float = field(default=1.0, metadata=tuning(
        "seconds before a failed shared-pool pass is tried again"))
    shared_pools_pass_delay_s: float = field(default=0.05, metadata=tuning(
        "seconds shared-pool changes gather before one pass writes them"))
    shared_pools_writes_in_flight: int = field(default=16, metadata=tuning(
        "shared-pool slice writes in flight at once"))
    liveness_forbidden_retry_s: float = field(default=30.0, metadata=tuning(
        "seconds before the agents' Leases are read again after the API server refused it"))
    gone_taints_retry_s: float = field(default=1.0, metadata=tuning(
        "seconds before a failed pass over the gone agents' taints is tried again"))
    usage_pass_delay_s: float = field(default=0.5, metadata=tuning(
        "seconds changes gather before the Instances' servedBy and claims are written"))
    usage_writes_in_flight: int = field(default=16, metadata=tuning(
        "Instance display writes in flight at once"))


@dataclass(frozen=True, kw_only=True)
class GrantsSettings:
    """The Roles letting each node's agent read its Configurations' Secrets and offer them."""

    retry_s: float = field(default=5.0, metadata=tuning(
        "seconds before a failed pass or watch over the agents' Roles is tried again"))
    coalesce_s: float = field(default=0.05, metadata=tuning(
        "seconds changes gather before one pass writes the Roles"))


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    """The validating admission webhook for Configurations (off unless ``--webhook``)."""

    enabled: bool = field(default=False, metadata=option(
        "--webhook", "serve the validating admission webhook that runs each Configuration's"
        " handler's parse_details at apply (default: off)", action="store_true"))
    address: str = field(default="0.0.0.0", metadata=option(
        "--webhook-address", "address the webhook's HTTPS server listens on"
        " (default: %(default)s)", metavar="ADDR"))
    port: int = field(default=8443, metadata=option(
        "--webhook-port", "TCP port of the webhook's HTTPS server (default: %(default)s)",
        type=int, metavar="PORT"))
    namespace: str = field(default=DEFAULT_NAMESPACE, metadata=option(
        "--webhook-namespace", "namespace of the webhook's Service and certificate Secret"
        f" (default: $POD_NAMESPACE, else the pod's own, else {DEFAULT_NAMESPACE})",
        default=None, metavar="NAME", finish=_webhook_namespace))
    service: str = field(default="edgeplug-controller-webhook", metadata=option(
        "--webhook-service", "Service the API server calls the webhook through; its DNS names"
        " go into the serving certificate (default: %(default)s)", metavar="NAME"))
    secret: str = field(default="edgeplug-controller-webhook-tls", metadata=option(
        "--webhook-secret", "Secret the replicas share the webhook's CA and serving certificate"
        " through (default: %(default)s)", metavar="NAME"))
    configuration: str = field(default="edgeplug-configurations", metadata=option(
        "--webhook-configuration", "ValidatingWebhookConfiguration whose caBundle the"
        " controller keeps current (default: %(default)s)", metavar="NAME"))
    cert_check_interval_s: float = field(default=3600.0, metadata=option(
        "--webhook-cert-check-interval", "seconds between checks of the certificates' expiry"
        " and the caBundle; rotation happens months before expiry, and a replica picks up"
        " there a certificate another rotated (default: %(default)s)", type=float,
        metavar="S"))
    allow_unknown_handlers: bool = field(default=False, metadata=option(
        "--webhook-allow-unknown-handlers", "admit a Configuration naming a handler not"
        " installed in the controller, with a warning, instead of refusing it (default: off)",
        action="store_true"))
    retry_s: float = field(default=5.0, metadata=tuning(
        "seconds before the certificate Secret or the webhook configuration is tried again"
        " after it could not be read or written (API down, a conflict with another replica,"
        " the configuration not installed yet)"))

    @property
    def dns_names(self) -> tuple[str, ...]:
        """The names the API server may reach the Service by (the serving cert's DNS SANs)."""
        base = f"{self.service}.{self.namespace}"
        return (base, f"{base}.svc", f"{base}.svc.cluster.local")

    @property
    def ip_addresses(self) -> tuple[str, ...]:
        """The listening address when it is one IP (a loopback ``url:`` webhook), else none."""
        if self.address in _ANY_ADDRESSES:
            return ()
        try:
            return (str(ipaddress.ip_address(self.address)),)
        except ValueError:
            return ()


@dataclass(frozen=True, kw_only=True)
class MetricsSettings:
    """The Prometheus ``/metrics`` server."""

    port: int | None = field(default=None, metadata=option(
        "--metrics-port", "serve Prometheus metrics on this port at /metrics (default: no"
        " metrics server)", type=int, metavar="PORT"))
    address: str = field(default="0.0.0.0", metadata=option(
        "--metrics-address", "address the metrics server binds (default: %(default)s)",
        metavar="ADDRESS"))
    refresh_interval_s: float = field(default=5.0, metadata=tuning(
        "seconds between refreshes of the gauges computed from the state"))


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """Every setting of the controller, by group; each declared once, on its field."""

    namespaces: tuple[str, ...] = field(default=(), metadata=option(
        "--namespace", "serve only this namespace (repeatable); default: every namespace",
        action="append", default=[], metavar="NAME", finish=lambda given, _: tuple(given)))
    kubeconfig: Path | None = field(default=None, metadata=option(
        "--kubeconfig",
        "kubeconfig file; default: $KUBECONFIG, else the in-cluster service account",
        type=Path, metavar="PATH", finish=_kubeconfig))
    engine: EngineSettings = field(default_factory=EngineSettings)
    peering: PeeringSettings = field(default_factory=PeeringSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    brokers: BrokerSettings = field(default_factory=BrokerSettings)
    dra: DraSettings = field(default_factory=DraSettings)
    grants: GrantsSettings = field(default_factory=GrantsSettings)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="edgeplug-controller",
            description="Creates broker pods, jobs and services for edgeplug Instances.",
        )
        add_options(parser, cls)
        return parser

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ControllerSettings:
        result: ControllerSettings = settings_from(cls, cls.parser().parse_args(argv))
        return result


if __name__ == "__main__":  # the table of docs/controller-settings.md
    from controller.options import reference

    print(reference(ControllerSettings), end="")
