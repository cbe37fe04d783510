"""Admission latency of the controller's webhook (target: median ≤ 20 ms).

Every ``kubectl apply`` of a Configuration waits for the webhook, so its cost is measured, never
asserted. On a real control plane with the controller serving the webhook over TLS on loopback,
two figures, each over several runs:

- the webhook alone: an AdmissionReview POSTed over a kept-alive HTTPS connection (as the API
  server sends it), good and bad details of every built-in handler in turn;
- through the API server: a server-side dry-run create of a Configuration in the namespace the
  webhook judges, against one it does not; the difference of the medians is what the webhook
  adds to an apply.

Prints medians/p95 and the machine's speed. Asserts nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Final

import aiohttp
from lightkube import KubeConfig

from controller.kube.rest import Rest
from tests.bench.stats import machine_speed_line, summary
from tests.harness.controller_process import wait_until
from tests.harness.controlplane import ControlPlane
from tests.harness.webhook_setup import WebhookSetup, webhook_controller

RUNS: Final = 5
REVIEWS_PER_RUN: Final = 100
CREATES_PER_RUN: Final = 40
API: Final = "/apis/edgeplug.io/v1alpha1"
#: (handler, good details, bad details): one of each per handler, sent in turn.
DETAILS: Final = (
    ("udev", "udevRules: ['SUBSYSTEM==\"tty\"']", "udevRules: ['KERNEL=\"x\"']"),
    ("onvif", "ipAddresses: {action: Include, items: [10.0.0.5]}", "ipAddresses: 3"),
    ("opcua", "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://h:4840/']}}",
     "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://h/']}}"),
    ("ascend", "chipNames: [Ascend910B3]", "healthPollSeconds: -1"),
    ("debugEcho", "descriptions: [a, b]", "descriptions: []"),
)


def _configuration(namespace: str, handler: str, details: str) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": f"b-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {"discoveryHandler": {"name": handler, "discoveryDetails": details},
                 "capacity": 1},
    }


def _reviews(namespace: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
         "request": {"uid": str(uuid.uuid4()), "operation": "CREATE",
                     "object": _configuration(namespace, handler, details)}}
        for handler, good, bad in DETAILS for details in (good, bad)
    ]


async def bench_direct(setup: WebhookSetup, ca_bundle: bytes) -> None:
    context = ssl.create_default_context(cadata=ca_bundle.decode("ascii"))
    url = f"https://127.0.0.1:{setup.port}/validate"
    reviews = _reviews(setup.namespace)
    medians: list[float] = []
    samples: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for _ in range(RUNS):
            run: list[float] = []
            for index in range(REVIEWS_PER_RUN):
                started = time.perf_counter()
                async with session.post(url, json=reviews[index % len(reviews)]) as response:
                    await response.read()
                run.append(time.perf_counter() - started)
            medians.append(statistics.median(run))
            samples += run
    print(summary("webhook alone, one AdmissionReview over HTTPS (kept alive)", samples))
    print(f"  medians of {RUNS} runs: " + ", ".join(f"{m * 1000:.2f}" for m in medians) + " ms")


async def _creates(rest: Rest, namespace: str) -> list[float]:
    out = []
    for index in range(CREATES_PER_RUN):
        handler, good, _ = DETAILS[index % len(DETAILS)]
        body = _configuration(namespace, handler, good)
        started = time.perf_counter()
        code, answer = await rest.request("POST", f"{API}/namespaces/{namespace}/configurations",
                                          body=body, params={"dryRun": "All"})
        out.append(time.perf_counter() - started)
        if code >= 300:
            raise RuntimeError(f"dry-run create failed: HTTP {code} {answer[:200]!r}")
    return out


async def bench_through_api(setup: WebhookSetup, plain_namespace: str) -> None:
    config = KubeConfig.from_file(str(setup.plane.kubeconfig)).get()
    assert config is not None
    rest = Rest(config, connections=1)
    judged: list[float] = []
    plain: list[float] = []
    try:
        await _creates(rest, plain_namespace)  # warm the connection and the API server's caches
        for _ in range(RUNS):
            judged += await _creates(rest, setup.namespace)
            plain += await _creates(rest, plain_namespace)
    finally:
        await rest.close()
    print(summary("dry-run create through the API server, webhook called", judged))
    print(summary("dry-run create through the API server, no webhook", plain))
    added = statistics.median(judged) - statistics.median(plain)
    print(f"admission latency the webhook adds (difference of medians): {added * 1000:.2f} ms"
          " (target: median ≤ 20 ms)")


def _ca_bundle(setup: WebhookSetup) -> bytes:
    out = setup.plane.kubectl("get", "validatingwebhookconfiguration", setup.configuration, "-o",
                              "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
    return base64.b64decode(out)


def _refusing(setup: WebhookSetup) -> bool:
    bad = _configuration(setup.namespace, "debugEcho", "descriptions: []")
    done = setup.plane.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(bad),
                               check=False)
    return "denied the request" in done.stderr


def main(argv: list[str]) -> None:
    del argv
    print(machine_speed_line())
    with ControlPlane() as plane, tempfile.TemporaryDirectory() as logs:
        plain = f"plain-{uuid.uuid4().hex[:8]}"
        plane.kubectl("create", "namespace", plain)
        with webhook_controller(plane, Path(logs)) as setup:
            wait_until(lambda: _refusing(setup), what="the API server calling the webhook")
            asyncio.run(bench_direct(setup, _ca_bundle(setup)))
            asyncio.run(bench_through_api(setup, plain))


if __name__ == "__main__":
    main([])
