"""The controller's settings: one frozen dataclass, filled from the command line.

Why this exists: every interval and grace period the controller uses is named here with its
default, so an operator reads in one place what the controller will wait for, and tests can
shorten them without touching the code.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.nodes import DEFAULT_NODE_NOT_READY_GRACE_S
from controller.plans import (
    DEFAULT_PENDING_GRACE_S,
    DEFAULT_RESTART_BACKOFF_BASE_S,
    DEFAULT_RESTART_BACKOFF_MAX_S,
    BrokerPolicy,
)
from controller.webhook_settings import WebhookSettings, add_webhook_arguments, webhook_settings

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


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    #: Namespaces to serve; empty means cluster-wide.
    namespaces: tuple[str, ...] = ()
    kubeconfig: Path | None = None
    resync_interval_s: float = DEFAULT_RESYNC_INTERVAL_S
    pending_grace_s: float = DEFAULT_PENDING_GRACE_S
    restart_backoff_base_s: float = DEFAULT_RESTART_BACKOFF_BASE_S
    restart_backoff_max_s: float = DEFAULT_RESTART_BACKOFF_MAX_S
    node_not_ready_grace_s: float = DEFAULT_NODE_NOT_READY_GRACE_S
    orphan_instance_grace_s: float = ORPHAN_INSTANCE_GRACE_S
    #: Peering (high availability): ``None`` runs standalone.
    peering_name: str | None = DEFAULT_PEERING_NAME
    peering_lifetime_s: int = DEFAULT_PEERING_LIFETIME_S
    priority: int = field(default_factory=_random_priority)
    #: The validating admission webhook for Configurations (off unless ``--webhook``).
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    #: The Prometheus ``/metrics`` server: ``None`` serves none.
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    #: DRA: one DeviceClass per Configuration (``controller.device_classes``); off by default.
    dra: bool = False
    dra_extended_resources: bool = False

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
        add = parser.add_argument
        add("--namespace", action="append", default=[], metavar="NAME",
            help="serve only this namespace (repeatable); default: every namespace")
        add("--kubeconfig", type=Path, default=None, metavar="PATH",
            help="kubeconfig file; default: $KUBECONFIG, else the in-cluster service account")
        add("--resync-interval", type=float, default=DEFAULT_RESYNC_INTERVAL_S, metavar="S",
            help="seconds between full reconciles of everything, the net under missed events"
                 " (default: %(default)s)")
        add("--pending-grace", type=float, default=DEFAULT_PENDING_GRACE_S, metavar="S",
            help="seconds a broker pod may stay Pending before it is recreated"
                 " (default: %(default)s)")
        add("--restart-backoff-base", type=float, default=DEFAULT_RESTART_BACKOFF_BASE_S,
            metavar="S", help="seconds before a failed or finished broker is recreated the first"
                              " time; doubles per recreation (default: %(default)s)")
        add("--restart-backoff-max", type=float, default=DEFAULT_RESTART_BACKOFF_MAX_S,
            metavar="S", help="the longest wait, in seconds, before recreating a failed broker"
                              " (default: %(default)s)")
        add("--node-not-ready-grace", type=float, default=DEFAULT_NODE_NOT_READY_GRACE_S,
            metavar="S", help="seconds a node may be NotReady before it is removed from its"
                              " Instances and its slots freed (default: %(default)s)")
        add("--orphan-instance-grace", type=float, default=ORPHAN_INSTANCE_GRACE_S, metavar="S",
            help="seconds an Instance whose Configuration is gone is kept before it is deleted"
                 " (default: %(default)s)")
        add("--peering-name", default=DEFAULT_PEERING_NAME, metavar="NAME",
            help="name of the KopfPeering (or ClusterKopfPeering) object the replicas elect the"
                 " active one through (default: %(default)s)")
        add("--standalone", action="store_true",
            help="no peering: this replica always acts (run one replica only; default: off)")
        add("--peering-lifetime", type=int, default=DEFAULT_PEERING_LIFETIME_S, metavar="S",
            help="seconds a replica that stopped heart-beating still counts as alive: the"
                 " standby takes over this long after the active replica dies"
                 " (default: %(default)s)")
        add("--priority", type=int, default=None, metavar="N",
            help="peering priority, 1 to 2**31-1: the highest live replica acts"
                 " (default: random, so replicas of one Deployment differ)")
        add("--metrics-port", type=int, default=None, metavar="PORT",
            help="serve Prometheus metrics on this port at /metrics (default: no metrics"
                 " server)")
        add("--metrics-address", default=DEFAULT_METRICS_ADDRESS, metavar="ADDRESS",
            help="address the metrics server binds (default: %(default)s)")
        add("--dra", action="store_true",
            help="keep one DRA DeviceClass (resource.k8s.io/v1) per Configuration, for claims"
                 " on the devices agents with DRA=on publish, and the Instances' servedBy and"
                 " claims display fields; needed by brokerDeviceAccess: dra (default: off)")
        add("--dra-extended-resources", action="store_true",
            help="with --dra: each DeviceClass also maps the Configuration's configuration-level"
                 " resource, so pods asking for it are served through DRA on nodes without the"
                 " device plugin (default: off)")
        add_webhook_arguments(parser)
        args = parser.parse_args(argv)
        kubeconfig = args.kubeconfig or (
            Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None
        )
        return cls(
            namespaces=tuple(args.namespace),
            kubeconfig=kubeconfig,
            resync_interval_s=args.resync_interval,
            pending_grace_s=args.pending_grace,
            restart_backoff_base_s=args.restart_backoff_base,
            restart_backoff_max_s=args.restart_backoff_max,
            node_not_ready_grace_s=args.node_not_ready_grace,
            orphan_instance_grace_s=args.orphan_instance_grace,
            peering_name=None if args.standalone else args.peering_name,
            peering_lifetime_s=args.peering_lifetime,
            priority=args.priority if args.priority is not None else _random_priority(),
            webhook=webhook_settings(args),
            metrics_port=args.metrics_port,
            metrics_address=args.metrics_address,
            dra=args.dra,
            dra_extended_resources=args.dra_extended_resources,
        )
