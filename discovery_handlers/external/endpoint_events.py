"""One registered endpoint's events within a discovery run: its lists, failed tries, silence.

``endpoint_events`` dials the endpoint and yields each device list, ``SILENT`` once when it took
the call and sent nothing within the head start, and a ``retries.Failure`` after each failed try;
it dials again with backoff until the endpoint has been lost for longer than the grace, then
drops its registration and ends. Behaviour: docs/handlers/akri.md, "How it works".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

from discovery_handlers.contract import Device, PropertyValue
from discovery_handlers.external import merging, retries, steps, stream
from discovery_handlers.external.registrations import Registration, Registrations

log = logging.getLogger(__name__)


class Silent:
    """An endpoint took the call and has sent no list within the run's head start."""


SILENT = Silent()
#: What an endpoint's own stream within a run brings: a list, a failed try (it is tried
#: again after a backoff), or its silence.
Event = list[Device] | retries.Failure | Silent


@dataclass
class Endpoint:
    """One registered endpoint within a run: how it stands, and its stream of events."""

    standing: merging.Standing
    events: steps.Steps[Event]
    silent: bool = False


async def endpoint_events(
    registration: Registration, raw: str, properties: Mapping[str, PropertyValue], *,
    registrations: Registrations, grace: float, head_start: float,
) -> AsyncGenerator[Event, None]:
    """``registration``'s lists, its failed tries and its silence, dialling again after
    each failure with backoff (``retries``), until it has been lost for longer than the
    grace: then its registration is dropped and this ends."""
    where = f"{registration.name!r} at {registration.endpoint}"
    tries = retries.Tries(grace)
    while True:
        again = registrations.registered_again(registration.name)
        lists = steps.Steps(stream.discover(registration, raw, properties))
        failure = retries.Failure("it ended its stream", retries.ENDED)
        heard = False
        try:
            while True:
                await steps.wait_any([lists.next()], (), None if heard else head_start)
                if not lists.ready():
                    heard = True  # connected, and no list yet: said once
                    yield SILENT
                    continue
                try:
                    devices = lists.take()
                except steps.Ended:
                    break
                heard = True
                tries.succeeded()
                yield devices
        except stream.HandlerUnreachable as exc:
            failure = retries.Failure(str(exc), retries.UNREACHABLE)
        except stream.HandlerFailed as exc:  # it is there, and said why it cannot serve
            failure = retries.Failure(str(exc), retries.REFUSED)
        finally:
            await lists.close()
        delay = tries.failed(failure)
        if delay is None:
            if registrations.drop(registration):
                log.warning("discovery handler %s unreachable for %.0fs (grace %.0fs): "
                            "registration dropped", where, tries.away, grace,
                            extra={"handler": registration.name})
            return
        yield failure
        if tries.wakes_on_register:  # it could not be reached: its registering is news
            await steps.any_of(again, within=delay)
        else:
            await asyncio.sleep(delay)
