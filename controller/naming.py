"""Deterministic, DNS-safe names and the labels the controller puts on what it creates.

Why this exists: every object the controller creates has a name computed from what it is for
(Instance, node, generation), never a random suffix. Two replicas, or one replica restarted
half-way through, therefore compute the same name for the same broker, and a second create is
answered ``409 AlreadyExists`` instead of making a duplicate. Names must be valid DNS labels
(63 characters, lowercase alphanumerics and ``-``) even for long node and Instance names: when a
name is too long it is cut and given a hash of the full name, so two long names never collide.
Instance naming itself (``<configuration>-<digest>``) lives in :mod:`crds.naming`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

DNS_LABEL_MAX: Final = 63
HASH_SUFFIX_CHARS: Final = 8

_INVALID: Final = re.compile(r"[^a-z0-9-]+")
_DASHES: Final = re.compile(r"-{2,}")

# Labels on every broker pod, job, pod template and service the controller creates.
LABEL_CONFIGURATION: Final = "edgeplug.io/configuration"
LABEL_INSTANCE: Final = "edgeplug.io/instance"
LABEL_TARGET_NODE: Final = "edgeplug.io/target-node"
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


def _hash(text: str, chars: int = HASH_SUFFIX_CHARS) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:chars]


def dns_label(*parts: str, must_start_with_letter: bool = False) -> str:
    """Joins ``parts`` with ``-`` into a valid DNS label (RFC 1123; RFC 1035 if asked).

    A name that is already valid is kept as is. Otherwise characters outside ``[a-z0-9-]``
    become ``-``, the result is cut to leave room, and ``-<8 hex>`` of the whole original is
    appended, so two different originals never end up with one name.
    """
    original = "-".join(parts)
    name = _DASHES.sub("-", _INVALID.sub("-", original.lower())).strip("-")
    if must_start_with_letter and not name[:1].isalpha():
        name = f"ep-{name}"
    if not name:
        name = "ep"
    if len(name) <= DNS_LABEL_MAX and name == original:
        return name
    # Too long, or altered by sanitising (so two originals could now be equal): cut, and make
    # it unique again with a hash of the original.
    head = name[: DNS_LABEL_MAX - HASH_SUFFIX_CHARS - 1].rstrip("-")
    return f"{head}-{_hash(original)}"


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
    return _hash(canonical_json, 16)
