"""Brokers that get their device through DRA (``spec.brokerDeviceAccess: dra``).

Why this exists: by default a broker asks the device plugins for the Instance's extended
resource (``edgeplug.io/<instance>``). A Configuration with ``brokerDeviceAccess: dra`` asks for
the same device by a ResourceClaim instead, so the scheduler allocates it (a broker that finds
no free unit stays Pending, never fails at admission) and DRA's consumable capacity, not the
device plugins' slots, counts who holds a shared device. Pure rendering, no I/O.

One ResourceClaimTemplate per Instance (same name, in its namespace, owned by it: it goes with
the Instance), one request ``edgeplug-device`` of the Configuration's DeviceClass with the CEL
selector ``crds.dra.instance_selector`` writes (the Instance's device only). Each broker pod names
the template in ``spec.resourceClaims``, and each container that had the ``{{PLACEHOLDER}}``
resource lists the claim in ``resources.claims`` instead. The kube-controller-manager's
resourceclaim controller then makes one ResourceClaim per broker pod, owned by that pod (its
controller reference), and deletes it when the pod is gone. Why a template and not a claim the
controller writes itself: a pod's claim list is fixed at creation, so a claim made by the
controller would have to exist, with a name, before the pod it belongs to; a broker recreated
under the same name would then meet the claim of its predecessor, still owned by (and being
collected with) the old pod. The claim controller names claims per pod and checks that the
claim it finds belongs to that pod's uid; and a Job's pods each get their own claim too.
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
