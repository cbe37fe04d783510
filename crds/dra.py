"""The names DRA (resource.k8s.io/v1) shares between the agent and the controller: the one driver
``edgeplug.io``, the attributes its devices carry and the DeviceClass names whose CEL selectors
read them (docs/dra.md, "What is published").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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
#: The extended resource every DeviceClass offers implicitly (k8s.io/api/resource/v1).
IMPLICIT_EXTENDED_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
#: Who manages DeviceClasses, and the annotation naming a class's Configuration.
CLASS_MANAGER: Final = "edgeplug-controller"
ANNOTATION_CONFIGURATION: Final = f"{GROUP}/configuration"
#: The annotation naming a per-Instance class's Instance (``<namespace>/<instance>``).
ANNOTATION_INSTANCE: Final = f"{GROUP}/instance"
#: Object names are DNS subdomains: at most 253 characters.
DNS_SUBDOMAIN_MAX: Final = 253
_DIGEST_CHARS: Final = 16
#: The API's limits on a device's attributes (k8s.io/api/resource/v1 validation).
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_ATTRIBUTE_NAME: Final = 32
MAX_STRING_VALUE: Final = 64
#: Short names users select by, for properties whose generic name is long (the long name is
#: published too).
ALIASES: Final[Mapping[str, str]] = {
    "ONVIF_DEVICE_IP_ADDRESS": "ip",
    "ONVIF_DEVICE_MAC_ADDRESS": "mac",
    "ONVIF_DEVICE_UUID": "uuid",
    "DEBUG_ECHO_DESCRIPTION": "description",
    "UDEV_DEVNODE": "devnode",
}
_NOT_IDENT: Final = re.compile(r"[^a-z0-9_]")
#: Kubernetes' standard attributes (docs: "Standard Device Attributes for Dynamic Resource
#: Allocation"): a device's PCIe root complex, ``pci<domain>:<bus>``, and its NUMA node, an
#: int (never -1: a device without affinity has none).
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_NUMA_NODE: Final = "resource.kubernetes.io/numaNode"
#: The properties the handlers that know them set (``discovery_handlers.pci``), by attribute.
STANDARD_PROPERTIES: Final[Mapping[str, tuple[str, ...]]] = {
    ATTR_PCIE_ROOT: ("UDEV_PCIE_ROOT", "ASCEND_PCIE_ROOT"),
    ATTR_NUMA_NODE: ("UDEV_NUMA_NODE", "ASCEND_NUMA_NODE"),
}
_PCIE_ROOT: Final = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_NUMA_NODE: Final = re.compile(r"^[0-9]{1,4}$")


def digest(text: str, chars: int = _DIGEST_CHARS) -> str:
    """A short stable hex digest, for names that would otherwise be too long or invalid."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=chars // 2).hexdigest()


def device_class_name(namespace: str, configuration: str) -> str:
    """``<configuration>.<namespace>.edgeplug.io``; a digest form when that is too long."""
    name = f"{configuration}.{namespace}.{GROUP}"
    if len(name) <= DNS_SUBDOMAIN_MAX:
        return name
    return f"{digest(f'{namespace}/{configuration}')}.{GROUP}"


def instance_class_name(namespace: str, instance: str) -> str:
    """``<instance>.<namespace>.instances.edgeplug.io``, the class that maps a shared
    Instance's own resource (``edgeplug.io/<instance>``); a digest form when too long."""
    name = f"{instance}.{namespace}.instances.{GROUP}"
    if len(name) <= DNS_SUBDOMAIN_MAX:
        return name
    return f"{digest(f'{namespace}/{instance}')}.instances.{GROUP}"


def instance_class(namespace: str, configuration: str, instance: str, *, extended_resource: str
                   ) -> dict[str, Any]:
    """The DeviceClass of one shared Instance: its device only, offered to pods that ask for
    ``extended_resource`` (its ``edgeplug.io/<instance>``) in ``resources.limits``."""
    meta: dict[str, Any] = {
        "name": instance_class_name(namespace, instance),
        "labels": {LABEL_MANAGED_BY: CLASS_MANAGER},
        "annotations": {ANNOTATION_CONFIGURATION: f"{namespace}/{configuration}",
                        ANNOTATION_INSTANCE: f"{namespace}/{instance}"},
    }
    expression = f"{device_selector(namespace, configuration)} && {instance_selector(instance)}"
    spec = {"selectors": [{"cel": {"expression": expression}}],
            "extendedResourceName": extended_resource}
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": meta, "spec": spec}


def _attribute_is(name: str, value: str) -> str:
    """``device.attributes["edgeplug.io"].<name>`` is the string ``value``: false, never a CEL
    error, when the device has no such attribute or one of another type. The scheduler
    evaluates every class on every device of every pool a candidate node reaches, and an error
    there (``no such key``; a version compared with a string, ``no such overload``) fails the
    whole pod's scheduling, so one device a node publishes without edgeplug's attributes would
    break every claim. So: ``in`` first (CEL's ``&&`` is false once one side is false, whatever
    the other side's error), and the literal on the left of ``==``, whose string equality is
    false on any other type (a version on the left would raise). ``type(x) == string`` would
    say it too, but the API server's cost estimate refuses it in a DeviceClass."""
    attr = f'device.attributes["{DRIVER}"]'
    return f"({json.dumps(name)} in {attr} && {json.dumps(value)} == {attr}.{name})"


