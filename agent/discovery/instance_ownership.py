"""Which Instances one Configuration's run on this node owns, and which name each device of a
list keeps: plain data and decisions, no API calls (the naming rules: docs/naming.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from crds.configuration import Configuration
from crds.instance import Instance
from crds.naming import device_digest, instance_names
from discovery_handlers.contract import Device


@dataclass(frozen=True)
class Holder:
    """Who holds a name this device may not take: said in words, and the device it records
    (``""``: none recorded, or not a device of this Configuration's kind)."""

    description: str
    digest: str = ""


@dataclass(frozen=True)
class Wanted:
    """One device of a list, with what names it by: its digest and its names in order."""

    device: Device
    digest: str
    names: tuple[str, ...]


def properties(cfg: Configuration, device: Device) -> dict[str, str]:
    """An Instance's ``brokerProperties``: the device's, the Configuration's over them."""
    return {**device.properties, **cfg.spec.broker_properties}


@dataclass
class Ownership:
    """The Instances naming this node for one Configuration, with the device each records."""

    cfg: Configuration
    node: str
    owned: dict[str, bool] = field(default_factory=dict)  # Instance name → shared
    #: Instance name → the deviceDigest it records (``""``: none), for those owned.
    records: dict[str, str] = field(default_factory=dict)
    #: Owned Instances that record no device (written before records were kept) → their
    #: brokerProperties, which tell which device of a colliding pair they were.
    unrecorded: dict[str, dict[str, str]] = field(default_factory=dict)

    def adopt(self, instance: Instance) -> None:
        spec = instance.spec
        self.owned[instance.name] = spec.shared
        self.records[instance.name] = spec.device_digest
        if not spec.device_digest:
            self.unrecorded[instance.name] = dict(spec.broker_properties)

    def take(self, name: str, digest: str, *, shared: bool) -> None:
        self.owned[name] = shared
        self.records[name] = digest
        self.unrecorded.pop(name, None)

    def drop(self, name: str) -> None:
        self.owned.pop(name, None)
        self.records.pop(name, None)
        self.unrecorded.pop(name, None)

    def is_mine(self, name: str, wanted: Wanted, group: Sequence[Wanted]) -> bool:
        """This node publishes ``name`` for ``wanted``. An Instance that records no device is
        the device of ``group`` with its properties, else any that may take its name."""
        if name not in self.owned:
            return False
        record = self.records.get(name, "")
        if record:
            return record == wanted.digest
        recorded = self.unrecorded.get(name)
        if recorded is None or recorded == properties(self.cfg, wanted.device):
            return True
        return not any(recorded == properties(self.cfg, w.device) for w in group
                       if name in w.names)

    def publishes_any(self, wanted: Wanted, group: Sequence[Wanted]) -> bool:
        return any(self.is_mine(n, wanted, group) for n in wanted.names)

    def groups(self, devices: Sequence[Device], *, shared: bool) -> list[list[Wanted]]:
        """The list's devices by Akri name, each group in the order its devices are placed:
        those this node publishes under one of their names first, then by digest."""
        groups: dict[str, list[Wanted]] = {}
        seen: set[str] = set()
        for device in devices:
            if device.id in seen:
                continue
            seen.add(device.id)
            wanted = Wanted(
                device, device_digest(device.id, shared=shared, node=self.node),
                instance_names(self.cfg.name, device.id, shared=shared, node=self.node))
            groups.setdefault(wanted.names[0], []).append(wanted)
        return [sorted(group, key=lambda w: (not self.publishes_any(w, group), w.digest))
                for group in groups.values()]

    def kept(self, group: Sequence[Wanted]) -> list[str]:
        """Names this node publishes that the group's devices keep (one each, first first)."""
        kept: list[str] = []
        for wanted in group:
            for name in wanted.names:
                if name not in kept and self.is_mine(name, wanted, group):
                    kept.append(name)
                    break
        return kept


def log_extra(cfg: Configuration, node: str, name: str) -> dict[str, str]:
    """The structured fields of a log line about Instance ``name``."""
    return {"configuration": f"{cfg.namespace}/{cfg.name}", "instance": name, "node": node}
