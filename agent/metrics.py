"""The agent's Prometheus metrics, defined once so every part counts into the same series.

Why this exists: discovery, Instance publishing and the device plugins each count things a
node operator watches (instances, discovery time and errors, allocations, slot conflicts,
kubelet re-registrations); one module keeps names and labels consistent.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class AgentMetrics:
    """All agent metrics, on a registry of their own (tests create one per agent)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.instances = Gauge(
            "edgeplug_instances", "Instances this node serves, per Configuration",
            ["namespace", "configuration"], registry=self.registry,
        )
        self.discovery_duration = Histogram(
            "edgeplug_discovery_duration_seconds",
            "Time from a discovery run's start (or its last result) to its next device list",
            ["handler"], registry=self.registry,
        )
        self.discovery_errors = Counter(
            "edgeplug_discovery_errors_total", "Discovery runs that failed, per handler",
            ["handler", "reason"], registry=self.registry,
        )
        self.allocations = Counter(
            "edgeplug_allocations_total", "Allocate calls answered, per resource and outcome",
            ["resource", "outcome"], registry=self.registry,
        )
        self.slot_conflicts = Counter(
            "edgeplug_slot_conflicts_total",
            "Slot claims lost to another node or writer (optimistic concurrency conflicts)",
            ["resource"], registry=self.registry,
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

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``address:port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)
