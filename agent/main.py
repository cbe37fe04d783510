"""``edgeplug-agent``: wiring only. Settings in, metrics, configuration watch and device plugins up.

The DaemonSet runs ``edgeplug-agent``; tests and the demo run the same agent
in-process with ``run_agent(settings)`` or as a subprocess with ``python -m agent.main`` (the
restart test SIGKILLs it). All logic lives in the modules wired here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from agent.device_plugin_seam import serve_when_wanted
from agent.discovery.cdi_specs import CdiSpecs
from agent.discovery.configuration_watch import ConfigurationWatch, FatalStartError
from agent.discovery.node_devices import NodeDeviceTable
from agent.kube.client import counted_client, load_config
from agent.kube.liveness import LivenessLease
from agent.kube.node_account import NodeAccount
from agent.kube.node_reads import node_reads
from agent.metrics import AgentMetrics
from agent.settings import AgentSettings, SettingsError, help_text, in_use

log = logging.getLogger("agent")

#: Attributes every LogRecord has; anything else came in through ``extra`` and is printed.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """``time level logger message key=value ...``: the ``extra`` fields become key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [
            f"{k}={v}" for k, v in sorted(vars(record).items()) if k not in _STANDARD_ATTRS
        ]
        return f"{line} {' '.join(pairs)}" if pairs else line


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


async def run_agent(
    settings: AgentSettings,
    *,
    devices: NodeDeviceTable | None = None,
    metrics: AgentMetrics | None = None,
) -> None:
    """Run the whole agent until cancelled. Instances are left in place on the way out. What it
    starts runs with ``settings`` in use (``agent.settings.current``)."""
    with in_use(settings):
        await _run_agent(settings, devices=devices, metrics=metrics)


async def _run_agent(settings: AgentSettings, *, devices: NodeDeviceTable | None,
                     metrics: AgentMetrics | None) -> None:
    devices = devices if devices is not None else NodeDeviceTable()
    metrics = metrics if metrics is not None else AgentMetrics()
    metrics.info.labels(settings.node_name).set(1)
    if settings.metrics_port is not None:
        metrics.serve(settings.metrics_port, settings.metrics_address)
    config = load_config(settings.kubeconfig)
    client = counted_client(config)
    # The Secrets and ConfigMaps Configurations name are read as this node's own account.
    account = NodeAccount(client, base=config, namespace=settings.node_accounts_namespace,
                          node=settings.node_name) if settings.node_accounts_namespace else None
    watch = ConfigurationWatch(
        client=client, node_name=settings.node_name, namespace=settings.namespace,
        devices=devices, metrics=metrics,
        cdi=CdiSpecs(settings.cdi_spec_dir), reads=account.client if account else None,
        reads_ready=account.ready if account else None,
    )
    parts: list[Coroutine[Any, Any, None]] = [watch.run()]
    if account is not None:
        parts.insert(0, account.run())
    # The pods bound here (device plugins) and the claims to prepare (DRA), as the kubelet.
    reads = node_reads(
        own=client, base=config, node_name=settings.node_name,
        cert=settings.kubelet_client_cert, key=settings.kubelet_client_key,
    ) if settings.serve_device_plugins or (settings.serve_dra and settings.dra_registry_dir) \
        else None
    if settings.discovery_handlers_dir is not None:
        from agent.discovery.akri_registration import HandlerRegistration

        registration = HandlerRegistration(
            directory=settings.discovery_handlers_dir,
            grace=settings.discovery.external_handler_grace_s,
            metrics=metrics,
        )
        parts.insert(0, registration.run())  # first: it routes handler look-ups before runs
    if settings.serve_device_plugins:

        async def serve_plugins() -> None:
            # Imported only once wanted: an agent whose devices the scheduler allocates carries
            # none of the device-plugin allocator (agent.device_plugin_seam).
            from agent.deviceplugins.slots.service import serve_device_plugins

            gc.freeze()  # its modules out of the collector's sight too (settle_heap)
            await serve_device_plugins(
                client=client, node_name=settings.node_name, plugin_dir=settings.plugin_dir,
                pod_resources_socket=settings.pod_resources_socket, devices=devices,
                metrics=metrics, dra=settings.serve_dra, reads=reads,
            )

        parts.append(serve_when_wanted(client=client, node_name=settings.node_name,
                                       devices=devices, dra=settings.serve_dra,
                                       serve=serve_plugins))
    if settings.volcano_device_info:
        from agent.discovery.volcano_device_info import DeviceInfoWriter

        parts.append(DeviceInfoWriter(client=client, node=settings.node_name,
                                      devices=devices).run())
    if settings.serve_dra:
        # Imported only when on: an agent without DRA carries none of it (docs/benchmarks.md,
        # "Memory").
        from agent.dra.service import serve_dra

        parts.append(serve_dra(
            client=client, node_name=settings.node_name, namespace=settings.namespace,
            devices=devices, cdi_dir=settings.cdi_spec_dir, plugins_dir=settings.dra_plugins_dir,
            registry_dir=settings.dra_registry_dir, reads=reads, metrics=metrics,
        ))
    if settings.serve_dra and settings.liveness_namespace:
        # The controller stops offering this node's devices once this stops being renewed.
        parts.append(LivenessLease(client, node=settings.node_name,
                                   namespace=settings.liveness_namespace,
                                   renew_s=settings.liveness.renew_s).run())
    log.info("agent starting", extra={"node": settings.node_name})
    try:
        async with asyncio.TaskGroup() as group:
            for part in parts:
                group.create_task(part)
    finally:
        if reads is not None:
            await reads.close()
        if account is not None:
            await account.close()
        await client.close()
        log.info("agent stopped", extra={"node": settings.node_name})


async def _serve_until_signalled(settings: AgentSettings) -> None:
    task = asyncio.create_task(run_agent(settings))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


#: Modules the agent process never needs but a dependency imports whenever they are installed:
#: httpcore2 imports trio (with attrs, 2 MiB resident) only to tell trio from asyncio, and the
#: agent runs on asyncio alone; it imports h2 (with hpack and hyperframe, 1 MiB) for HTTP/2,
#: which the agent's API client never speaks (lightkube asks for HTTP/1.1) and which none of
#: the agent's own dependencies installs. Marked absent before anything could import them.
_NEVER_IMPORTED = ("trio", "h2")


def settle_heap(settings: AgentSettings) -> None:
    """Import what the agent will run, then move every object so far out of the collector's
    sight (``gc.freeze``).

    Module code, classes and constants live as long as the process, yet every full collection
    walked all of them, on the event loop, and an ``Allocate`` arriving meanwhile waited for it.
    Frozen, they are never examined again; the collector walks only what the agent allocated
    since. Objects that die are still freed by reference counting; only cycles among the frozen
    ones would stay, and module-level objects never die.
    """
    if settings.serve_device_plugins and not settings.serve_dra:
        import agent.deviceplugins.slots.service  # noqa: F401  (run_agent imports it; here before freezing)
    if settings.serve_dra:
        from agent.dra.service import serve_dra  # noqa: F401  (likewise)
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print(help_text())
        raise SystemExit(0 if args[0] in ("-h", "--help") else 2)
    for module in _NEVER_IMPORTED:
        sys.modules.setdefault(module, None)  # type: ignore[arg-type]
    configure_logging()
    try:
        settings = AgentSettings.from_env()
    except SettingsError as exc:
        log.error("%s", exc)
        raise SystemExit(2) from exc
    settle_heap(settings)
    try:
        asyncio.run(_serve_until_signalled(settings))
    except* FatalStartError as fatal:
        for error in fatal.exceptions:
            log.error("%s", error)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
