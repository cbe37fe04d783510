"""Wiring only: settings → API clients → reconciler → engine, beside kopf (peering).

``edgeplug-controller`` starts here; every part gets its group of ``controller.settings``. kopf is
configured for peering and for API retries that never give up (kopf's default ones end after
about a minute, and a failed peering keep-alive would end the operator)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, cast

import kopf
from lightkube import KubeConfig
from lightkube.config.kubeconfig import SingleConfig

from controller.brokers.eventbatch import EventPoster
from controller.brokers.reconciler import Reconciler
from controller.engine.dispatch import Engine
from controller.engine.handlers import register
from controller.engine.peering import CLUSTER
from controller.grants.agent_access import AGENT_ACCOUNT, AgentAccess
from controller.kube.client import Kube, make_client
from controller.kube.rest import Rest
from controller.metrics import ControllerMetrics, count_by_node
from controller.naming import FINALIZER
from controller.settings import ControllerSettings, PeeringSettings, own_namespace
from controller.webhook.server import WebhookServer

__all__ = ["FINALIZER", "kopf_settings", "main", "run"]

log = logging.getLogger("controller")

#: kopf logs every handled watch event at INFO; the controller logs what it does itself.
KOPF_OBJECT_LOG_LEVEL: Final = logging.WARNING
REPORTING_COMPONENT: Final = "edgeplug-controller"


class RetryForever:
    """Delays for kopf's API retries that never run out (iterable again for every request)."""

    def __init__(self, peering: PeeringSettings) -> None:
        self.first_s = peering.kopf_first_backoffs_s
        self.max_s = peering.kopf_backoff_max_s

    def __iter__(self) -> Iterator[float]:
        return itertools.chain(self.first_s, itertools.repeat(self.max_s))


def kopf_settings(settings: ControllerSettings) -> kopf.OperatorSettings:
    config = kopf.OperatorSettings()
    config.persistence.finalizer = FINALIZER
    config.networking.error_backoffs = RetryForever(settings.peering)
    config.posting.enabled = False  # the controller posts its Events itself
    config.posting.reporting_component = REPORTING_COMPONENT
    config.posting.reporting_instance = os.environ.get("HOSTNAME", REPORTING_COMPONENT)
    if settings.peering.name is not None:
        config.peering.name = settings.peering.name
        config.peering.priority = settings.peering.priority
        config.peering.lifetime = settings.peering.lifetime_s
        config.peering.mandatory = True
        config.peering.clusterwide = settings.clusterwide
    else:
        config.peering.standalone = True
    return config


def cluster_config(kubeconfig: Path | None) -> SingleConfig:
    """The kubeconfig's current context (or the in-cluster service account's)."""
    config = KubeConfig.from_file(str(kubeconfig)) if kubeconfig else KubeConfig.from_env()
    single = config.get()
    if single is None:
        raise ValueError(f"no usable context in the kubeconfig {kubeconfig or '$KUBECONFIG'}")
    return single





def _active_anywhere(engine: Engine, settings: ControllerSettings) -> bool:
    """Whether this replica acts anywhere it serves (``edgeplug_controller_active``)."""
    if settings.clusterwide or settings.peering.name is None:
        return engine.gate.active(CLUSTER)
    return any(engine.gate.active(ns) for ns in settings.namespaces)


async def _ensure_peering(kube: Kube, settings: ControllerSettings) -> None:
    assert settings.peering.name is not None
    for namespace in settings.namespaces or (None,):
        while True:
            try:
                await kube.ensure_peering(namespace, settings.peering.name)
                break
            except Exception as error:  # the API is not there yet: wait for it, never give up
                log.warning("peering object not created yet (%s); retrying", error)
                await asyncio.sleep(settings.peering.setup_retry_s)


