"""The names DRA (resource.k8s.io/v1) shares between the agent and the controller.

Why this exists: the agent publishes ResourceSlices whose devices carry attributes, and the
controller writes one DeviceClass per Configuration whose CEL selector names those attributes;
both sides must agree on the driver name, the attribute names and the DeviceClass name, so they
are fixed here once (``crds`` is the package both may import).

One driver, ``edgeplug.io``, for every Configuration: a driver name is what a kubelet plugin
registers under and what every ResourceSlice and allocation result names, and one agent serves
all Configurations of its node through one plugin socket. Configurations are told apart by the
``namespace`` and ``configuration`` attributes and by their DeviceClass, not by driver.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from crds.api import GROUP

DRIVER: Final = GROUP  # "edgeplug.io"
API_VERSION: Final = "resource.k8s.io/v1"
#: Attributes every published device carries besides those mapped from its properties.
ATTR_NAMESPACE: Final = "namespace"
ATTR_CONFIGURATION: Final = "configuration"
ATTR_INSTANCE: Final = "instance"
#: The consumable capacity of a shared device: one unit per claim (KEP-5075).
CAPACITY_SLOTS: Final = "slots"
#: Label on every ResourceSlice and DeviceClass edgeplug writes.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
#: Who manages DeviceClasses, and the annotation naming a class's Configuration.
CLASS_MANAGER: Final = "edgeplug-controller"
ANNOTATION_CONFIGURATION: Final = f"{GROUP}/configuration"
#: Object names are DNS subdomains: at most 253 characters.
DNS_SUBDOMAIN_MAX: Final = 253
_DIGEST_CHARS: Final = 16


def digest(text: str, chars: int = _DIGEST_CHARS) -> str:
    """A short stable hex digest, for names that would otherwise be too long or invalid."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=chars // 2).hexdigest()


def device_class_name(namespace: str, configuration: str) -> str:
    """``<configuration>.<namespace>.edgeplug.io``; a digest form when that is too long."""
    name = f"{configuration}.{namespace}.{GROUP}"
    if len(name) <= DNS_SUBDOMAIN_MAX:
        return name
    return f"{digest(f'{namespace}/{configuration}')}.{GROUP}"


def device_selector(namespace: str, configuration: str) -> str:
    """The CEL expression that selects one Configuration's devices."""
    attrs = f'device.attributes["{DRIVER}"]'
    return (
        f"device.driver == {json.dumps(DRIVER)}"
        f" && {attrs}.{ATTR_NAMESPACE} == {json.dumps(namespace)}"
        f" && {attrs}.{ATTR_CONFIGURATION} == {json.dumps(configuration)}"
    )


def device_class(namespace: str, configuration: str) -> dict[str, Any]:
    """The DeviceClass body for one Configuration.

    A cluster-scoped object cannot be owned by a namespaced one (the garbage collector ignores
    such an ownerReference), so the controller deletes the class itself; the label and the
    annotation say whose it is.
    """
    meta: dict[str, Any] = {
        "name": device_class_name(namespace, configuration),
        "labels": {LABEL_MANAGED_BY: CLASS_MANAGER},
        "annotations": {ANNOTATION_CONFIGURATION: f"{namespace}/{configuration}"},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": meta,
        "spec": {"selectors": [{"cel": {"expression": device_selector(namespace, configuration)}}]},
    }
