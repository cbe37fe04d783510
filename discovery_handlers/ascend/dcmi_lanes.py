"""Every DCMI call bounded: the library runs on threads of its own, one for the library-wide calls
and one per card, and a pass gives every lane ``timeout`` seconds. A card that has not answered
by then keeps its chips as last seen, marked unhealthy, and is not called again until its stuck
call returns; a stuck card list falls back to the cards last listed, a stuck ``dcmi_init``
fails the pass over to ``npu-smi``. Passes over one library are serialised; one takes at most
about twice ``timeout``. docs/handlers/ascend.md, "A DCMI call that never returns".
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Any, TypeVar

from discovery_handlers.ascend import dcmi
from discovery_handlers.ascend.chips import Chip
from discovery_handlers.contract import Health

_T = TypeVar("_T")
MAX_LIBRARIES = 8  # libraries kept loaded (one per libraryPath in use on the node)


class LaneStuck(Exception):
    """The lane's call did not answer in time, or an earlier call still has not. The text is
    the same at every pass while the call stays stuck (so the chips' health does not change
    from one poll to the next)."""

    def __init__(self, what: str, since: float, timeout: float) -> None:
        self.what = what
        self.since = since  # wall-clock time the stuck call started
        self.timeout = timeout
        super().__init__(self.describe())

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S", time.gmtime(self.since))
        return (f"{self.what} did not answer within {self.timeout:g} s "
                f"(stuck since {started} UTC)")


class Lane:
    """One daemon thread running one call at a time (a hung call holds only this thread)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._busy_since: float | None = None
        self._timeout = 0.0
        self._thread_id = 0
        self._thread = threading.Thread(target=self._serve, name=f"dcmi-{name}", daemon=True)
        self._thread.start()

    def submit(self, function: Callable[[], _T], timeout: float) -> Future[_T]:
        """Start ``function()`` on this lane, to be waited for ``timeout`` at most;
        ``LaneStuck`` when the lane is still inside an earlier call."""
        with self._lock:
            if self._busy_since is not None:
                raise LaneStuck(self._what(), self._busy_since, self._timeout)
            self._busy_since = time.time()
            self._timeout = timeout
        future: Future[_T] = Future()
        self._jobs.put((function, future))
        return future

    def call(self, function: Callable[[], _T], timeout: float) -> _T:
        """``function()`` on this lane; ``LaneStuck`` when it takes longer than ``timeout`` or
        the lane is still inside an earlier call."""
        return self.wait(self.submit(function, timeout), timeout)

    def wait(self, future: Future[_T], left: float) -> _T:
        """The result of a call ``submit`` started, waiting at most ``left`` more seconds."""
        try:
            return future.result(timeout=max(0.0, left))
        except FutureTimeout:
            raise LaneStuck(self._what(), self._busy_since or time.time(),
                            self._timeout) from None

    def _what(self) -> str:
        inside = dcmi.calling(self._thread_id)
        return f"DCMI {inside or 'call'} ({self.name})"

    def close(self) -> None:
        """End the thread once its current call (if any) returns."""
        self._jobs.put(None)

    def _serve(self) -> None:
        self._thread_id = threading.get_ident()
        while (job := self._jobs.get()) is not None:
            function, future = job
            error: BaseException | None = None
            result: Any = None
            try:
                result = function()
            except BaseException as exc:  # handed to the caller, who may have left
                error = exc
            # Free before answering: a caller that got its answer may submit again at once.
            with self._lock:
                self._busy_since = None
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


