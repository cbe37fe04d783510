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
from controller.reconcile import (
    DEFAULT_PENDING_GRACE_S,
    DEFAULT_RESTART_BACKOFF_BASE_S,
    DEFAULT_RESTART_BACKOFF_MAX_S,
    BrokerPolicy,
)

#: How often each Configuration is fully re-examined (backoffs, grace periods, node health,
#: retries after API errors). Watch events make the controller react at once; this is the net,
#: and a pass over 10,000 Instances costs CPU, so it is not frequent.
DEFAULT_RESYNC_INTERVAL_S: Final = 30.0
#: How long a replica that stopped heart-beating counts as alive in the peering object; the
#: standby takes over this long after the active replica dies.
DEFAULT_PEERING_LIFETIME_S: Final = 30
DEFAULT_PEERING_NAME: Final = "edgeplug-controller"
#: Instances whose Configuration does not exist, older than this, are deleted (left over from a
#: Configuration deleted while the controller was down).
ORPHAN_INSTANCE_GRACE_S: Final = 30.0
PRIORITY_MAX: Final = 2**31 - 1


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
        parser.add_argument(
            "--namespace", action="append", default=[],
            help="serve only this namespace (repeatable); default: cluster-wide",
        )
        parser.add_argument("--kubeconfig", type=Path, default=None)
        parser.add_argument("--resync-interval", type=float, default=DEFAULT_RESYNC_INTERVAL_S)
        parser.add_argument("--pending-grace", type=float, default=DEFAULT_PENDING_GRACE_S)
        parser.add_argument(
            "--restart-backoff-base", type=float, default=DEFAULT_RESTART_BACKOFF_BASE_S
        )
        parser.add_argument(
            "--restart-backoff-max", type=float, default=DEFAULT_RESTART_BACKOFF_MAX_S
        )
        parser.add_argument(
            "--node-not-ready-grace", type=float, default=DEFAULT_NODE_NOT_READY_GRACE_S
        )
        parser.add_argument("--orphan-instance-grace", type=float, default=ORPHAN_INSTANCE_GRACE_S)
        parser.add_argument("--peering-name", default=DEFAULT_PEERING_NAME)
        parser.add_argument("--standalone", action="store_true", help="no peering (one replica)")
        parser.add_argument("--peering-lifetime", type=int, default=DEFAULT_PEERING_LIFETIME_S)
        parser.add_argument("--priority", type=int, default=None)
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
        )
