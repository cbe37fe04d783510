"""Recording what the ``Allocate`` fast path promised: one writer per Instance, batched.

``PromiseRecorder`` runs one task per Instance that writes what is promised in one conditioned
claim: the first promise at once, then at most once per ``settings.slots.gather_s``, each write
taking everything promised since the last, so a burst of Allocates (a Deployment scaled up) costs a
few writes and passes rather than one each (``tests/bench/bench_agent.py``). The wait delays the
record, never the answer. A failed write is retried with the watches' backoff for as long as it
takes; a promise is dropped only once recorded or when the Instance is gone. Why an unrecorded
promise is safe, across an agent crash too: docs/slots.md (C6, C7).
"""

from __future__ import annotations

import asyncio
import logging

from agent.deviceplugins.slots.claiming import SlotWorld
from agent.deviceplugins.slots.ledger import InstanceGone, SlotUnavailable
from agent.deviceplugins.slots.rules import SlotRef
from agent.kube import watching
from agent.settings import current
from crds.instance import SlotUsage

log = logging.getLogger(__name__)


_Key = tuple[str, str]


class PromiseRecorder:
    """Records promised slots, one task per Instance while it has some."""

    def __init__(self, *, world: SlotWorld) -> None:
        self._world = world
        #: Per Instance: slots promised and not yet recorded, and the task recording them.
        self._unrecorded: dict[_Key, dict[str, SlotUsage]] = {}
        self._recorders: dict[_Key, asyncio.Task[None]] = {}

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        key = (namespace, instance)
        self._unrecorded.setdefault(key, {}).update(wanted)
        if key not in self._recorders:
            self._recorders[key] = asyncio.create_task(self._record(key), name="record-slots")

    async def close(self) -> None:
        """Stop recording (the agent is stopping)."""
        tasks = list(self._recorders.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _record(self, key: _Key) -> None:
        """Write what the fast path promised on one Instance: everything promised meanwhile in
        one conditioned write, retried with backoff until it is done."""
        try:
            await self._record_pending(key)
        finally:
            # No await from the last look at the pending slots to here: a promise made after
            # it starts a new recorder.
            self._recorders.pop(key, None)

    async def _record_pending(self, key: _Key) -> None:
        ledger = self._world.ledger(*key)
        loop = asyncio.get_running_loop()
        failures = 0
        next_write = loop.time()  # the first promise is written at once
        while True:
            if (wait := next_write - loop.time()) > 0:
                # The rest of a burst joins the next write. Also after the last write, so a
                # burst whose promises each come after the previous write is done (a held slot
                # confirmed again and again) is not one write per Allocate.
                await asyncio.sleep(wait)
                continue
            pending = self._unrecorded.get(key)
            if not pending:
                break
            next_write = loop.time() + current().slots.gather_s
            batch = dict(pending)
            done = True
            try:
                async with ledger.lock:
                    known = ledger.current(self._world.instance(*key))
                    self._world.remember(
                        await ledger.claim(batch, known=known, held_by_pod=True))
                self._world.slots_changed(SlotRef(*key, slot) for slot in batch)
            except InstanceGone:
                pass
            except SlotUnavailable as error:  # cannot happen while the rules hold
                log.error("a promised slot could not be recorded: %s", error)
                batch = {error.slot: batch[error.slot]}
            except Exception as error:  # the API server unreachable, conflicts
                failures += 1
                done = False
                log.warning("recording promised slots %s of %s/%s failed (%s); retrying",
                            sorted(batch), *key, watching.describe(error))
                await asyncio.sleep(watching.retry_delay(failures))
            if done:
                for slot, usage in batch.items():
                    if pending.get(slot) == usage:
                        del pending[slot]
                    if ledger.promised.get(slot) == usage:
                        del ledger.promised[slot]
        self._unrecorded.pop(key, None)