def device_selector(namespace: str, configuration: str) -> str:
    """The CEL expression that selects one Configuration's devices: false, never an error, on
    any other device (another driver's, or one of this driver without these attributes)."""
    return (
        f"device.driver == {json.dumps(DRIVER)}"
        f" && {_attribute_is(ATTR_NAMESPACE, namespace)}"
        f" && {_attribute_is(ATTR_CONFIGURATION, configuration)}"
    )


def device_class(namespace: str, configuration: str, *, extended_resource: str | None = None
                 ) -> dict[str, Any]:
    """The DeviceClass body for one Configuration; with ``extended_resource`` (DRAExtendedResource,
    beta and on by default in v1.36) a pod asking for that extended resource is served from the
    class's devices on nodes where no device plugin advertises it. Without it a pod can still
    ask for ``deviceclass.resource.kubernetes.io/<class name>``.

    A cluster-scoped object cannot be owned by a namespaced one (the garbage collector ignores
    such an ownerReference), so the controller deletes the class itself; the label and the
    annotation say whose it is.
    """
    meta: dict[str, Any] = {
        "name": device_class_name(namespace, configuration),
        "labels": {LABEL_MANAGED_BY: CLASS_MANAGER},
        "annotations": {ANNOTATION_CONFIGURATION: f"{namespace}/{configuration}"},
    }
    spec: dict[str, Any] = {
        "selectors": [{"cel": {"expression": device_selector(namespace, configuration)}}],
    }
    if extended_resource is not None:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": meta, "spec": spec}


def instance_selector(instance: str) -> str:
    """The CEL expression that selects one Instance's device (within its Configuration's
    class, which already pins the namespace and the Configuration); false, never an error, on
    a device without an ``instance`` string attribute."""
    return _attribute_is(ATTR_INSTANCE, instance)


#: The claim a broker pod gets its device through (``spec.brokerDeviceAccess: dra``): the name
#: of the pod's ``resourceClaims`` entry and of the template's one request.
BROKER_CLAIM: Final = "edgeplug-device"
#: ``status.servedBy`` of an Instance (``controller.dra.dra_usage``): how its device is offered.
SERVED_BY_DEVICE_PLUGIN: Final = "device-plugin"
SERVED_BY_DRA: Final = "dra"
SERVED_BY_BOTH: Final = "both"


def served_by(*, device_plugin: bool, dra: bool) -> str:
    """``device-plugin``, ``dra``, ``both``, or empty when neither."""
    if device_plugin and dra:
        return SERVED_BY_BOTH
    if device_plugin:
        return SERVED_BY_DEVICE_PLUGIN
    return SERVED_BY_DRA if dra else ""


def attribute_name(prop: str) -> str:
    """``ONVIF_DEVICE_IP_ADDRESS`` → ``onvif_device_ip_address`` (may still be too long):
    lower case, characters outside ``[a-z0-9_]`` as ``_``, a leading digit prefixed by ``_``."""
    name = _NOT_IDENT.sub("_", prop.lower())
    return f"_{name}" if not name or name[0].isdigit() else name


@dataclass(frozen=True)
class Attributes:
    """A device's DRA attributes (strings, in the driver's domain), the standard ones
    (``resource.kubernetes.io/...``: an int or a string) and the properties that did not
    fit."""

    values: Mapping[str, str]
    left_out: tuple[str, ...] = ()
    standard: Mapping[str, int | str] = field(default_factory=dict)


def standard_attributes(properties: Mapping[str, str]) -> dict[str, int | str]:
    """``resource.kubernetes.io/pcieRoot`` and ``numaNode`` where a handler's property gives
    them in the form Kubernetes specifies (anything else is not published under them)."""
    found: dict[str, int | str] = {}
    for prop in STANDARD_PROPERTIES[ATTR_PCIE_ROOT]:
        value = properties.get(prop, "")
        if _PCIE_ROOT.match(value):
            found[ATTR_PCIE_ROOT] = value
            break
    for prop in STANDARD_PROPERTIES[ATTR_NUMA_NODE]:
        value = properties.get(prop, "")
        if _NUMA_NODE.match(value):
            found[ATTR_NUMA_NODE] = int(value)
            break
    return found


def attributes(*, namespace: str, configuration: str, instance: str,
               properties: Mapping[str, str], reserved: int = 0) -> Attributes:
    """What a device is published with: ``namespace``, ``configuration``, ``instance``, then
    each property under its alias and its ``attribute_name``, as long as the name, the value
    and the count stay within the API's limits (``reserved`` places kept for capacities); a
    property that got no attribute at all is left out."""
    values: dict[str, str] = {
        ATTR_NAMESPACE: namespace, ATTR_CONFIGURATION: configuration, ATTR_INSTANCE: instance,
    }
    standard = standard_attributes(properties)
    room = MAX_ATTRIBUTES_AND_CAPACITIES - reserved - len(standard)
    candidates = [(ALIASES[p], p) for p in sorted(properties) if p in ALIASES]
    candidates += [(attribute_name(p), p) for p in sorted(properties)]
    placed: set[str] = set()
    for name, prop in candidates:
        value = properties[prop]
        if (len(name) <= MAX_ATTRIBUTE_NAME and len(value) <= MAX_STRING_VALUE
                and name not in values and len(values) < room):
            values[name] = value
            placed.add(prop)
    return Attributes(values=values, left_out=tuple(p for p in sorted(properties)
                                                    if p not in placed), standard=standard)
