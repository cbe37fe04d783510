"""The kopf face of the controller: how kopf logs in, and nothing per object.

Why this exists: kopf keeps the replicas' peering (its keep-alive in a ``KopfPeering`` or
``ClusterKopfPeering`` object, from which ``controller.peering`` tells which replica acts) and
the operator's lifecycle. Per-object work does not go through kopf: at ten thousand Instances
and their brokers, kopf's worker, handler invocation and logging per watch event cost several
milliseconds of CPU each, where a plain watch into an index (``controller.engine``) costs tens
of microseconds. So the registry holds only the login handler: no on.event, no index, no timer,
and therefore no finalizer on any object (one would make deleting a Configuration hang while
the controller is down).
"""

from __future__ import annotations

from typing import Any

import kopf


def register(registry: kopf.OperatorRegistry) -> None:
    """Registers the controller's kopf handlers (login only) in ``registry``."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)