class BoundedDcmi:
    """One DCMI library, every call of it bounded (see the module docstring)."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._library: dcmi.Dcmi | None = None
        self._control = Lane("library")
        self._cards: dict[int, Lane] = {}
        self._last_cards: tuple[int, ...] | None = None
        self._last_chips: dict[int, tuple[Chip, ...]] = {}
        self._pass = threading.Lock()

    def scan(self, timeout: float) -> dcmi.DcmiScan:
        """Every chip of every card; raises ``DcmiError`` when the library cannot be loaded
        or cannot list the cards (and never listed them before)."""
        if not self._pass.acquire(timeout=3 * timeout):
            raise dcmi.DcmiError("an earlier DCMI pass is still running")
        try:
            return self._scan(timeout)
        finally:
            self._pass.release()

    def _scan(self, timeout: float) -> dcmi.DcmiScan:
        problems: list[str] = []
        library = self._load(timeout)
        try:
            cards = self._control.call(library.card_list, timeout)
            self._last_cards = cards
        except LaneStuck as stuck:
            if self._last_cards is None:
                raise dcmi.DcmiError(stuck.describe()) from None
            cards = self._last_cards
            problems.append(f"{stuck.describe()}; using the cards listed before")
        deadline = time.monotonic() + timeout
        chips: list[Chip] = []
        started: dict[int, Future[dcmi.DcmiScan]] = {}
        for card in cards:
            lane = self._cards.get(card)
            if lane is None:
                lane = self._cards[card] = Lane(f"card {card}")
            try:
                started[card] = lane.submit(_reader(library, card), timeout)
            except LaneStuck as stuck:
                chips.extend(self._stuck(card, stuck, problems))
        for card, future in started.items():
            try:
                scan = self._cards[card].wait(future, deadline - time.monotonic())
            except LaneStuck as stuck:
                chips.extend(self._stuck(card, stuck, problems))
                continue
            except Exception as exc:  # a library bug is this card's problem, not the pass's
                problems.append(f"card {card}: reading it failed: {exc}")
                continue
            self._last_chips[card] = scan.chips
            chips.extend(scan.chips)
            problems.extend(scan.problems)
        return dcmi.DcmiScan(chips=tuple(chips), problems=tuple(problems))

    def on_card(self, card: int, function: Callable[[dcmi.Dcmi], _T], timeout: float, *,
                answered_late: Callable[[_T], None] | None = None) -> _T:
        """``function(library)`` on ``card``'s lane, within ``timeout``; raises ``DcmiError``
        when the library cannot load or the card's lane is stuck or does not answer in time.
        A call that answers after that gives its answer to ``answered_late``, on a thread of
        its own (to undo what it did: the caller was told it failed)."""
        if not self._pass.acquire(timeout=3 * timeout):
            raise dcmi.DcmiError("an earlier DCMI pass is still running")
        future: Future[_T] | None = None
        try:
            library = self._load(timeout)
            lane = self._cards.get(card)
            if lane is None:
                lane = self._cards[card] = Lane(f"card {card}")
            try:
                future = lane.submit(lambda: function(library), timeout)
                return lane.wait(future, timeout)
            except LaneStuck as stuck:
                if future is not None and answered_late is not None:
                    future.add_done_callback(lambda done: _late(done, answered_late))
                raise dcmi.DcmiError(f"card {card}: {stuck.describe()}") from None
        finally:
            self._pass.release()

    def _load(self, timeout: float) -> dcmi.Dcmi:
        if self._library is None:
            path = self._path
            try:
                self._library = self._control.call(lambda: dcmi.load(path), timeout)
            except LaneStuck as stuck:
                raise dcmi.DcmiError(stuck.describe()) from None
        return self._library

    def close(self) -> None:
        for lane in (self._control, *self._cards.values()):
            lane.close()

    def _stuck(self, card: int, stuck: LaneStuck, problems: list[str]) -> list[Chip]:
        reason = f"card {card}: {stuck.describe()}"
        problems.append(reason)
        return [replace(chip, health=Health.unhealthy(reason), error_codes=None, problems=())
                for chip in self._last_chips.get(card, ())]


def _late(done: Future[_T], answered_late: Callable[[_T], None]) -> None:
    if not done.cancelled() and done.exception() is None:
        threading.Thread(target=answered_late, args=(done.result(),), name="dcmi-late",
                         daemon=True).start()


def _reader(library: dcmi.Dcmi, card: int) -> Callable[[], dcmi.DcmiScan]:
    return lambda: library.read_card(card)


_libraries: dict[str | None, BoundedDcmi] = {}
_libraries_lock = threading.Lock()


def library(path: str | None) -> BoundedDcmi:
    """The bounded library at ``path`` (None: ``libdcmi.so`` on the loader's search path),
    one per process and path: its lanes know which calls are still stuck."""
    with _libraries_lock:
        found = _libraries.get(path)
        if found is None:
            if len(_libraries) >= MAX_LIBRARIES:
                _libraries.pop(next(iter(_libraries))).close()
            found = _libraries[path] = BoundedDcmi(path)
        return found
