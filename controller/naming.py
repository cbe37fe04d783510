"""Deterministic, DNS-safe names and the labels the controller puts on what it creates.

``broker_pod_name``, ``broker_job_name``, ``instance_service_name``, ``configuration_service_name``
and ``spec_hash`` (docs/architecture.md, "The controller's modules"). Instance names live in
``crds.naming``.
"""

from __future__ import annotations

from typing import Final

from crds.naming import (
    DNS_LABEL_MAX,
    HASH_SUFFIX_CHARS,
    LABEL_TARGET_NODE,
    dns_label,
    short_hash,
)

__all__ = [
    "DNS_LABEL_MAX",
    "HASH_SUFFIX_CHARS",
    "LABEL_TARGET_NODE",
    "dns_label",
]


# Labels on every broker pod, job, pod template and service the controller creates.
LABEL_CONFIGURATION: Final = "edgeplug.io/configuration"
LABEL_INSTANCE: Final = "edgeplug.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "edgeplug-controller"
COMPONENT_BROKER: Final = "broker"
COMPONENT_INSTANCE_SERVICE: Final = "instance-service"
COMPONENT_CONFIGURATION_SERVICE: Final = "configuration-service"

#: The finalizer name kopf used on Configurations in older versions of the controller. No
#: version since puts it there; the controller removes one it finds, so deletion never waits.
FINALIZER: Final = "edgeplug.io/controller"

# Annotations.
ANNOTATION_SPEC_HASH: Final = "edgeplug.io/broker-spec-hash"
ANNOTATION_GENERATION: Final = "edgeplug.io/configuration-generation"


def broker_pod_name(instance: str, node: str) -> str:
    """One broker pod per (Instance, node): ``<instance>-<node>-pod`` (cut and hashed if long)."""
    return dns_label(instance, node, "pod")


def broker_job_name(instance: str, generation: int) -> str:
    """One Job per Instance and Configuration generation: ``<instance>-<generation>-job``."""
    return dns_label(instance, str(generation), "job")


def instance_service_name(instance: str) -> str:
    """The Instance's service: ``<instance>-svc`` (Akri's)."""
    return dns_label(instance, "svc", must_start_with_letter=True)


def configuration_service_name(configuration: str) -> str:
    """The Configuration's service: ``<configuration>-svc`` (Akri's)."""
    return dns_label(configuration, "svc", must_start_with_letter=True)


def spec_hash(canonical_json: str) -> str:
    """The short hash stored in :data:`ANNOTATION_SPEC_HASH`."""
    return short_hash(canonical_json, 16)
