"""The admission webhook's settings: whether it runs, where it listens, what it keeps current.

Why this exists: the webhook is optional (a controller without it still works; the agent checks
``discoveryDetails`` too, only later), and its names (the Secret holding its certificates, the
Service the API server reaches it through, the ValidatingWebhookConfiguration whose ``caBundle``
it keeps current) must match what was installed. Kept apart from ``settings.py`` so the webhook's
flags and defaults are read in one place.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_WEBHOOK_PORT: Final = 8443
DEFAULT_WEBHOOK_ADDRESS: Final = "0.0.0.0"
DEFAULT_WEBHOOK_SERVICE: Final = "edgeplug-controller-webhook"
DEFAULT_WEBHOOK_SECRET: Final = "edgeplug-controller-webhook-tls"
DEFAULT_WEBHOOK_CONFIGURATION: Final = "edgeplug-configurations"
DEFAULT_NAMESPACE: Final = "edgeplug-system"
#: How often each replica re-reads the certificate Secret and the webhook configuration's
#: ``caBundle``: rotation happens months before expiry, so an hour is plenty; a replica
#: also picks up there a certificate another replica rotated.
DEFAULT_CERT_CHECK_INTERVAL_S: Final = 3600.0
#: Where a pod learns its own namespace (the service-account volume).
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_ANY_ADDRESSES: Final = frozenset({"0.0.0.0", "::", ""})


def own_namespace() -> str:
    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    enabled: bool = False
    address: str = DEFAULT_WEBHOOK_ADDRESS
    port: int = DEFAULT_WEBHOOK_PORT
    namespace: str = DEFAULT_NAMESPACE
    service: str = DEFAULT_WEBHOOK_SERVICE
    secret: str = DEFAULT_WEBHOOK_SECRET
    configuration: str = DEFAULT_WEBHOOK_CONFIGURATION
    cert_check_interval_s: float = DEFAULT_CERT_CHECK_INTERVAL_S
    #: An unknown handler name: refused (default), or admitted with a warning.
    allow_unknown_handlers: bool = False

    @property
    def dns_names(self) -> tuple[str, ...]:
        """The names the API server may reach the Service by (the serving cert's DNS SANs)."""
        base = f"{self.service}.{self.namespace}"
        return (base, f"{base}.svc", f"{base}.svc.cluster.local")

    @property
    def ip_addresses(self) -> tuple[str, ...]:
        """The listening address when it is one IP (a loopback ``url:`` webhook), else none."""
        if self.address in _ANY_ADDRESSES:
            return ()
        try:
            return (str(ipaddress.ip_address(self.address)),)
        except ValueError:
            return ()


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--webhook", action="store_true",
        help="serve the validating admission webhook that runs each Configuration's handler's"
             " parse_details at apply (default: off)")
    add("--webhook-address", default=DEFAULT_WEBHOOK_ADDRESS, metavar="ADDR",
        help="address the webhook's HTTPS server listens on (default: %(default)s)")
    add("--webhook-port", type=int, default=DEFAULT_WEBHOOK_PORT, metavar="PORT",
        help="TCP port of the webhook's HTTPS server (default: %(default)s)")
    add("--webhook-namespace", default=None, metavar="NAME",
        help="namespace of the webhook's Service and certificate Secret (default: $POD_NAMESPACE,"
             f" else the pod's own, else {DEFAULT_NAMESPACE})")
    add("--webhook-service", default=DEFAULT_WEBHOOK_SERVICE, metavar="NAME",
        help="Service the API server calls the webhook through; its DNS names go into the"
             " serving certificate (default: %(default)s)")
    add("--webhook-secret", default=DEFAULT_WEBHOOK_SECRET, metavar="NAME",
        help="Secret the replicas share the webhook's CA and serving certificate through"
             " (default: %(default)s)")
    add("--webhook-configuration", default=DEFAULT_WEBHOOK_CONFIGURATION, metavar="NAME",
        help="ValidatingWebhookConfiguration whose caBundle the controller keeps current"
             " (default: %(default)s)")
    add("--webhook-cert-check-interval", type=float, default=DEFAULT_CERT_CHECK_INTERVAL_S,
        metavar="S", help="seconds between checks of the certificates' expiry and the caBundle"
                          " (default: %(default)s)")
    add("--webhook-allow-unknown-handlers", action="store_true",
        help="admit a Configuration naming a handler not installed in the controller, with a"
             " warning, instead of refusing it (default: off)")


def webhook_settings(args: argparse.Namespace) -> WebhookSettings:
    return WebhookSettings(
        enabled=args.webhook,
        address=args.webhook_address,
        port=args.webhook_port,
        namespace=args.webhook_namespace or own_namespace(),
        service=args.webhook_service,
        secret=args.webhook_secret,
        configuration=args.webhook_configuration,
        cert_check_interval_s=args.webhook_cert_check_interval,
        allow_unknown_handlers=args.webhook_allow_unknown_handlers,
    )
