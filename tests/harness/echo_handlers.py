"""debugEcho extended, in tests only, so the agent's side of every handler hook can be exercised.

The real handlers (udev, ONVIF, OPC-UA, Ascend) each use some of the contract's
hooks; the agent's handling of them (health, composed environments, ranking, prepare, blocking
work off the loop) is tested once, here, with a handler whose devices a test controls through a
JSON state file. It stands for any handler, not for a real device. Details (YAML)::

    descriptions: [a, b, c]   # one device each; property DEBUG_ECHO_DESCRIPTION, and GROUP
    groups: {a: card0, b: card1, c: card0}   # optional: the group (card) of each device
    stateFile: /tmp/x.json    # {"a": {"present": false}, "b": {"healthy": false, "reason": "..."}}
    block: true               # optional: every pass after the first makes a blocking call
                              # that waits until the test calls ``release()``
    deviceNode: /dev/null     # optional: each device gets it as /dev/echo/<description>
    leakProperty: PW          # optional: copies discovery property PW into every device's
                              # properties (a misbehaving handler the agent must stop)
    compose: true             # optional: a container gets ECHO_ALL=<descriptions, comma-joined>
    shared: false

``rank`` keeps must-include devices and fills with devices of the same group as the first one;
``prepare`` records each call's descriptions in ``prepared`` and fails for a device marked
``"prepareFails": true``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from discovery_handlers.contract import (
    Device,
    DeviceSpec,
    Health,
    InvalidDetails,
    PropertyValue,
    property_text,
    run_blocking,
)
from discovery_handlers.registry import register_handler

NAME = "debugEchoExtended"
STATE_POLL_S = 0.05  # the test's state file is read this often
BLOCK_LIMIT_S = 60.0  # a blocking call never outlives this, even if a test forgets release()


@dataclass(frozen=True)
class EchoDetails:
    descriptions: tuple[str, ...]
    groups: Mapping[str, str] = field(default_factory=dict)
    state_file: Path | None = None
    block: bool = False
    compose: bool = False
    shared: bool = False
    device_node: str = ""
    leaked: str = field(default="", repr=False)


class ExtendedEcho:
    name = NAME
    shared = False

    def __init__(self) -> None:
        self.prepared: list[list[str]] = []
        self.seen_properties: list[Mapping[str, PropertyValue]] = []
        self.blocked = threading.Event()  # set while a blocking call is in progress
        self._gate = threading.Event()

    def release(self) -> None:
        """Let the blocking call return (and every later one at once)."""
        self._gate.set()

    def _block(self) -> None:
        self.blocked.set()
        try:
            self._gate.wait(BLOCK_LIMIT_S)
        finally:
            self.blocked.clear()

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> EchoDetails:
        raw: Any = yaml.safe_load(details) or {}
        if not isinstance(raw, dict) or not raw.get("descriptions"):
            raise InvalidDetails("descriptions", "required: a non-empty list of strings")
        self.seen_properties.append(dict(properties))
        state = raw.get("stateFile")
        leak = property_text(properties, raw["leakProperty"]) if raw.get("leakProperty") else ""
        return EchoDetails(
            descriptions=tuple(raw["descriptions"]),
            groups=dict(raw.get("groups") or {}),
            state_file=Path(state) if state else None,
            block=bool(raw.get("block", False)),
            compose=bool(raw.get("compose", False)),
            shared=bool(raw.get("shared", False)),
            device_node=str(raw.get("deviceNode") or ""),
            leaked=leak or "",
        )

    async def discover(self, details: EchoDetails) -> AsyncIterator[Sequence[Device]]:
        last: list[Device] | None = None
        seen: object = None
        while True:
            # Read at every poll, not when a stamp (inode, mtime, size) moves: two writes within
            # one tick of the kernel's coarse clock can leave the stamp as it was.
            state = _state(details.state_file)
            if state != seen or last is None:
                seen = state
                if details.block and last is not None:
                    await run_blocking(self._block)
                    state = _state(details.state_file)  # as the blocking call left it
                devices = _devices(details, state)
                if devices != last:
                    last = devices
                    yield devices
            await asyncio.sleep(STATE_POLL_S)

    def compose(self, details: EchoDetails, devices: Sequence[Device]) -> Mapping[str, str]:
        if not details.compose:
            merged: dict[str, str] = {}
            for device in devices:
                merged.update(device.properties)
            return merged
        return {"ECHO_ALL": ",".join(d.id for d in devices)}

    def rank(
        self,
        details: EchoDetails,
        available: Sequence[Device],
        must_include: Sequence[Device],
        size: int,
    ) -> Sequence[Device]:
        chosen = list(must_include)
        pool = [d for d in available if d not in chosen]
        if not chosen and pool:
            # Start with the group that can hold the most of the request.
            counts = Counter(details.groups.get(d.id, "") for d in pool)
            best = max(counts, key=lambda g: (counts[g], g))
            chosen.append(next(d for d in pool if details.groups.get(d.id, "") == best))
            pool.remove(chosen[0])
        group = details.groups.get(chosen[0].id, "") if chosen else ""
        pool.sort(key=lambda d: details.groups.get(d.id, "") != group)
        return [*chosen, *pool][:size]

    async def prepare(self, details: EchoDetails, devices: Sequence[Device]) -> None:
        state = _state(details.state_file)
        self.prepared.append([d.id for d in devices])
        for device in devices:
            if state.get(device.id, {}).get("prepareFails"):
                raise RuntimeError(f"device {device.id} refused to prepare")


def _state(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None:
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _devices(details: EchoDetails, state: Mapping[str, Mapping[str, Any]]) -> list[Device]:
    devices = []
    for description in details.descriptions:
        entry = state.get(description, {})
        if not entry.get("present", True):
            continue
        properties = {"DEBUG_ECHO_DESCRIPTION": description}
        if description in details.groups:
            properties["GROUP"] = details.groups[description]
        properties.update(entry.get("properties", {}))
        if details.leaked:
            properties["LEAKED"] = details.leaked
        specs = (
            (DeviceSpec(f"/dev/echo/{description}", details.device_node, "rw"),)
            if details.device_node else ()
        )
        health = (
            Health() if entry.get("healthy", True)
            else Health.unhealthy(str(entry.get("reason", "unhealthy")))
        )
        devices.append(
            Device(id=description, properties=properties, health=health, device_specs=specs)
        )
    return devices


def write_state(path: Path, state: Mapping[str, Mapping[str, Any]]) -> None:
    """Replace the state file atomically (the handler never reads half a file)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state), encoding="utf-8")
    temporary.replace(path)


def install() -> ExtendedEcho:
    """A fresh handler, registered under ``debugEchoExtended`` in this process."""
    handler = ExtendedEcho()
    register_handler(handler)
    return handler
