"""Prepared claims: which of this node's devices a claim was allocated (the allocation in its
status mapped back to the ``NodeDevice`` its pool and device name publish), the CDI spec per
claim that gives them to its containers (``edgeplug.io_claim-<uid>.json``), and the on-disk
record (``Checkpoint``) that keeps prepare and unprepare idempotent across restarts and reboots.
docs/dra.md, "Prepared claims survive restarts and reboots".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from agent.discovery.cdi_specs import CDI_VERSION
from agent.discovery.container_devices import container_allocation
from agent.discovery.node_devices import NodeDevice
from agent.dra import slices
from crds import dra
from discovery_handlers.contract import ComposingHandler

log = logging.getLogger(__name__)

CDI_KIND: Final = f"{dra.DRIVER}/claim"


class PrepareError(Exception):
    """A claim this node cannot prepare; the message goes back to the kubelet."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of a claim, for this driver."""

    request: str
    pool: str
    device: str
    share_id: str = ""  # the allocation's shareID: a device shared between claims


def results_for_driver(claim: Mapping[str, Any]) -> list[AllocatedDevice]:
    """The claim's allocation results that name this driver (others are another driver's)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError("the claim is not allocated")
    return [
        AllocatedDevice(request=str(r.get("request", "")), pool=str(r["pool"]),
                        device=str(r["device"]), share_id=str(r.get("shareID") or ""))
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == dra.DRIVER
    ]


def find_device(devices: Iterable[NodeDevice], node: str, wanted: AllocatedDevice
                ) -> NodeDevice | None:
    """The device this node serves under ``wanted``'s pool and device name, if any."""
    for candidate in devices:
        if slices.device_name(candidate.instance) != wanted.device:
            continue
        pools = (slices.local_pool(candidate.namespace, candidate.configuration, node),
                 slices.shared_pool(candidate.namespace, candidate.configuration,
                                    candidate.instance),
                 slices.single_device_pool(candidate.namespace, candidate.configuration,
                                           candidate.instance))
        if wanted.pool in pools:
            return candidate
    return None


def cdi_device_name(uid: str, index: int) -> str:
    return f"{uid}-{index}"


def cdi_id(uid: str, index: int) -> str:
    return f"{CDI_KIND}={cdi_device_name(uid, index)}"


def claim_spec(uid: str, devices: Sequence[NodeDevice]) -> dict[str, Any]:
    """The CDI spec for one claim's devices (in allocation order)."""
    composing = bool(devices) and isinstance(devices[0].handler, ComposingHandler)
    entries = []
    for index, device in enumerate(devices):
        got = container_allocation([device])
        edits: dict[str, Any] = {}
        if not composing and got.envs:
            edits["env"] = [f"{k}={v}" for k, v in sorted(got.envs.items())]
        if got.device_specs:
            edits["deviceNodes"] = [
                {"path": s.container_path, "hostPath": s.host_path, "permissions": s.permissions}
                for s in got.device_specs]
        if got.mounts:
            edits["mounts"] = [
                {"hostPath": m.host_path, "containerPath": m.container_path,
                 "options": ["bind", "ro"] if m.read_only else ["bind"]}
                for m in got.mounts]
        entries.append({"name": cdi_device_name(uid, index), "containerEdits": edits})
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}
    if composing:
        envs = container_allocation(list(devices)).envs
        spec["containerEdits"] = {"env": [f"{k}={v}" for k, v in sorted(envs.items())]}
    return spec


#: Claim specs' file prefix: not ``cdi_specs.FILE_PREFIX``, whose files an agent sweeps at
#: start; a prepared claim's spec must outlive the agent (a container of the claim's pod that
#: restarts later is resolved from it again).
CLAIM_FILE_PREFIX: Final = f"{dra.DRIVER}_claim-"


def claim_spec_path(directory: Path, uid: str) -> Path:
    return directory / f"{CLAIM_FILE_PREFIX}{uid}.json"


def write_claim_spec(directory: Path, uid: str, spec: Mapping[str, Any]) -> None:
    """Keys sorted, as the record keeps them: a spec written again from it is the same bytes."""
    write_atomically(claim_spec_path(directory, uid),
                     json.dumps(spec, indent=1, sort_keys=True))


def read_claim_spec(directory: Path, uid: str) -> dict[str, Any] | None:
    """The claim's spec as the runtime would find it; None if missing or not a claim spec."""
    try:
        found = json.loads(claim_spec_path(directory, uid).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):  # ValueError: not JSON, or not UTF-8
        return None
    return found if isinstance(found, dict) and found.get("kind") == CDI_KIND else None


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path`` through a temporary file and a rename: a reader (the runtime, the
    next agent) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str = ""
    #: What the handler named ``handler`` made on the node for the device, as the record it
    #: gave to undo it (``agent.dra.claim_devices``); empty: nothing made.
    handler: str = ""
    made: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    #: The CDI spec written for the claim; None in a record an older agent wrote.
    cdi_spec: dict[str, Any] | None = None


class Checkpoint:
    """Claims prepared on this node, by uid, kept in one JSON file."""

    VERSION: Final = 1

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        """The record on disk; one that cannot be read is set aside (``.unreadable``) and the
        agent starts with none: a claim the kubelet asks for again is prepared afresh from the
        API, and unprepare finds a claim's spec by its uid without the record."""
        try:
            return self._parse(json.loads(self.path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log.error("prepared-claims record %s unreadable (%s); set aside as %s",
                      self.path, error, aside)
            os.replace(self.path, aside)
            return {}

    def _parse(self, data: Any) -> dict[str, PreparedClaim]:
        if data.get("version") != self.VERSION:
            raise ValueError(f"version {data.get('version')!r} unknown")
        return {
            uid: PreparedClaim(
                namespace=c["namespace"], name=c["name"],
                devices=tuple(PreparedDevice(request=d["request"], pool=d["pool"],
                                             device=d["device"], cdi_ids=tuple(d["cdi_ids"]),
                                             share_id=d.get("share_id", ""),
                                             handler=d.get("handler", ""),
                                             made=_made_field(d.get("made")))
                              for d in c["devices"]),
                cdi_spec=_spec_field(c.get("cdi_spec")))
            for uid, c in data["claims"].items()
        }

    def put(self, uid: str, claim: PreparedClaim) -> None:
        self.claims[uid] = claim
        self._save()

    def drop(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        body = {"version": self.VERSION,
                "claims": {uid: asdict(c) for uid, c in sorted(self.claims.items())}}
        write_atomically(self.path, json.dumps(body, indent=1, sort_keys=True))


def _made_field(value: Any) -> dict[str, str]:
    """A record's ``made``: absent (nothing made, or an older agent's record) or text pairs."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError("made is not a map of text")
    return dict(value)


def _spec_field(value: Any) -> dict[str, Any] | None:
    """A record's ``cdi_spec``: absent (an older agent's record, same version) or a spec."""
    if value is None or (isinstance(value, dict) and value.get("kind") == CDI_KIND):
        return value
    raise TypeError(f"cdi_spec is not a {CDI_KIND} spec")
