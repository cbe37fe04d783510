"""What handlers make on the node for a claim's devices (``ClaimPreparingHandler``: a vNPU cut
from an Ascend chip, say): made at prepare, each with the record that undoes it; all undone
again when one of them, or the claim's spec or record, fails; undone at unprepare from the
record, the handler found by its name (the agent may have restarted since, with no device
table yet); and told to their handlers when the agent's DRA plugin starts. The
contract: docs/handlers.md, "Preparing a claim's devices".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.discovery.node_devices import NodeDevice
from agent.dra.claims import PreparedDevice, PrepareError
from discovery_handlers.contract import ClaimPreparingHandler
from discovery_handlers.registry import load_handler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Made:
    """What handler ``handler`` made for one device, and the record that undoes it."""

    handler: str
    record: Mapping[str, str]


async def make(devices: Sequence[NodeDevice]) -> tuple[list[NodeDevice], list[Made | None]]:
    """``devices`` as the claim's containers get them, and what was made for each (None:
    nothing); raises ``PrepareError`` with nothing left made when a handler refuses."""
    given: list[NodeDevice] = []
    made: list[Made | None] = []
    for device in devices:
        handler = device.handler
        try:
            got = (await handler.prepare_claim_device(device.details, device.device)
                   if isinstance(handler, ClaimPreparingHandler) else None)
        except Exception as error:
            await undo_all(made)
            raise PrepareError(f"preparing {device.instance} failed: {error}") from error
        if got is None or handler is None:
            given.append(device)
            made.append(None)
            continue
        given.append(replace(device, device=got.device))
        made.append(Made(handler.name, dict(got.record)))
    return given, made


async def undo_all(made: Sequence[Made | None]) -> None:
    """Undo what was made (a failed prepare); what cannot be undone is logged."""
    for item in made:
        if item is not None:
            problem = await _undo(item)
            if problem:
                log.error("what a refused prepare made could not be undone", extra={
                    "handler": item.handler, "record": dict(item.record), "error": problem})


async def undo_devices(devices: Sequence[PreparedDevice]) -> tuple[
        tuple[PreparedDevice, ...], list[str]]:
    """The devices with what was made for them undone (its record cleared), and what could not
    be undone (those keep their record, for the kubelet's next unprepare)."""
    left: list[PreparedDevice] = []
    problems: list[str] = []
    for device in devices:
        if device.made:
            problem = await _undo(Made(device.handler, device.made))
            if problem:
                problems.append(f"{device.device}: {problem}")
            else:
                device = replace(device, handler="", made={})
        left.append(device)
    return tuple(left), problems


def kept(devices: Sequence[PreparedDevice]) -> None:
    """Tell each handler of what it made before this agent started."""
    for device in devices:
        if not device.made:
            continue
        try:
            handler = load_handler(device.handler)
            if isinstance(handler, ClaimPreparingHandler):
                handler.claim_device_kept(device.made)
        except Exception as error:
            log.error("a prepared device's record could not be given to its handler", extra={
                "handler": device.handler, "device": device.device, "error": str(error)})


async def _undo(item: Made) -> str:
    """"" once undone, else why not."""
    try:
        handler = load_handler(item.handler)
        if not isinstance(handler, ClaimPreparingHandler):
            return f"handler {item.handler} cannot undo what it made (no unprepare hook)"
        await handler.unprepare_claim_device(item.record)
    except Exception as error:
        return str(error) or type(error).__name__
    return ""
