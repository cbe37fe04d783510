"""The agent's Prometheus metrics, defined once so every part counts into the same series.

``AgentMetrics`` holds one agent's series; ``ProcessCounters`` (``PROCESS``) counts watch restarts,
watch events and API errors per process. Labels are bounded: docs/operations.md, "Cardinality".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import httpx2 as httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

#: The buckets of the Allocate histogram (seconds): the kubelet waits on it while a pod starts.
ALLOCATE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: The buckets of the discovery histogram (seconds): a pass takes milliseconds (a list
#: published) to minutes (a first scan of a large network).
DISCOVERY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: HTTP answers from the API server counted as errors: throttling and the server's own faults
#: (a 404 or 409 is an answer the agent expects and handles).
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500

Configuration = tuple[str, str]  # (namespace, name)


class ProcessCounters:
    """Counts kept per process, exported by every agent registry of the process."""

    def __init__(self) -> None:
        self.watch_restarts = Counter(
            "edgeplug_watch_restarts_total",
            "Watches of the API server that started over (a reopened connection or 410 Gone), "
            "per resource kind", ["kind"], registry=None,
        )
        self.watch_events = Counter(
            "edgeplug_watch_events_total",
            "Events the API server sent this process's watches, per resource kind (what a "
            "write elsewhere costs this node: an Instance of another node's sends none)",
            ["kind"], registry=None,
        )
        self.api_errors = Counter(
            "edgeplug_api_errors_total",
            "API server answers that were errors (429 or 5xx), per HTTP status code",
            ["code"], registry=None,
        )

    def watch_started(self, resource: Any) -> None:
        """A watch of ``resource`` runs: its restart series exists from now on, at 0, so its
        first restart shows in ``increase()`` (a series born at 1 shows none)."""
        self.watch_restarts.labels(_kind(resource))
        self.watch_events.labels(_kind(resource))

    def watch_event(self, resource: Any) -> None:
        self.watch_events.labels(_kind(resource)).inc()

    def watch_restarted(self, resource: Any) -> None:
        self.watch_restarts.labels(_kind(resource)).inc()

    def count_response(self, response: httpx.Response) -> None:
        code = response.status_code
        if code == HTTP_TOO_MANY_REQUESTS or code >= HTTP_SERVER_ERROR:
            self.api_errors.labels(str(code)).inc()

    def hook(self, client: Any) -> None:
        """Count the error answers a lightkube ``AsyncClient`` receives (its httpx hooks)."""
        inner = getattr(getattr(client, "_client", None), "_client", None)
        if isinstance(inner, httpx.AsyncClient):

            async def on_response(response: httpx.Response) -> None:
                self.count_response(response)

            hooks = dict(inner.event_hooks)
            hooks["response"] = [*hooks.get("response", []), on_response]
            inner.event_hooks = hooks


def _kind(resource: Any) -> str:
    return str(getattr(resource, "__name__", type(resource).__name__))


PROCESS = ProcessCounters()


class AgentMetrics:
    """All agent metrics, on a registry of their own (tests create one per agent)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.registry.register(PROCESS.watch_restarts)
        self.registry.register(PROCESS.watch_events)
        self.registry.register(PROCESS.api_errors)
        self.info = Gauge(
            "edgeplug_agent_info", "1 while this node's agent runs (its node in the label)",
            ["node"], registry=self.registry,
        )
        self.instances = Gauge(
            "edgeplug_instances", "Instances this node serves, per Configuration",
            ["namespace", "configuration"], registry=self.registry,
        )
        self.instance_name_collisions = Gauge(
            "edgeplug_instance_name_collisions",
            "Devices this node serves under another name than their Akri name, because another "
            "device's Instance (two devices' names alike) or another node's holds it, per "
            "Configuration and node", ["namespace", "configuration", "node"],
            registry=self.registry,
        )
        self.devices = Gauge(
            "edgeplug_devices",
            "Devices this node's discovery found, per Configuration and health (healthy or "
            "unhealthy; found is their sum)",
            ["namespace", "configuration", "node", "health"], registry=self.registry,
        )
        self.slots_capacity = Gauge(
            "edgeplug_slots_capacity",
            "Slots (capacity x devices) of the Instances this node serves, per Configuration",
            ["namespace", "configuration", "node"], registry=self.registry,
        )
        self.slots_used = Gauge(
            "edgeplug_slots_used",
            "Slots of those held by this node's pods, per Configuration",
            ["namespace", "configuration", "node"], registry=self.registry,
        )
        self.discovery_duration = Histogram(
            "edgeplug_discovery_duration_seconds",
            "Discovery passes, per handler: one pass is one device list of the handler, from "
            "its arrival to its Instances and this node's devices being updated; a run's first "
            "pass counts from the run's start, so it includes the handler's first scan",
            ["handler"], registry=self.registry, buckets=DISCOVERY_BUCKETS,
        )
        self.discovery_errors = Counter(
            "edgeplug_discovery_errors_total", "Discovery runs that failed, per handler",
            ["handler", "reason"], registry=self.registry,
        )
        self.discovery_failing = Gauge(
            "edgeplug_discovery_failing",
            "1 while this node's discovery of the Configuration reports a problem (its "
            "DiscoveryHealthy condition is False), 0 while it runs",
            ["namespace", "configuration", "node", "handler"], registry=self.registry,
        )
        self.handlers_reachable = Gauge(
            "edgeplug_discovery_handlers_reachable",
            "Out-of-process discovery handlers, 1 while the last look found the handler "
            "registered and answering, 0 while it is not", ["handler"], registry=self.registry,
        )
        self.allocations = Counter(
            "edgeplug_allocations_total",
            "Allocate calls answered, per Configuration, node, kind of resource (instance or "
            "configuration) and outcome (ok or refused)",
            ["namespace", "configuration", "node", "kind", "outcome"], registry=self.registry,
        )
        self.allocate_duration = Histogram(
            "edgeplug_allocate_duration_seconds",
            "Time to answer the kubelet's Allocate call, per outcome (ok or refused)",
            ["outcome"], registry=self.registry, buckets=ALLOCATE_BUCKETS,
        )
        for outcome in ("ok", "refused"):  # at 0 from the start: the first call shows in rate()
            self.allocate_duration.labels(outcome)
        self.dra_prepare_duration = Histogram(
            "edgeplug_dra_prepare_duration_seconds",
            "Time to prepare one claim for the kubelet's DRA manager (NodePrepareResources), "
            "per outcome (ok or failed)",
            ["outcome"], registry=self.registry, buckets=ALLOCATE_BUCKETS,
        )
        for outcome in ("ok", "failed"):  # at 0 from the start, as Allocate's
            self.dra_prepare_duration.labels(outcome)
        self.slot_conflicts = Counter(
            "edgeplug_slot_conflicts_total",
            "Slot claims lost to another node or writer (optimistic concurrency conflicts), per "
            "Configuration, node and kind of resource (instance or configuration)",
            ["namespace", "configuration", "node", "kind"], registry=self.registry,
        )
        self.pod_resources_lists = Counter(
            "edgeplug_pod_resources_lists_total",
            "Sweeps that asked the kubelet's pod-resources List which pods hold slots, by "
            "outcome (while it fails, no slot is freed)",
            ["outcome"], registry=self.registry,
        )
        self.kubelet_registrations = Counter(
            "edgeplug_kubelet_registrations_total",
            "Device-plugin registrations with the kubelet, first ones and re-registrations",
            ["kind"], registry=self.registry,
        )
        self._slot_keys: set[tuple[str, str, str]] = set()

    # -- what the agent's parts call -----------------------------------------------------------

    def set_devices(
        self, namespace: str, configuration: str, node: str, healthy: Iterable[bool]
    ) -> None:
        """The health of every device this node's discovery of the Configuration found."""
        verdicts = list(healthy)
        up = sum(verdicts)
        self.devices.labels(namespace, configuration, node, "healthy").set(up)
        self.devices.labels(namespace, configuration, node, "unhealthy").set(len(verdicts) - up)

    def set_slots(self, node: str, counts: Mapping[Configuration, tuple[int, int]]) -> None:
        """Every Configuration's (capacity, used) on this node; series of the others go."""
        keys = {(ns, name, node) for ns, name in counts}
        for gone in self._slot_keys - keys:
            self.slots_capacity.remove(*gone)
            self.slots_used.remove(*gone)
        for (ns, name), (capacity, used) in counts.items():
            self.slots_capacity.labels(ns, name, node).set(capacity)
            self.slots_used.labels(ns, name, node).set(used)
        self._slot_keys = keys

    def set_discovery_failing(
        self, namespace: str, configuration: str, node: str, handler: str, failing: bool
    ) -> None:
        self.discovery_failing.labels(namespace, configuration, node, handler).set(int(failing))

    def forget_run(self, namespace: str, configuration: str, node: str, handler: str) -> None:
        """This node no longer runs the Configuration's discovery: its series go."""
        for gauge, labels in (
            (self.discovery_failing, (namespace, configuration, node, handler)),
            (self.devices, (namespace, configuration, node, "healthy")),
            (self.devices, (namespace, configuration, node, "unhealthy")),
            (self.instances, (namespace, configuration)),
            (self.instance_name_collisions, (namespace, configuration, node)),
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``address:port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)
