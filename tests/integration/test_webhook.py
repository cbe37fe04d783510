"""discoveryDetails refused at ``kubectl apply``: the real kube-apiserver calls the controller's
webhook over TLS on loopback.

Checked: the API server calls the webhook, trusts the certificate the controller made, and shows
the user the handler's message naming the field. The controller runs as its own process
(``--webhook``), the ValidatingWebhookConfiguration is the shipped one aimed at loopback
(``tests.harness.webhook_setup``), and every check goes through the real ``kubectl``. The
controller fills the ``caBundle`` itself.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.controller_process import ControllerProcess, wait_until
from tests.harness.controlplane import ControlPlane
from tests.harness.webhook_setup import SECRET, webhook_configuration, webhook_controller

DENIED = "denied the request"


@dataclass(frozen=True)
class Case:
    handler: str
    good: str
    bad: str
    field: str  # what the refusal must name


CASES = [
    Case("udev", 'udevRules: [\'SUBSYSTEM=="tty", KERNEL=="ttyUSB*"\']',
         "udevRules: ['SUBSYSTEM==\"tty\", KERNEL=\"ttyUSB*\"']",
         "spec.discoveryHandler.discoveryDetails.udevRules[0]"),
    Case("onvif", "ipAddresses: {action: Include, items: [10.0.0.5]}",
         "ipAddresses: {action: Include, items: [not-an-ip]}",
         "spec.discoveryHandler.discoveryDetails.ipAddresses.items[0]"),
    Case("opcua", "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://lds:4840/']}}",
         "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://lds:4840/']}}",
         "spec.discoveryHandler.discoveryDetails.opcuaDiscoveryMethod.standard.discoveryUrls[0]"),
    Case("ascend", "chipNames: [Ascend910B3]", "healthPollSeconds: -1",
         "spec.discoveryHandler.discoveryDetails.healthPollSeconds"),
    Case("debugEcho", "descriptions: [foo0, foo1]", "descriptions: [foo0, foo0]",
         "spec.discoveryHandler.discoveryDetails.descriptions[1]"),
]


def configuration(namespace: str, handler: str, details: str,
                  properties: list[dict[str, Any]] | None = None) -> str:
    handler_spec: dict[str, Any] = {"name": handler, "discoveryDetails": details}
    if properties:
        handler_spec["discoveryProperties"] = properties
    return json.dumps({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": f"c-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "spec": {"discoveryHandler": handler_spec, "capacity": 1},
    })


@dataclass
class Webhook:
    plane: ControlPlane
    namespace: str
    controller: ControllerProcess
    configuration: str
    port: int

    def apply(self, manifest: str, *args: str) -> tuple[bool, str]:
        """``kubectl apply``: (accepted, what kubectl printed)."""
        done = self.plane.kubectl("apply", "-f", "-", *args, stdin=manifest, check=False)
        return done.returncode == 0, done.stdout + done.stderr

    def refuses(self, manifest: str) -> str:
        accepted, output = self.apply(manifest)
        assert not accepted, f"accepted, expected a refusal: {output}"
        assert DENIED in output, output
        return output

    def ca_bundle(self) -> bytes:
        out = self.plane.kubectl("get", "validatingwebhookconfiguration", self.configuration,
                                 "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
        return base64.b64decode(out)

    def secret_ca(self) -> bytes:
        done = self.plane.kubectl("get", "secret", SECRET, "-n", self.namespace, "-o",
                                  "jsonpath={.data.ca\\.crt}", check=False)
        return base64.b64decode(done.stdout) if done.returncode == 0 else b""

    def wait_refusing(self) -> None:
        """Until the API server calls the webhook with the current caBundle (it picks up a
        changed configuration within a moment): a bad Configuration, server dry-run, refused."""
        bad = configuration(self.namespace, "debugEcho", "descriptions: []")
        wait_until(lambda: DENIED in self.apply(bad, "--dry-run=server")[1],
                   what="the API server refusing through the webhook")


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Webhook]:
    with webhook_controller(control_plane, tmp_path_factory.mktemp("webhook")) as setup:
        hook = Webhook(control_plane, setup.namespace, setup.controller, setup.configuration,
                       setup.port)
        try:
            hook.wait_refusing()
            yield hook
        finally:
            print(f"--- controller log ---\n{setup.controller.log_tail(60)}")


@pytest.mark.parametrize("case", CASES, ids=[c.handler for c in CASES])
def test_bad_details_refused_naming_the_field_good_accepted(webhook: Webhook, case: Case) -> None:
    output = webhook.refuses(configuration(webhook.namespace, case.handler, case.bad))
    assert case.field in output, output
    accepted, output = webhook.apply(configuration(webhook.namespace, case.handler, case.good))
    assert accepted, output


def test_update_to_bad_details_refused(webhook: Webhook) -> None:
    manifest = json.loads(configuration(webhook.namespace, "udev", CASES[0].good))
    accepted, output = webhook.apply(json.dumps(manifest))
    assert accepted, output
    manifest["spec"]["discoveryHandler"]["discoveryDetails"] = CASES[0].bad
    assert CASES[0].field in webhook.refuses(json.dumps(manifest))
    stored = webhook.plane.kubectl(
        "get", "configuration", manifest["metadata"]["name"], "-n", webhook.namespace,
        "-o", "jsonpath={.spec.discoveryHandler.discoveryDetails}").stdout
    assert stored == CASES[0].good


def test_unknown_handler_refused_listing_the_known_ones(webhook: Webhook) -> None:
    output = webhook.refuses(configuration(webhook.namespace, "udevv", "udevRules: []"))
    assert "spec.discoveryHandler.name" in output, output
    assert "'udevv'" in output, output
    assert "known handlers: ascend, debugEcho, onvif, opcua, udev" in output, output


def test_property_from_a_secret_is_left_to_the_agent_with_a_warning(webhook: Webhook) -> None:
    """The webhook reads no Secret: a check that needs one is admitted, and kubectl warns."""
    details = ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://lds:4840/']}}\n"
               "security: {policy: Basic256Sha256, mode: SignAndEncrypt}\n")
    properties = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": "opcua-client", "key": key}}}
        for name, key in (("clientCertificate", "cert"), ("clientPrivateKey", "key"))
    ]
    accepted, output = webhook.apply(
        configuration(webhook.namespace, "opcua", details, properties))
    assert accepted, output
    assert "Warning:" in output, output
    assert "clientCertificate" in output, output
    # What the handler checks before it needs the Secret is still refused.
    bad_url = details.replace("opc.tcp://", "http://")
    output = webhook.refuses(configuration(webhook.namespace, "opcua", bad_url, properties))
    assert CASES[2].field in output, output


def test_certificates_kept_in_a_secret_and_remade_with_the_ca_bundle(webhook: Webhook) -> None:
    """The caBundle is the Secret's CA; a lost Secret is remade (new CA) and the bundle follows,
    so the API server keeps calling the webhook."""
    first = webhook.secret_ca()
    assert first
    assert webhook.ca_bundle().startswith(first)
    webhook.plane.kubectl("delete", "secret", SECRET, "-n", webhook.namespace)
    wait_until(lambda: webhook.secret_ca() not in (b"", first), what="a new CA in the Secret")
    wait_until(lambda: webhook.ca_bundle().startswith(webhook.secret_ca()),
               what="the caBundle following the new CA")
    webhook.wait_refusing()


@pytest.mark.parametrize("mode", [("--server-side=false",),
                                  ("--server-side=true", "--force-conflicts=true")],
                         ids=["client-side", "server-side"])
def test_reapplying_the_manifest_keeps_the_ca_bundle(webhook: Webhook,
                                                     mode: tuple[str, ...]) -> None:
    """An admin re-applying the manifest (it sets no caBundle) keeps the controller's bundle."""
    bundle = webhook.ca_bundle()
    manifest = webhook_configuration(webhook.configuration, webhook.namespace, webhook.port)
    webhook.plane.kubectl("apply", *mode, "-f", "-", stdin=json.dumps(manifest))
    assert webhook.ca_bundle() == bundle
    webhook.wait_refusing()


def test_webhook_down_admits_as_failure_policy_ignore_says(webhook: Webhook) -> None:
    """failurePolicy Ignore: with no webhook answering, Configurations are admitted unchecked
    (the agent still refuses bad details, on the Configuration's status); once the controller
    is back, refused again."""
    webhook.controller.stop()
    bad = configuration(webhook.namespace, "debugEcho", "descriptions: []")
    accepted, output = webhook.apply(bad)
    assert accepted, output
    webhook.controller.start()
    webhook.wait_refusing()
    webhook.refuses(configuration(webhook.namespace, "debugEcho", "descriptions: []"))
