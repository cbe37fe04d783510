"""The constants of edgeplug's API and the loader of its CRD manifests.

Group, version, kinds, plurals, conditions and defaults, spelt once; ``load_manifests`` and
``crd_schema`` read ``crds/manifests/`` (the schema's source of truth; docs/architecture.md, "The
API package").
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Final

import yaml

GROUP: Final = "edgeplug.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

CONFIGURATION_KIND: Final = "Configuration"
CONFIGURATION_PLURAL: Final = "configurations"
CONFIGURATION_SINGULAR: Final = "configuration"
CONFIGURATION_CRD_NAME: Final = f"{CONFIGURATION_PLURAL}.{GROUP}"

INSTANCE_KIND: Final = "Instance"
INSTANCE_PLURAL: Final = "instances"
INSTANCE_SINGULAR: Final = "instance"
INSTANCE_CRD_NAME: Final = f"{INSTANCE_PLURAL}.{GROUP}"

#: Defaults the API server fills in (the manifests say the same; a unit test proves it).
DEFAULT_CAPACITY: Final = 1
DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS: Final = 300
#: Upper bound on ``capacity`` (and so on the slots of one Instance), to keep objects small.
MAX_CAPACITY: Final = 1024

#: Names of discoveryProperties and brokerProperties: they become environment variables.
PROPERTY_NAME_PATTERN: Final = r"^[_A-Za-z][_A-Za-z0-9]*$"

#: The string a broker pod spec puts where the Instance's resource name goes (Akri's).
RESOURCE_PLACEHOLDER: Final = "{{PLACEHOLDER}}"

#: Condition types the controller sets on a Configuration's status.
CONDITION_READY: Final = "Ready"
CONDITION_DISCOVERY_DETAILS_VALID: Final = "DiscoveryDetailsValid"

MANIFEST_PACKAGE: Final = "crds"
MANIFEST_DIR: Final = "manifests"
MANIFEST_FILES: Final = ("configurations.yaml", "instances.yaml")


def manifests_text() -> str:
    """The CRD manifests as one multi-document YAML string, ready for ``kubectl apply -f -``."""
    directory = resources.files(MANIFEST_PACKAGE).joinpath(MANIFEST_DIR)
    parts = [directory.joinpath(name).read_text(encoding="utf-8") for name in MANIFEST_FILES]
    return "---\n".join(part if part.endswith("\n") else part + "\n" for part in parts)


def load_manifests() -> list[dict[str, Any]]:
    """The CRD manifests as dicts, Configuration's first."""
    documents = [doc for doc in yaml.safe_load_all(manifests_text()) if doc]
    for doc in documents:
        if not isinstance(doc, dict):
            raise ValueError(f"CRD manifest is not a mapping: {doc!r}")
    return documents


def crd_schema(kind: str) -> dict[str, Any]:
    """The OpenAPI schema of ``kind`` (``Configuration`` or ``Instance``) at :data:`VERSION`."""
    for doc in load_manifests():
        if doc["spec"]["names"]["kind"] != kind:
            continue
        for version in doc["spec"]["versions"]:
            if version["name"] == VERSION:
                schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
                return schema
    raise KeyError(f"no CRD for kind {kind!r} at version {VERSION}")


def owner_reference(
    *, kind: str, namespace: str, name: str, uid: str, controller: bool = True
) -> dict[str, Any]:
    """An ownerReference to an edgeplug object, so what it owns goes when it goes."""
    if not uid:
        raise ValueError(f"{kind} {namespace}/{name} has no uid yet")
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }
