"""The controller's admission webhook on a test control plane: configuration aimed at loopback.

For the webhook integration test and its benchmark: the shipped ValidatingWebhookConfiguration
(deploy/manifests/controller-webhook.yaml) with its ``clientConfig`` pointed at
``https://127.0.0.1:<port>/validate`` (the API server runs on this machine; in a cluster it is
the Service) and scoped to one namespace (the control plane is shared by a whole test session),
and a controller process serving it.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import REPO_ROOT, ControlPlane, free_port

WEBHOOK_MANIFEST = REPO_ROOT / "deploy" / "manifests" / "controller-webhook.yaml"
SECRET = "edgeplug-controller-webhook-tls"
#: Certificates re-checked every second in tests, so a deleted Secret is remade at once.
CHECK_INTERVAL_S = "1"


def webhook_configuration(name: str, namespace: str, port: int) -> dict[str, Any]:
    """The shipped ValidatingWebhookConfiguration, aimed at loopback, scoped to ``namespace``."""
    docs = [d for d in yaml.safe_load_all(WEBHOOK_MANIFEST.read_text()) if d]
    config = copy.deepcopy(next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"))
    config["metadata"]["name"] = name
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return dict(config)


@dataclass
class WebhookSetup:
    plane: ControlPlane
    namespace: str
    configuration: str
    port: int
    controller: ControllerProcess


@contextmanager
def webhook_controller(plane: ControlPlane, log_dir: Path) -> Iterator[WebhookSetup]:
    """A fresh namespace, the webhook configuration for it, and the controller serving it."""
    namespace = f"wh-{uuid.uuid4().hex[:8]}"
    name = f"edgeplug-configurations-{namespace}"
    port = free_port()
    plane.kubectl("create", "namespace", namespace)
    plane.kubectl("apply", "-f", "-",
                  stdin=json.dumps(webhook_configuration(name, namespace, port)))
    controller = ControllerProcess(
        plane, namespaces=[namespace], log_path=log_dir / "controller.log",
        extra_args=(*FAST_ARGS, "--standalone", "--webhook", "--webhook-address", "127.0.0.1",
                    "--webhook-port", str(port), "--webhook-namespace", namespace,
                    "--webhook-configuration", name,
                    "--webhook-cert-check-interval", CHECK_INTERVAL_S),
    )
    controller.start()
    try:
        yield WebhookSetup(plane, namespace, name, port, controller)
    finally:
        controller.stop()
        plane.kubectl("delete", "validatingwebhookconfiguration", name, check=False)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
