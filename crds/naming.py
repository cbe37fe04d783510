"""Stable names for Instances, their CDI devices, slots and kubelet resources (Akri's names).

``instance_name``, ``device_digest``, ``collision_instance_name``, ``instance_names`` (every name a
device may take, in order) and ``plan_names`` (assigning them to one device list). The scheme,
fallbacks and collisions: docs/naming.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from crds.api import GROUP

# DNS labels (RFC 1123): what every object name the controller derives must be.
DNS_LABEL_MAX: Final = 63
HASH_SUFFIX_CHARS: Final = 8

_INVALID: Final = re.compile(r"[^a-z0-9-]+")
_DASHES: Final = re.compile(r"-{2,}")

#: The label on each broker pod naming the node it is pinned to (the controller sets it). An
#: agent's slot-demand watch selects its own node's pods by it
#: (``agent.deviceplugins.crossnode.demand``); a user's own pod pinned to a node gets the same
#: demand handling by carrying it.
LABEL_TARGET_NODE: Final = "edgeplug.io/target-node"

DIGEST_BYTES: Final = 3
#: Characters Akri replaces by ``-`` to keep names valid Kubernetes object names.
_NAME_REPLACED: Final = (".", "/")


def instance_digest(device_id: str, *, shared: bool, node: str) -> str:
    """The 6 hex characters that identify a device within its Configuration."""
    material = device_id if shared else f"{device_id}{node}"
    return hashlib.blake2b(material.encode("utf-8"), digest_size=DIGEST_BYTES).hexdigest()


def _sanitise(name: str) -> str:
    for char in _NAME_REPLACED:
        name = name.replace(char, "-")
    return name


def instance_name_from_digest(configuration: str, digest: str) -> str:
    """``<configuration>-<digest>``, with ``.`` and ``/`` turned into ``-`` as Akri does."""
    return _sanitise(f"{configuration}-{digest}")


def instance_name(configuration: str, device_id: str, *, shared: bool, node: str) -> str:
    """The name of the Instance for ``device_id`` discovered through ``configuration``."""
    digest = instance_digest(device_id, shared=shared, node=node)
    return instance_name_from_digest(configuration, digest)


#: Between an Akri name and the node in a fallback name; never in an Akri name.
FALLBACK_SEPARATOR: Final = "."
_CONFIGURATION_HASH_CHARS: Final = 4


def _fitted(configuration: str, digest: str, after: str) -> str | None:
    """``<configuration>-<digest><after>``, or ``<cut configuration>-<hash>--<digest><after>``
    when that exceeds ``DNS_LABEL_MAX``; None when ``after`` leaves no room for either."""
    name = f"{instance_name_from_digest(configuration, digest)}{after}"
    if len(name) <= DNS_LABEL_MAX:
        return name
    tail = f"-{short_hash(configuration, _CONFIGURATION_HASH_CHARS)}--{digest}"
    room = DNS_LABEL_MAX - len(tail) - len(after)
    head = _sanitise(configuration)[:max(room, 0)].rstrip("-")
    if not head:
        return None
    return f"{head}{tail}{after}"


def fallback_instance_name(configuration: str, digest: str, node: str) -> str | None:
    """The name a local device takes on ``node`` when its Akri name is another node's.

    ``<configuration>-<digest>.<node>``, or ``<cut configuration>-<hash>--<digest>.<node>`` when
    that exceeds ``DNS_LABEL_MAX`` (so ``edgeplug.io/<name>`` stays a valid resource name and the
    name a valid label value); None when ``node`` leaves no room for either.
    """
    return _fitted(configuration, digest, f"{FALLBACK_SEPARATOR}{node}")


DEVICE_DIGEST_BYTES: Final = 8


def device_digest(device_id: str, *, shared: bool, node: str) -> str:
    """The 16 hex characters that tell a device from every other of its Configuration
    (``spec.deviceDigest``): the material of ``instance_digest``, hashed longer."""
    material = device_id if shared else f"{device_id}{node}"
    return hashlib.blake2b(material.encode("utf-8"), digest_size=DEVICE_DIGEST_BYTES).hexdigest()


def collision_instance_name(configuration: str, digest: str) -> str:
    """The name a device takes when its Akri name is another device's: ``<configuration>-
    <device digest>`` (cut as ``fallback_instance_name`` cuts, never longer than
    ``DNS_LABEL_MAX``). Never an Akri name: its digest is 16 hex characters, not 6."""
    name = _fitted(configuration, digest, "")
    return name if name is not None else instance_name_from_digest(configuration, digest)


def instance_names(configuration: str, device_id: str, *, shared: bool,
                   node: str) -> tuple[str, ...]:
    """The names a device may take, in order of preference: its Akri name, then (a local
    device) its fallback name, then its collision name, then (a local device) the collision
    name's fallback. A shared device's are the same on every node."""
    short = instance_digest(device_id, shared=shared, node=node)
    long = device_digest(device_id, shared=shared, node=node)
    akri = instance_name_from_digest(configuration, short)
    collision = collision_instance_name(configuration, long)
    if shared:
        return akri, collision
    names = (akri, fallback_instance_name(configuration, short, node), collision,
             fallback_instance_name(configuration, long, node))
    return tuple(name for name in names if name is not None)


def name_digest(instance: str) -> str:
    """The digest an Instance name ends in (before a fallback name's node): 6 hex characters
    for an Akri name, 16 for a collision name. Its CDI name and broker variables carry it."""
    return instance.partition(FALLBACK_SEPARATOR)[0].rpartition("-")[2]


@dataclass(frozen=True)
class Planned:
    """Where ``plan_names`` puts one device: ``name`` (None: every name it may take is held),
    and the device that holds its Akri name instead (``""``: none, or not a known device)."""

    device_id: str
    digest: str
    name: str | None
    akri_name: str
    akri_holder: str = ""


def plan_names(configuration: str, device_ids: Iterable[str], *, shared: bool, node: str,
               held: Mapping[str, str] | None = None) -> dict[str, Planned]:
    """Names for one device list, by device id. ``held`` maps names the API server already
    has to the ``deviceDigest`` recorded there (``""``: another Instance, no device of ours).

    A device takes the first of its ``instance_names`` that is free or records it, and that no
    device before it took. Devices holding a name come first, then by ``device_digest``:
    within one list the smaller digest keeps a shared Akri name, so every node decides alike
    and a restart keeps what it had.
    """
    held = held or {}
    ids = list(dict.fromkeys(device_ids))
    digests = {d: device_digest(d, shared=shared, node=node) for d in ids}
    candidates = {d: instance_names(configuration, d, shared=shared, node=node) for d in ids}

    def holds(device: str) -> bool:
        return any(held.get(n) == digests[device] for n in candidates[device])

    taken: dict[str, str] = {}  # name -> digest of the device given it
    plan: dict[str, Planned] = {}
    for device in sorted(ids, key=lambda d: (not holds(d), digests[d])):
        mine = digests[device]
        names = candidates[device]
        own = [n for n in names if held.get(n) == mine and n not in taken]
        free = [n for n in names if n not in held and n not in taken]
        chosen = next(iter(own or free), None)
        akri = names[0]
        holder = taken.get(akri) or held.get(akri, "")
        plan[device] = Planned(device, mine, chosen, akri, "" if holder == mine else holder)
        if chosen is not None:
            taken[chosen] = mine
    return plan


def cdi_name(configuration: str, digest: str) -> str:
    """The fully qualified CDI device name: ``edgeplug.io/<configuration>=<digest>``."""
    return f"{GROUP}/{configuration}={digest}"


def slot_id(instance: str, index: int) -> str:
    """The kubelet device id of slot ``index`` of ``instance`` (Akri: ``<instance>-<index>``)."""
    if index < 0:
        raise ValueError(f"slot index must be >= 0, got {index}")
    return f"{instance}-{index}"


def slot_index(instance: str, slot: str) -> int:
    """The index of ``slot`` in ``instance``; ``ValueError`` when it is not one of its slots."""
    prefix = f"{instance}-"
    suffix = slot[len(prefix):] if slot.startswith(prefix) else ""
    if not suffix.isdecimal():
        raise ValueError(f"{slot!r} is not a slot of Instance {instance!r}")
    return int(suffix)


def instance_resource_name(instance: str) -> str:
    """The extended resource the Instance's device plugin serves: ``edgeplug.io/<instance>``."""
    return f"{GROUP}/{instance}"


def configuration_resource_name(configuration: str, resource_name_override: str | None) -> str:
    """The configuration-level resource: the override if set, else ``edgeplug.io/<config>``."""
    if resource_name_override:
        return resource_name_override
    return f"{GROUP}/{_sanitise(configuration)}"


def short_hash(text: str, chars: int = HASH_SUFFIX_CHARS) -> str:
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
    return f"{head}-{short_hash(original)}"


def target_node_label(node: str) -> str:
    """The ``LABEL_TARGET_NODE`` value for ``node``: its name (node names are DNS subdomains, so
    any name up to 63 characters is a valid label value), cut and hashed if longer."""
    return node if len(node) <= DNS_LABEL_MAX else dns_label(node)
