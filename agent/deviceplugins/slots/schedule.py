"""When the device-plugin side's loop runs next: a reconcile pass, a pod-resources sweep, or
nothing.

``PassSchedule`` holds no I/O: the loop (``agent.deviceplugins.slots.service``) asks it how long it
may sleep and tells it what ran. At rest nothing runs: a pass that failed in part is retried after
``settings.slots.retry_s``, and pod-resources is swept every ``settings.slots.sweep_s`` only while
this node holds a slot (every ``settings.slots.sweep_awaited_s`` while another node's pods wait for
one); a pass right after a sweep leaves its own to the loop, so a burst of events costs one ``List``
per interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.settings import current


@dataclass
class PassSchedule:
    """The loop's timers (times are the event loop's clock)."""

    #: A pass failed in part: the next one is due after ``settings.slots.retry_s``.
    retry: bool = False
    #: This node held a slot at the last sweep: the next one is due after
    #: ``settings.slots.sweep_s``.
    holding: bool = False
    #: When the last sweep ran.
    last_sweep: float = float("-inf")
    #: A pass skipped its sweep (one ran less than ``settings.slots.sweep_awaited_s`` before): the
    #: loop owes one.
    sweep_owed: bool = False

    def idle_seconds(self, now: float, until_resync: float, *, awaited: bool) -> float:
        """How long the loop may sleep without an event; ``awaited``: another node's pods
        wait for a slot this node holds."""
        if self.retry:
            return current().slots.retry_s
        if self.sweep_owed:
            return max(0.0, self.last_sweep + current().slots.sweep_awaited_s - now)
        if self.holding:
            slots = current().slots
            return min(slots.sweep_awaited_s if awaited else slots.sweep_s, until_resync)
        return max(0.0, until_resync)

    def swept(self, now: float, *, holding: bool) -> None:
        self.last_sweep = now
        self.sweep_owed = False
        self.holding = holding

    def sweep_after_pass(self, now: float, *, can_sweep: bool) -> bool:
        """Whether the pass that just ended sweeps now; if not, the loop owes one (when there
        is pod-resources to ask)."""
        if now - self.last_sweep >= current().slots.sweep_awaited_s:
            return True
        self.sweep_owed = can_sweep
        return False
