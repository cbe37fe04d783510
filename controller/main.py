"""Wiring only: settings → Kubernetes client → reconciler → kopf registry → kopf operator.

Why this exists: ``edgeplug-controller`` (and ``python -m controller.main``) starts here. All
behaviour lives in the modules it wires; this file decides nothing but how they are connected and
how kopf is configured (peering for high availability, Event posting). No handler needs a
finalizer, so kopf puts none on Configurations or Instances.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import kopf

from controller.converge import Reconciler
from controller.handlers import register
from controller.kube import Kube, make_client
from controller.persistence import NoDiffBase
from controller.resync import Peering
from controller.settings import ControllerSettings

log = logging.getLogger("controller")

#: The finalizer name kopf would use. No handler requires one (no timers, daemons or
#: non-optional delete handlers), so kopf never adds it; set so that one left by an older
#: version is recognised as kopf's own and released.
FINALIZER: Final = "edgeplug.io/controller"
#: kopf logs every handled watch event at INFO ("Handler ... succeeded"): thousands a minute on
#: a busy cluster. The controller logs what it does itself.
KOPF_OBJECT_LOG_LEVEL: Final = logging.WARNING
REPORTING_COMPONENT: Final = "edgeplug-controller"
#: kopf keeps one worker task per object for this long after its last event; with tens of
#: thousands of pods a short idle time keeps memory down (events still queue per object).
WORKER_IDLE_TIMEOUT_S: Final = 1.0


def post_event(body: Mapping[str, Any], *, warning: bool, reason: str, message: str) -> None:
    """An Event on the Configuration (kopf posts it in the background)."""
    if warning:
        kopf.warn(kopf.Body(cast(Any, dict(body))), reason=reason, message=message)
    else:
        kopf.info(kopf.Body(cast(Any, dict(body))), reason=reason, message=message)


def kopf_settings(settings: ControllerSettings) -> kopf.OperatorSettings:
    config = kopf.OperatorSettings()
    config.persistence.finalizer = FINALIZER
    config.persistence.diffbase_storage = NoDiffBase()
    config.queueing.idle_timeout = WORKER_IDLE_TIMEOUT_S
    config.posting.reporting_component = REPORTING_COMPONENT
    config.posting.reporting_instance = os.environ.get("HOSTNAME", REPORTING_COMPONENT)
    if settings.peering_name is not None:
        config.peering.name = settings.peering_name
        config.peering.priority = settings.priority
        config.peering.lifetime = settings.peering_lifetime_s
        config.peering.mandatory = True
        config.peering.clusterwide = settings.clusterwide
    else:
        config.peering.standalone = True
    return config


async def run(
    settings: ControllerSettings,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Runs the controller until ``stop_flag`` is set (or forever)."""
    client = make_client(settings.kubeconfig)
    kube = Kube(client)
    try:
        if settings.peering_name is not None:
            for namespace in settings.namespaces or (None,):
                await kube.ensure_peering(namespace, settings.peering_name)
        reconciler = Reconciler(kube=kube, settings=settings, events=post_event)
        identity = f"{os.environ.get('HOSTNAME', REPORTING_COMPONENT)}/{uuid.uuid4().hex[:12]}"
        peering = None
        if settings.peering_name is not None:
            peering = Peering(
                read=functools.partial(kube.read_peering, name=settings.peering_name),
                identity=identity, priority=settings.priority,
                clusterwide=settings.clusterwide,
            )
        registry = kopf.OperatorRegistry()
        register(registry, reconciler, peering=peering)
        log.info(
            "edgeplug controller starting: %s, priority %d",
            "cluster-wide" if settings.clusterwide else f"namespaces {settings.namespaces}",
            settings.priority,
        )
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(settings),
            clusterwide=settings.clusterwide,
            namespaces=settings.namespaces,
            standalone=settings.peering_name is None,
            identity=cast(Any, identity),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> None:
    """The ``edgeplug-controller`` console script."""
    settings = ControllerSettings.from_args(argv)
    if settings.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(settings.kubeconfig)  # for kopf's own login
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("kopf.objects").setLevel(KOPF_OBJECT_LOG_LEVEL)
    asyncio.run(run(settings))


if __name__ == "__main__":
    main()
