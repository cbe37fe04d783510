"""A lane: one thread, one call at a time, a caller that never waits longer than its timeout.

The call here is a Python function blocked on an Event (standing in for a DCMI call blocked in
the driver; tests/integration/test_ascend_bounded.py blocks the real ctypes path)."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from discovery_handlers.ascend.dcmi_lanes import Lane, LaneStuck

RELEASE_S = 10.0  # the blocked call's own bound, so a failing test cannot leave it forever


def test_a_call_answers_through_the_lane() -> None:
    lane = Lane("card 0")
    try:
        assert lane.call(lambda: 42, 1.0) == 42
        with pytest.raises(ZeroDivisionError):
            lane.call(lambda: 1 // 0, 1.0)
        assert lane.call(lambda: "again", 1.0) == "again"
    finally:
        lane.close()


def test_a_blocked_call_times_out_and_holds_the_lane_until_it_returns() -> None:
    lane = Lane("card 3")
    release = threading.Event()
    finished = threading.Event()

    def blocked() -> str:
        release.wait(RELEASE_S)
        finished.set()
        return "late"

    try:
        with pytest.raises(LaneStuck) as first:
            lane.call(blocked, 0.05)
        assert first.value.describe().startswith(
            "DCMI call (card 3) did not answer within 0.05 s (stuck since ")
        # Still inside it: the next call is refused at once, with the same text.
        asked = time.monotonic()
        with pytest.raises(LaneStuck) as second:
            lane.call(lambda: "never run", 5.0)
        assert time.monotonic() - asked < 5.0
        assert second.value.describe() == first.value.describe()
        release.set()
        assert finished.wait(RELEASE_S)
        deadline = time.monotonic() + RELEASE_S
        while True:  # the lane frees itself once the call returns
            try:
                assert lane.call(lambda: "free", 1.0) == "free"
                break
            except LaneStuck:
                assert time.monotonic() < deadline, "the lane never freed"
                finished.wait(0.01)
        # A caller that got its answer may submit again at once: the lane is free by then.
        for turn in range(200):
            assert lane.call(functools.partial(int, turn), 1.0) == turn
    finally:
        release.set()
        lane.close()
