"""When the device-plugin side's loop runs next: a reconcile pass, a pod-resources sweep, or
nothing.

``PassSchedule`` holds no I/O: the loop (``agent.deviceplugins.slots.service``) asks it how long it
may sleep and tells it what ran. At rest nothing runs: a pass that failed in part is retried after
``RETRY_SECONDS``, and pod-resources is swept every ``SWEEP_SECONDS`` only while this node holds
a slot (every ``SWEEP_AWAITED_SECONDS`` while another node's pods wait for one); a pass right
after a sweep leaves its own to the loop, so a burst of events costs one ``List`` per interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.deviceplugins.slots.freeing import SWEEP_AWAITED_SECONDS

#: Reconcile at least this often even without events: a safety net only, since every change
#: that matters (Instances, the node's devices, pods, claims) wakes the loop itself.
RESYNC_SECONDS = 300.0
#: After a pass that failed in part (an API error, a lost race), the next one comes this soon.
RETRY_SECONDS = 1.0
#: While this node holds slots, pod-resources is asked this often which live pods hold them
#: (the kubelet never says that a pod has gone); every ``SWEEP_AWAITED_SECONDS`` while another
#: node's pods wait for such a slot. Holding nothing, it is never asked.
SWEEP_SECONDS = 1.0


@dataclass
class PassSchedule:
    """The loop's timers (times are the event loop's clock)."""

    #: A pass failed in part: the next one is due after ``RETRY_SECONDS``.
    retry: bool = False
    #: This node held a slot at the last sweep: the next one is due after ``SWEEP_SECONDS``.
    holding: bool = False
    #: When the last sweep ran.
    last_sweep: float = float("-inf")
    #: A pass skipped its sweep (one ran less than ``SWEEP_AWAITED_SECONDS`` before): the loop
    #: owes one.
    sweep_owed: bool = False

    def idle_seconds(self, now: float, until_resync: float, *, awaited: bool) -> float:
        """How long the loop may sleep without an event; ``awaited``: another node's pods
        wait for a slot this node holds."""
        if self.retry:
            return RETRY_SECONDS
        if self.sweep_owed:
            return max(0.0, self.last_sweep + SWEEP_AWAITED_SECONDS - now)
        if self.holding:
            return min(SWEEP_AWAITED_SECONDS if awaited else SWEEP_SECONDS, until_resync)
        return max(0.0, until_resync)

    def swept(self, now: float, *, holding: bool) -> None:
        self.last_sweep = now
        self.sweep_owed = False
        self.holding = holding

    def sweep_after_pass(self, now: float, *, can_sweep: bool) -> bool:
        """Whether the pass that just ended sweeps now; if not, the loop owes one (when there
        is pod-resources to ask)."""
        if now - self.last_sweep >= SWEEP_AWAITED_SECONDS:
            return True
        self.sweep_owed = can_sweep
        return False
