"""Watch Configurations and keep one discovery run per Configuration that selects this node.

``ConfigurationWatch.run`` is the agent's control loop; ``runs`` shows the runs it keeps. When a
run starts, restarts or stops: docs/architecture.md, "The agent's discovery modules".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from agent.discovery.cdi_specs import CdiSpecs
from agent.discovery.instance_publisher import InstancePublisher
from agent.discovery.node_devices import NodeDeviceTable
from agent.discovery.node_labels import NodeLabels
from agent.discovery.properties import (
    PropertyUnavailable,
    Reference,
    ReferenceWatch,
)
from agent.discovery.runs import DiscoveryRun, RunKey
from agent.kube import node_instances, offer_wait, watching
from agent.kube.client import ConfigurationResource, as_dict, is_not_found
from agent.metrics import AgentMetrics
from agent.settings import current
from crds.configuration import (
    Configuration,
    allocator_of,
    decided_for_shared_devices_only,
    eviction_grace,
)

log = logging.getLogger(__name__)

HTTP_UNAUTHORIZED = 401


class FatalStartError(RuntimeError):
    """A misconfiguration retrying cannot fix; the message says what to fix."""


class ConfigurationWatch:
    """The set of discovery runs this node should have, kept in line with the API."""

    def __init__(
        self,
        *,
        client: AsyncClient,
        node_name: str,
        namespace: str | None,
        devices: NodeDeviceTable,
        metrics: AgentMetrics,
        cdi: CdiSpecs | None = None,
        reads: AsyncClient | None = None,
        reads_ready: asyncio.Event | None = None,
    ) -> None:
        """``reads``: the client that reads the Secrets and ConfigMaps Configurations name
        (this node's own account, ``agent.kube.node_account``, usable once ``reads_ready`` is
        set); None: ``client``."""
        self._client = client
        self._node = node_name
        self._namespace = namespace
        self._devices = devices
        self._metrics = metrics
        self._cdi = cdi if cdi is not None else CdiSpecs(None)
        self._labels = NodeLabels(client=client, node_name=node_name)
        self._references = ReferenceWatch(client=reads or client, ready=reads_ready,
                                          on_change=self._on_reference_change)
        self._configurations: dict[RunKey, Configuration] = {}
        self._runs: dict[RunKey, DiscoveryRun] = {}
        self._node_labels: Mapping[str, str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        #: This node's unlabelled Instances are labelled once per process
        #: (agent.kube.node_instances).
        self._migrated = False

    @property
    def runs(self) -> Mapping[RunKey, DiscoveryRun]:
        return dict(self._runs)

    async def run(self) -> None:
        """Run until cancelled; on cancel, stop every run and leave the Instances in place."""
        try:
            self._cdi.remove_all()  # specs of Configurations gone while the agent was down
            await self._start_up()
            for part, name in ((self._watch_node(), "watch-node"), (self._relist(), "relist")):
                self._background.add(asyncio.create_task(part, name=name))
            stream = watching.watch(
                self._client, ConfigurationResource, what="configurations",
                namespace=self._namespace or "*",
            )
            async for op, obj in stream:
                body = as_dict(obj)
                cfg = Configuration.from_object(body)
                key = (cfg.namespace, cfg.name)
                async with self._lock:
                    if op == "DELETED":
                        self._configurations.pop(key, None)
                    else:
                        self._configurations[key] = cfg
                    plugins_before = self._device_plugins_allocate(key)
                    await self._devices.set_allocator(
                        *key, None if op == "DELETED" else allocator_of(body),
                        shared_only=op != "DELETED" and decided_for_shared_devices_only(body))
                    if not plugins_before and self._device_plugins_allocate(key):
                        self._fill_slots(key)
                    await self._devices.set_eviction_grace(
                        *key, None if op == "DELETED" else eviction_grace(body.get("spec") or {}))
                    await self._reconcile(key)
        finally:
            await self._shutdown()

    async def _start_up(self) -> None:
        """Read the Node's labels and prune stale ones, retrying transient API errors (a 429
        while the API server initialises, 5xx, connection refused, timeouts) with backoff:
        only refused credentials end the agent, with a message saying what to fix."""
        failures = 0
        while True:
            try:
                self._node_labels, annotations = await self._read_node()
                if not self._migrated:
                    # Before any run adopts: adoption lists only labelled Instances.
                    await node_instances.label_unlabelled(
                        self._client, self._node, self._namespace or "*")
                    self._migrated = True
                await self._labels.prune(
                    node_labels=self._node_labels,
                    node_annotations=annotations,
                    configurations=await self._list_configurations(),
                )
                return
            except ApiError as exc:
                if exc.status.code == HTTP_UNAUTHORIZED:
                    raise FatalStartError(
                        "the API server refused the agent's credentials (401): check the "
                        "ServiceAccount token or KUBECONFIG"
                    ) from exc
                error: Exception = exc
            except Exception as exc:  # connection refused or reset, timeouts (httpx's errors)
                error = exc
            failures += 1
            delay = watching.retry_delay(failures)
            log.warning("starting: %s; retrying in %.1fs", watching.describe(error), delay)
            await asyncio.sleep(delay)

    async def _shutdown(self) -> None:
        runs = list(self._runs.values())
        self._runs.clear()
        for run in runs:
            await run.stop(withdraw=False)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._references.close()

    def _selected(self, cfg: Configuration) -> bool:
        selector = cfg.spec.node_selector
        return selector is None or selector.matches(self._node_labels)

    async def _reconcile(self, key: RunKey) -> None:
        cfg = self._configurations.get(key)
        run = self._runs.get(key)
        wanted = cfg is not None and self._selected(cfg)
        if run is not None and (not wanted or cfg is None):
            del self._runs[key]
            log.info("stopping discovery", extra={"configuration": "/".join(key)})
            self._in_background(run.stop(withdraw=True), f"withdraw-{key[1]}")
            return
        if cfg is None or not wanted:
            return
        if run is not None:
            same = (run.configuration.uid, run.configuration.generation) == (
                cfg.uid, cfg.generation,
            )
            if same:
                return
            await run.stop(withdraw=run.configuration.uid != cfg.uid)
        self._start(cfg)

    def _start(self, cfg: Configuration) -> None:
        publisher = InstancePublisher(
            client=self._client, node_name=self._node, configuration=cfg,
            devices=self._devices, labels=self._labels, metrics=self._metrics, cdi=self._cdi,
        )
        run = DiscoveryRun(
            client=self._client, node_name=self._node, configuration=cfg,
            publisher=publisher, references=self._references, metrics=self._metrics,
        )
        self._runs[run.key] = run
        self._in_background(self._start_once_granted(run), f"grant-{cfg.name}")

    async def _start_once_granted(self, run: DiscoveryRun) -> None:
        """Start ``run`` once this node may offer its devices, unless it was replaced or
        stopped meanwhile (``agent.kube.offer_wait``)."""
        cfg = run.configuration
        await offer_wait.wait_until_granted(self._client, cfg.namespace, cfg.name, self._node)
        if self._runs.get(run.key) is not run:
            return
        log.info(
            "starting discovery (generation %d)", cfg.generation,
            extra={"configuration": f"{cfg.namespace}/{cfg.name}", "node": self._node},
        )
        run.start()

    def _device_plugins_allocate(self, key: tuple[str, str]) -> bool:
        return self._devices.device_plugins_allocate(*key, dra=current().serve_dra)

    def _fill_slots(self, key: tuple[str, str]) -> None:
        """Device plugins allocate the Configuration's devices now: its run applies its
        Instances again, which adds the ``deviceUsage`` slots those made for the scheduler
        lack (a missing slot reads free meanwhile)."""
        run = self._runs.get(key)
        if run is None:
            return

        async def resync() -> None:
            try:
                await run.publisher.resync()
            except Exception as exc:  # the run's own resync tries again
                log.warning("re-applying the Instances of %s/%s failed: %s", *key,
                            watching.describe(exc))

        self._in_background(resync(), f"slots-{key[1]}")

    def _in_background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except ApiError as exc:
                log.warning("%s failed: %s", name, exc)

        task = asyncio.create_task(guarded(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _list_configurations(self) -> set[RunKey]:
        return {
            (cfg.namespace, cfg.name)
            for cfg in [
                Configuration.from_object(as_dict(obj))
                async for obj in self._client.list(
                    ConfigurationResource, namespace=self._namespace or "*"
                )
            ]
        }

    async def _relist(self) -> None:
        """Catch deletions a broken watch missed: forget Configurations no longer listed."""
        while True:
            await asyncio.sleep(current().discovery.relist_interval_s)
            before = dict(self._configurations)
            try:
                listed = await self._list_configurations()
            except Exception as exc:  # ApiError, or the API server unreachable
                log.warning("relist of Configurations failed: %s", watching.describe(exc))
                continue
            async with self._lock:
                for key in watching.missed_deletions(before, self._configurations, listed):
                    log.info("Configuration gone (missed by the watch)",
                             extra={"configuration": "/".join(key)})
                    del self._configurations[key]
                    await self._devices.set_allocator(*key, None)
                    await self._devices.set_eviction_grace(*key, None)
                    await self._reconcile(key)

    async def _on_reference_change(self, ref: Reference) -> None:
        async with self._lock:
            for key, run in list(self._runs.items()):
                cfg = run.configuration
                props = cfg.spec.discovery_handler.discovery_properties
                if not any(
                    p.value_from is not None
                    and p.value_from.kind == ref.kind
                    and p.value_from.name == ref.name
                    and (p.value_from.namespace or cfg.namespace) == ref.namespace
                    for p in props
                ):
                    continue
                try:
                    resolved = await self._references.resolve(
                        namespace=cfg.namespace, properties=props)
                    changed = resolved.values != run.properties
                except PropertyUnavailable:
                    changed = run.properties is not None
                if changed:
                    log.info(
                        "discovery properties changed (%s %s/%s); restarting",
                        ref.kind, ref.namespace, ref.name,
                        extra={"configuration": "/".join(key)},
                    )
                    del self._runs[key]
                    await run.stop(withdraw=False)
                    self._start(cfg)

    async def _read_node(self) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """The Node's labels and annotations (none while the Node does not exist yet)."""
        try:
            node = await self._client.get(Node, self._node)
        except ApiError as exc:
            if is_not_found(exc):
                log.warning("Node %s not found yet; selectors see no labels", self._node)
                return {}, {}
            raise
        meta = node.metadata
        return dict((meta.labels if meta else None) or {}), dict(
            (meta.annotations if meta else None) or {})

    async def _watch_node(self) -> None:
        stream = watching.watch(
            self._client, Node, what="node", fields={"metadata.name": self._node}
        )
        async for _op, node in stream:
            labels = dict((node.metadata.labels if node.metadata else None) or {})
            if labels == self._node_labels:
                continue
            async with self._lock:
                self._node_labels = labels
                for key in list(self._configurations):
                    await self._reconcile(key)
