"""The controller's Prometheus metrics, on a registry of their own.

``ControllerMetrics`` (``serve`` exposes it with ``--metrics-port``); ``ProcessCounters``
(``PROCESS``) counts watch restarts and API errors per process. Labels are bounded:
docs/operations.md, "Cardinality".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx2 as httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500


class ProcessCounters:
    """Counts kept per process, exported by every controller registry of the process."""

    def __init__(self) -> None:
        self.watch_restarts = Counter(
            "edgeplug_watch_restarts_total",
            "Watches of the API server that started over (a broken stream or 410 Gone), per "
            "resource kind", ["kind"], registry=None,
        )
        self.api_errors = Counter(
            "edgeplug_api_errors_total",
            "API server answers that were errors (429 or 5xx, per code) and requests that got "
            "no answer (code=\"none\")", ["code"], registry=None,
        )

    def count_answer(self, code: int) -> None:
        if code == HTTP_TOO_MANY_REQUESTS or code >= HTTP_SERVER_ERROR:
            self.api_errors.labels(str(code)).inc()

    def count_no_answer(self) -> None:
        self.api_errors.labels("none").inc()

    def hook(self, client: Any) -> None:
        """Count the error answers a lightkube ``AsyncClient`` receives (its httpx hooks)."""
        inner = getattr(getattr(client, "_client", None), "_client", None)
        if isinstance(inner, httpx.AsyncClient):

            async def on_response(response: httpx.Response) -> None:
                self.count_answer(response.status_code)

            hooks = dict(inner.event_hooks)
            hooks["response"] = [*hooks.get("response", []), on_response]
            inner.event_hooks = hooks


PROCESS = ProcessCounters()


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.registry.register(PROCESS.watch_restarts)
        self.registry.register(PROCESS.api_errors)
        self.broker_admission_failures = Counter(
            "edgeplug_broker_admission_failures_total",
            "Broker pods the kubelet rejected at admission (UnexpectedAdmissionError and other"
            " admission rejections), each deleted and recreated at once",
            ["namespace", "configuration"], registry=self.registry,
        )
        self.pod_admission_failures = Counter(
            "edgeplug_pod_admission_failures_total",
            "Users' pods the kubelet rejected at admission for an edgeplug resource, each"
            " reported once in an Event on the Instance or Configuration",
            ["namespace", "configuration"], registry=self.registry,
        )
        self.brokers_desired = Gauge(
            "edgeplug_brokers_desired",
            "Brokers (pods, or Jobs) the Configuration's Instances call for, as the active "
            "replica last counted them", ["namespace", "configuration"], registry=self.registry,
        )
        self.brokers_running = Gauge(
            "edgeplug_brokers_running",
            "Of those, brokers running and ready (a Job: one that has started)",
            ["namespace", "configuration"], registry=self.registry,
        )
        self.broker_refusals = Counter(
            "edgeplug_broker_refusals_total",
            "Broker objects (pod, Job, Service) the API server refused to create or update "
            "(invalid spec, admission policy, quota)", ["namespace", "configuration"],
            registry=self.registry,
        )
        self.active = Gauge(
            "edgeplug_controller_active",
            "1 on the replica that acts (peering), 0 on a standby", registry=self.registry,
        )
        self.node_instances = Gauge(
            "edgeplug_node_instances",
            "Instances that list the node (devices its agent serves there)", ["node"],
            registry=self.registry,
        )
        self._nodes: set[str] = set()
        self._configurations: set[tuple[str, str]] = set()

    def set_brokers(self, namespace: str, configuration: str, desired: int, running: int) -> None:
        self.brokers_desired.labels(namespace, configuration).set(desired)
        self.brokers_running.labels(namespace, configuration).set(running)
        if (namespace, configuration) not in self._configurations:
            # Counters shown at 0 from the start, so their first rise is an increase()
            # Prometheus sees (a series born at 1 is not).
            for counter in (self.broker_admission_failures, self.pod_admission_failures,
                            self.broker_refusals):
                counter.labels(namespace, configuration)
        self._configurations.add((namespace, configuration))

    def forget_configuration(self, namespace: str, configuration: str) -> None:
        """The Configuration is gone: its gauges go (its counters stay until restart)."""
        self._configurations.discard((namespace, configuration))
        for gauge in (self.brokers_desired, self.brokers_running):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, configuration)

    def set_active(self, active: bool) -> None:
        """This replica's state; a standby drops the broker gauges it set while it acted."""
        self.active.set(int(active))
        if not active:
            for namespace, configuration in list(self._configurations):
                self.forget_configuration(namespace, configuration)

    def set_node_instances(self, counts: Mapping[str, int]) -> None:
        for gone in self._nodes - counts.keys():
            self.node_instances.remove(gone)
        for node, count in counts.items():
            self.node_instances.labels(node).set(count)
        self._nodes = set(counts)

    async def refresh_forever(
        self, *, active: Callable[[], bool], node_instances: Callable[[], Mapping[str, int]],
        interval_s: float,
    ) -> None:
        """Refresh the gauges read from the controller's state, on its own loop, until
        cancelled (the scrape runs in another thread and must not walk the cache)."""
        while True:
            self.set_active(active())
            self.set_node_instances(node_instances())
            await asyncio.sleep(interval_s)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``address:port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)


def count_by_node(nodes: Iterable[str], instances_on: Callable[[str], Iterable[object]]) -> (
    dict[str, int]
):
    """Per node, how many Instances list it."""
    return {node: sum(1 for _ in instances_on(node)) for node in nodes}
