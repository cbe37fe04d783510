"""The controller's settings: one frozen dataclass, filled from the command line.

Why this exists: every interval and grace period the controller uses is named here with its
default, so an operator reads in one place what the controller will wait for, and tests can
shorten them without touching the code. Each setting is declared once, as a field whose
metadata is its flag and help (``controller.options``); ``from_args`` is derived from the
fields. The webhook's flags are ``controller.webhook.settings``'.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.brokers.nodes import DEFAULT_NODE_NOT_READY_GRACE_S
from controller.brokers.plans import (
    DEFAULT_PENDING_GRACE_S,
    DEFAULT_RESTART_BACKOFF_BASE_S,
    DEFAULT_RESTART_BACKOFF_MAX_S,
    BrokerPolicy,
)
from controller.dra.agent_liveness import DEFAULT_AGENT_GRACE_S
from controller.options import add_options, option, option_values
from controller.webhook.settings import WebhookSettings, add_webhook_arguments, webhook_settings

#: How often everything is queued for a full reconcile anyway. Watch events make the controller
#: react at once and deadlines (backoffs, grace periods) are timers, so this is only the net
#: under something missed; a pass over 10,000 Instances costs CPU, so it is rare.
DEFAULT_RESYNC_INTERVAL_S: Final = 300.0
#: How long a replica that stopped heart-beating counts as alive in the peering object. kopf
#: heart-beats every second at lifetimes up to 6 s (every ``lifetime - 5..10`` s beyond), so
#: the standby takes over 4-5 s after the active replica dies (at once when it stops cleanly),
#: and the active replica keeps its place through stalls of up to 4 s. Longer lifetimes only
#: lengthen the gap in which Instances get no broker; shorter ones risk both replicas acting
#: during a stall (harmless: names are deterministic, a second create is a 409).
DEFAULT_PEERING_LIFETIME_S: Final = 5
DEFAULT_PEERING_NAME: Final = "edgeplug-controller"
#: Instances whose Configuration does not exist, older than this, are deleted (left over from a
#: Configuration deleted while the controller was down).
ORPHAN_INSTANCE_GRACE_S: Final = 30.0
PRIORITY_MAX: Final = 2**31 - 1
DEFAULT_METRICS_ADDRESS: Final = "0.0.0.0"


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


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    """Each field is one setting, declared once: its default, and in its metadata the flag
    ``from_args`` reads it from, with the help ``--help`` prints."""

    #: Namespaces to serve; empty means cluster-wide.
    namespaces: tuple[str, ...] = field(default=(), metadata=option(
        "--namespace", "serve only this namespace (repeatable); default: every namespace",
        action="append", default=[], metavar="NAME", finish=lambda given, _: tuple(given)))
    kubeconfig: Path | None = field(default=None, metadata=option(
        "--kubeconfig",
        "kubeconfig file; default: $KUBECONFIG, else the in-cluster service account",
        type=Path, metavar="PATH", finish=_kubeconfig))
    resync_interval_s: float = field(default=DEFAULT_RESYNC_INTERVAL_S, metadata=option(
        "--resync-interval", "seconds between full reconciles of everything, the net under"
        " missed events (default: %(default)s)", type=float, metavar="S"))
    pending_grace_s: float = field(default=DEFAULT_PENDING_GRACE_S, metadata=option(
        "--pending-grace", "seconds a broker pod may stay Pending before it is recreated"
        " (default: %(default)s)", type=float, metavar="S"))
    restart_backoff_base_s: float = field(default=DEFAULT_RESTART_BACKOFF_BASE_S, metadata=option(
        "--restart-backoff-base", "seconds before a failed or finished broker is recreated the"
        " first time; doubles per recreation (default: %(default)s)", type=float, metavar="S"))
    restart_backoff_max_s: float = field(default=DEFAULT_RESTART_BACKOFF_MAX_S, metadata=option(
        "--restart-backoff-max", "the longest wait, in seconds, before recreating a failed"
        " broker (default: %(default)s)", type=float, metavar="S"))
    node_not_ready_grace_s: float = field(default=DEFAULT_NODE_NOT_READY_GRACE_S, metadata=option(
        "--node-not-ready-grace", "seconds a node may be NotReady before it is removed from its"
        " Instances and its slots freed (default: %(default)s)", type=float, metavar="S"))
    orphan_instance_grace_s: float = field(default=ORPHAN_INSTANCE_GRACE_S, metadata=option(
        "--orphan-instance-grace", "seconds an Instance whose Configuration is gone is kept"
        " before it is deleted (default: %(default)s)", type=float, metavar="S"))
    #: Peering (high availability): ``None`` runs standalone.
    peering_name: str | None = field(default=DEFAULT_PEERING_NAME, metadata=option(
        "--peering-name", "name of the KopfPeering (or ClusterKopfPeering) object the replicas"
        " elect the active one through (default: %(default)s)", metavar="NAME",
        extra=(("--standalone", {"action": "store_true", "help": "no peering: this replica"
                                 " always acts (run one replica only; default: off)"}),),
        finish=_peering_name))
    peering_lifetime_s: int = field(default=DEFAULT_PEERING_LIFETIME_S, metadata=option(
        "--peering-lifetime", "seconds a replica that stopped heart-beating still counts as"
        " alive: the standby takes over this long after the active replica dies"
        " (default: %(default)s)", type=int, metavar="S"))
    priority: int = field(default_factory=_random_priority, metadata=option(
        "--priority", "peering priority, 1 to 2**31-1: the highest live replica acts"
        " (default: random, so replicas of one Deployment differ)", type=int, metavar="N",
        finish=_priority))
    #: The validating admission webhook for Configurations (off unless ``--webhook``); its
    #: flags are controller.webhook.settings'.
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    #: The Prometheus ``/metrics`` server: ``None`` serves none.
    metrics_port: int | None = field(default=None, metadata=option(
        "--metrics-port", "serve Prometheus metrics on this port at /metrics (default: no"
        " metrics server)", type=int, metavar="PORT"))
    metrics_address: str = field(default=DEFAULT_METRICS_ADDRESS, metadata=option(
        "--metrics-address", "address the metrics server binds (default: %(default)s)",
        metavar="ADDRESS"))
    #: DRA: one DeviceClass per Configuration (``controller.dra.device_classes``); off by default.
    dra: bool = field(default=False, metadata=option(
        "--dra", "keep one DRA DeviceClass (resource.k8s.io/v1) per Configuration, for claims"
        " on the devices agents with DRA=on publish, and the Instances' servedBy and claims"
        " display fields; needed by brokerDeviceAccess: dra (default: off)",
        action="store_true"))
    agent_grace_s: float = field(default=DEFAULT_AGENT_GRACE_S, metadata=option(
        "--agent-grace", "with --dra: seconds an agent's liveness Lease may go unrenewed"
        " (at least its own leaseDurationSeconds) before its node stops being offered its"
        " devices; 0: never (default: %(default)s)", type=float, metavar="S"))
    dra_extended_resources: bool = field(default=False, metadata=option(
        "--dra-extended-resources", "with --dra: each DeviceClass also maps the Configuration's"
        " configuration-level resource, so pods asking for it are served through DRA on nodes"
        " without the device plugin (default: off)", action="store_true"))

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def policy(self) -> BrokerPolicy:
        return BrokerPolicy(
            pending_grace_s=self.pending_grace_s,
            restart_backoff_base_s=self.restart_backoff_base_s,
            restart_backoff_max_s=self.restart_backoff_max_s,
        )

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> ControllerSettings:
        parser = argparse.ArgumentParser(
            prog="edgeplug-controller",
            description="Creates broker pods, jobs and services for edgeplug Instances.",
        )
        add_options(parser, cls)
        add_webhook_arguments(parser)
        args = parser.parse_args(argv)
        return cls(**option_values(cls, args), webhook=webhook_settings(args))
