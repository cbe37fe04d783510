"""The controller's Prometheus metrics, on a registry of their own.

Why this exists: an operator must see without reading logs how often the kubelet rejects pods
for edgeplug's devices (issue 21: a rejected pod is Failed for good, so every one is a broker
the controller had to recreate or a user's pod that needs a human). The registry is per
instance so tests can run several controllers in one process; ``serve`` exposes it when the
controller is started with ``--metrics-port``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``address:port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)