async def run(
    settings: ControllerSettings,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Runs the controller until ``stop_flag`` is set (or forever)."""
    config = cluster_config(settings.kubeconfig)
    client = make_client(settings.kubeconfig)
    # The watches: one long-lived connection each; the writes: a warm pool of that many.
    http = Rest(config, connections=0, settings=settings.api)
    rest = Rest(config, connections=settings.api.writes_in_flight, settings=settings.api)
    kube = Kube(client, rest)
    tasks: list[asyncio.Task[Any]] = []
    try:
        if settings.peering.name is not None:
            await _ensure_peering(kube, settings)
        identity = f"{os.environ.get('HOSTNAME', REPORTING_COMPONENT)}/{uuid.uuid4().hex[:12]}"
        events = EventPoster(kube.post_event, component=REPORTING_COMPONENT)
        metrics = ControllerMetrics()
        if settings.metrics.port is not None:
            metrics.serve(settings.metrics.port, settings.metrics.address)
        reconciler = Reconciler(kube=kube, settings=settings, events=events, metrics=metrics)
        engine = Engine(http=http, reconciler=reconciler, settings=settings, identity=identity)
        registry = kopf.OperatorRegistry()
        register(registry)
        ours: list[asyncio.Task[Any]] = []

        @kopf.on.cleanup(registry=registry)
        async def stop_ours(**_: Any) -> None:
            # On a stop signal kopf gives every task started after it 5 s to end by itself
            # before cancelling it; the engine's watches and workers never end by themselves,
            # so a SIGTERM waited out those 5 s. They are ours to stop, and are stopped here at
            # once.
            await _stop(ours)

        log.info(
            "edgeplug controller starting: %s, priority %d",
            "cluster-wide" if settings.clusterwide else f"namespaces {settings.namespaces}",
            settings.peering.priority,
        )
        engine_task = asyncio.create_task(engine.run(), name="engine")
        kopf_task = asyncio.create_task(kopf.operator(
            registry=registry,
            settings=kopf_settings(settings),
            clusterwide=settings.clusterwide,
            namespaces=settings.namespaces,
            standalone=settings.peering.name is None,
            identity=cast(Any, identity),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        ), name="kopf")
        ours.append(engine_task)
        ours.append(asyncio.create_task(metrics.refresh_forever(
            active=lambda: _active_anywhere(engine, settings),
            node_instances=lambda: count_by_node(
                (n.name for n in engine.cache.nodes()), engine.cache.instances_on),
            interval_s=settings.metrics.refresh_interval_s,
        ), name="metrics"))
        if settings.webhook.enabled:
            webhook = WebhookServer(settings.webhook, client)
            ours.append(asyncio.create_task(webhook.run(), name="webhook"))
        # Every replica keeps the agent's named-Secret and offer Roles (idempotent writes): an
        # agent never waits for a failover to read a newly referenced Secret or to offer the
        # devices of a new Configuration.
        agent_account = (own_namespace(), AGENT_ACCOUNT)  # installed beside the controller
        ours.append(asyncio.create_task(AgentAccess(
            client, account=agent_account, node_accounts=f"{own_namespace()}-nodes",
            settings=settings.grants).run(),
            name="agent-access"))
        if settings.dra.enabled:
            from controller.dra.agent_gone_taints import AgentGoneTaints
            from controller.dra.agent_liveness import AgentLiveness
            from controller.dra.device_classes import DeviceClasses
            from controller.dra.dra_usage import DraUsage

            classes = DeviceClasses(client, namespaces=settings.namespaces,
                                    extended_resources=settings.dra.extended_resources,
                                    settings=settings.dra)
            engine.pinned.leave_out(classes.scheduler_resources)
            ours.append(asyncio.create_task(classes.run(), name="dra"))
            # A node whose agent is gone stops being offered: its shared pools' selectors drop
            # it, its local pools are tainted NoSchedule.
            gone_taints = AgentGoneTaints(client, http, settings=settings.dra)
            ours.append(asyncio.create_task(gone_taints.run(), name="agent-gone-taints"))
            ours.append(asyncio.create_task(AgentLiveness(
                http, namespace=own_namespace(), grace_s=settings.dra.agent_grace_s,
                listeners=(classes.pools.set_gone_nodes, gone_taints.set_gone),
                forbidden_retry_s=settings.dra.liveness_forbidden_retry_s).run(),
                name="agent-liveness"))
            ours.append(asyncio.create_task(
                DraUsage(http=http, kube=kube, namespaces=settings.namespaces,
                         settings=settings.dra).run(),
                name="dra-usage"))
        tasks += [*ours, kopf_task]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # kopf ends on a stop signal, and when stopping cancels the tasks started after it
        # (the engine's watches and workers): then the engine ends cancelled, which is fine.
        # The engine ending on its own is a bug, and ends the process with its error.
        # So does the webhook ending (a port it cannot bind).
        for task in ours:
            if task.done() and not task.cancelled():
                task.result()
        await kopf_task
    finally:
        await _stop(tasks)
        await http.close()
        await rest.close()
        await client.close()


async def _stop(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
