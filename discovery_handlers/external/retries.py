"""How often a registered handler is tried again, and when it counts as lost: no I/O.

``Tries`` counts one endpoint's failures and gives the next delay (``retry_delay``) or None when
the grace has passed. The rules: docs/handlers/akri.md, "How it works".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

#: Seconds before dialling a lost handler again: doubling from the base, never above the max.
RETRY_BASE = 0.25
RETRY_MAX = 10.0
#: The most seconds between two tries of a handler that answers Discover with an error: it is
#: there, and may refuse for good, so it is asked less often; its registering again (a handler
#: may do so after every call) does not hasten the next try.
REFUSED_RETRY_MAX = 60.0
#: How a try of a handler failed: it could not be dialled or its stream broke; it ended its
#: stream; it answered with an error.
UNREACHABLE, ENDED, REFUSED = "unreachable", "ended", "refused"


def retry_delay(failures: int, *, refused: bool) -> float:
    """Seconds before the next try after ``failures`` failed ones in a row."""
    return min(REFUSED_RETRY_MAX if refused else RETRY_MAX,
               RETRY_BASE * float(2 ** min(failures - 1, 16)))


@dataclass(frozen=True)
class Failure:
    """One failed try: what went wrong, in words, and which kind of failure it was."""

    problem: str
    kind: str  # UNREACHABLE, ENDED or REFUSED


class Tries:
    """One registration's failed tries in a row within one run: the backoff and the grace."""

    def __init__(self, grace: float) -> None:
        self._grace = grace
        self._loop = asyncio.get_running_loop()
        self.failures = 0
        self.lost_at: float | None = None
        self.last: Failure | None = None

    @property
    def away(self) -> float:
        return 0.0 if self.lost_at is None else self._loop.time() - self.lost_at

    @property
    def wakes_on_register(self) -> bool:
        """Whether a registration of the handler should bring the next try at once: only when
        it could not be reached (it is back), never after it answered or hung up."""
        return self.last is not None and self.last.kind == UNREACHABLE

    def succeeded(self) -> None:
        self.failures, self.lost_at, self.last = 0, None, None

    def failed(self, failure: Failure) -> float | None:
        """Count ``failure``: seconds before the next try, or None where the handler has been
        lost (unreachable, or hanging up) for longer than the grace."""
        self.last = failure
        if failure.kind == REFUSED:
            self.lost_at = None  # it answered, so it is not lost
        elif self.lost_at is None:
            self.lost_at = self._loop.time()
        away = self.away
        if away >= self._grace:
            return None
        self.failures += 1
        delay = retry_delay(self.failures, refused=failure.kind == REFUSED)
        return delay if failure.kind == REFUSED else min(delay, self._grace - away)
