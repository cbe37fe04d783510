"""Brokers that get their device through DRA (``spec.brokerDeviceAccess: dra``). Pure rendering.

``uses_claims``, ``render_claim_template`` (one ResourceClaimTemplate per Instance) and
``claim_the_device`` (the broker's containers name the claim). Why a template: docs/dra.md,
"Brokers through claims".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from crds import dra
from crds.api import RESOURCE_PLACEHOLDER
from crds.configuration import BrokerDeviceAccess, Configuration
from crds.instance import Instance

KIND: Final = "ResourceClaimTemplate"
_RESOURCE_SECTIONS: Final = ("requests", "limits")


def uses_claims(configuration: Configuration) -> bool:
    return configuration.spec.broker_device_access == BrokerDeviceAccess.DRA


def template_name(instance: str) -> str:
    """The Instance's template: its own name (both are namespaced DNS subdomains)."""
    return instance


def render_claim_template(*, configuration: Configuration, instance: Instance,
                          labels: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceClaimTemplate the brokers of ``instance`` get their device from; the claims
    made from it carry ``labels`` (the brokers' own)."""
    request = {
        "name": dra.BROKER_CLAIM,
        "exactly": {
            "deviceClassName": dra.device_class_name(instance.namespace, configuration.name),
            "selectors": [{"cel": {"expression": dra.instance_selector(instance.name)}}],
        },
    }
    return {
        "apiVersion": dra.API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": template_name(instance.name),
            "namespace": instance.namespace,
            "labels": dict(labels),
            "ownerReferences": [instance.owner_reference()],
        },
        "spec": {
            "metadata": {"labels": dict(labels)},
            "spec": {"devices": {"requests": [request]}},
        },
    }


def claim_the_device(pod_spec: dict[str, Any], containers: Iterable[dict[str, Any]], *,
                     instance: str) -> None:
    """In place: every container that asks for ``{{PLACEHOLDER}}`` lists the broker claim
    instead, and the pod names the Instance's template (only if one container asked)."""
    asked = False
    for container in containers:
        resources = container.get("resources") or {}
        for section in _RESOURCE_SECTIONS:
            amounts = resources.get(section)
            if isinstance(amounts, dict) and RESOURCE_PLACEHOLDER in amounts:
                del amounts[RESOURCE_PLACEHOLDER]
                if not amounts:
                    del resources[section]
                claims = resources.setdefault("claims", [])
                if {"name": dra.BROKER_CLAIM} not in claims:
                    claims.append({"name": dra.BROKER_CLAIM})
                container["resources"] = resources
                asked = True
    if asked:
        pod_spec.setdefault("resourceClaims", []).append(
            {"name": dra.BROKER_CLAIM, "resourceClaimTemplateName": template_name(instance)})
