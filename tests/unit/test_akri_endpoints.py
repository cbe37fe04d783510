"""Several endpoints registered under one name: all of them serve, each on its own.

Tables over the pure parts (the table of registrations, ``merging``), then runs of
``ExternalHandler.discover`` against grpcio handlers on Unix sockets of the test's own (the
helpers of test_akri_stand_in). The integration tests (tests/integration/test_akri_endpoints.py)
do the same with Akri's Rust stack against the real API server.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from discovery_handlers.contract import Device, DiscoveryHandler, warnings_of
from discovery_handlers.debug_echo import handler as debug_echo
from discovery_handlers.external.handler import ExternalHandler
from discovery_handlers.external.merging import Standing, Verdict, merged, verdict, warnings
from discovery_handlers.external.registrations import EndpointType, Registration, Registrations
from discovery_handlers.external.retries import REFUSED, UNREACHABLE, Failure
from discovery_handlers.external.status import HandlerStatus
from tests.unit.test_akri_stand_in import _ids, _Run, _run, _serving


def _registration(endpoint: str, generation: int, *, shared: bool = True) -> Registration:
    return Registration(name="h", endpoint=endpoint, endpoint_type=EndpointType.UDS,
                        shared=shared, generation=generation)


A, B = _registration("/a.sock", 1), _registration("/b.sock", 2)


@pytest.mark.parametrize(("lists", "expected"), [
    ([], []),
    ([["a0", "a1"]], ["a0", "a1"]),
    ([["a0"], ["b0"]], ["a0", "b0"]),
    ([["a0", "x"], ["x", "b0"]], ["a0", "x", "b0"]),  # reported twice, listed once
    ([[], ["b0"]], ["b0"]),
])
def test_lists_merge_in_order_each_device_once(
    lists: list[list[str]], expected: list[str],
) -> None:
    assert _ids(merged([Device(id=i) for i in listed] for listed in lists)) == expected


def test_a_device_reported_by_two_endpoints_is_the_first_ones() -> None:
    first = Device(id="x", properties={"BY": "a"})
    [device] = merged([[first], [Device(id="x", properties={"BY": "b"})]])
    assert device is first


LOST = Failure("the socket does not exist", UNREACHABLE)
REFUSAL = Failure("INVALID_ARGUMENT: no", REFUSED)


@pytest.mark.parametrize(("standings", "expected"), [
    ([Standing(A), Standing(B)], None),  # nothing known yet: nothing to say
    ([Standing(A, devices=[]), Standing(B, failure=LOST)],
     Verdict(True, "served by discovery handler 'h' at /a.sock (UDS, shared devices)")),
    ([Standing(A, devices=[]), Standing(B, devices=[])],
     Verdict(True, "served by discovery handler 'h' at /a.sock (UDS, shared devices), "
             "/b.sock (UDS, shared devices)")),
    ([Standing(A, failure=LOST), Standing(B)],
     Verdict(False, "discovery handler 'h' at /a.sock is unreachable (the socket does not "
             "exist); retrying")),
    ([Standing(A, failure=LOST), Standing(B, failure=REFUSAL)],
     Verdict(False, "discovery handler 'h' at /a.sock is unreachable (the socket does not "
             "exist); retrying; discovery handler 'h' at /b.sock failed (INVALID_ARGUMENT: "
             "no); retrying")),
    ([Standing(A, devices=[], left_out=True), Standing(B)], None),
])
def test_the_verdict_follows_the_serving_endpoints(
    standings: list[Standing], expected: Verdict | None,
) -> None:
    assert verdict(standings) == expected


def test_other_endpoints_failures_are_warnings_while_one_serves() -> None:
    assert warnings([Standing(A, failure=LOST), Standing(B)], shared=True) == ()
    assert warnings([Standing(A, devices=[]), Standing(B, failure=LOST)], shared=True) == (
        "discovery handler 'h' at /b.sock is unreachable (the socket does not exist); the "
        "other endpoints of its name serve",)
    local = _registration("/c.sock", 3, shared=False)
    assert warnings([Standing(A, devices=[]), Standing(local, devices=[], left_out=True)],
                    shared=True) == (
        "discovery handler 'h' at /c.sock serves local devices, unlike the run's shared ones: "
        "its devices are left out",)


#: Registrations in turn: (endpoint, shared); the endpoints after each, and whether runs of the
#: name were woken (``changed``).
@pytest.mark.parametrize(("steps", "expected"), [
    ([("/a", True), ("/b", True)], [(["/a"], True), (["/a", "/b"], True)]),
    ([("/a", True), ("/a", True)], [(["/a"], True), (["/a"], False)]),
    ([("/a", True), ("/b", True), ("/a", True), ("/b", True)],
     [(["/a"], True), (["/a", "/b"], True), (["/a", "/b"], False), (["/a", "/b"], False)]),
    ([("/a", True), ("/b", True), ("/a", False)],
     [(["/a"], True), (["/a", "/b"], True), (["/a", "/b"], True)]),
])
def test_every_endpoint_of_a_name_is_kept(
    steps: list[tuple[str, bool]], expected: list[tuple[list[str], bool]],
) -> None:
    table = Registrations()
    for (endpoint, shared), (endpoints, woken) in zip(steps, expected, strict=True):
        changed = table.changed("h")
        table.register(name="h", endpoint=endpoint, endpoint_type=EndpointType.UDS,
                       shared=shared)
        assert [r.endpoint for r in table.endpoints("h")] == endpoints
        assert changed.is_set() is woken


@pytest.fixture
def sockets() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(prefix="endpoints-", dir="/tmp") as tmp:
        yield Path(tmp) / "a.sock", Path(tmp) / "b.sock"


def _register(table: Registrations, name: str, path: Path) -> None:
    table.register(name=name, endpoint=str(path), endpoint_type=EndpointType.UDS, shared=True)


def _only(devices: Sequence[Device]) -> list[str]:
    return sorted(_ids(devices))


async def _until(run: _Run, wanted: Callable[[Sequence[Device]], bool],
                 keep: set[str]) -> Sequence[Device]:
    """The run's lists until one is ``wanted``; every one read meanwhile lists ``keep``."""
    while True:
        listed = await run.next()
        assert keep <= set(_ids(listed)), (_ids(listed), warnings_of(listed))
        if wanted(listed):
            return listed


@pytest.mark.parametrize("builtin", [None, debug_echo], ids=["own-name", "debugEcho"])
async def test_a_second_endpoint_adds_its_devices_once_it_answers_and_takes_none_away(
    sockets: tuple[Path, Path], builtin: DiscoveryHandler | None,
) -> None:
    """An endpoint registered before it serves takes nothing from the one that serves (nor
    does the built-in come back); once it answers, both lists are the run's. The first's
    stream is never dialled again."""
    path_a, path_b = sockets
    name = "debugEcho" if builtin is not None else "multi"
    table = Registrations()
    handler = ExternalHandler(name=name, registrations=table, builtin=builtin, grace=60.0,
                              waiting_on="/x")
    async with _serving(path_a) as first:
        first.refuse, first.ids = None, ["a0", "x"]
        _register(table, name, path_a)
        async with _run(handler, "descriptions: [foo0]") as run:
            served = await run.next()
            assert isinstance(served, HandlerStatus)
            assert _only(served) == ["a0", "x"]

            _register(table, name, path_b)  # nothing serves there yet
            await _until(run, lambda d: any(
                f"at {path_b} is unreachable (" in w and "the other endpoints of its name "
                "serve" in w for w in warnings_of(d)), keep={"a0", "x"})

            async with _serving(path_b) as second:
                second.refuse, second.ids = None, ["x", "b0"]
                _register(table, name, path_b)  # it registers once it serves: dialled now
                both = await _until(run, lambda d: "b0" in _ids(d), keep={"a0", "x"})
                assert _only(both) == ["a0", "b0", "x"]
                assert [w for w in warnings_of(both) if "unreachable" in w] == []
                _register(table, name, path_a)  # the same endpoint again: its stream goes on
                assert second.calls == 1
        assert first.calls == 1


async def test_an_endpoint_that_breaks_takes_only_its_own_devices(
    sockets: tuple[Path, Path],
) -> None:
    path_a, path_b = sockets
    table = Registrations()
    handler = ExternalHandler(name="multi", registrations=table, builtin=None, grace=60.0,
                              waiting_on="/x")
    async with contextlib.AsyncExitStack() as stack:
        second = await stack.enter_async_context(_serving(path_b))
        second.refuse, second.ids = None, ["x", "b0"]
        serving_a = _serving(path_a)
        first = await serving_a.__aenter__()
        first.refuse, first.ids = None, ["a0", "x"]
        _register(table, "multi", path_a)
        _register(table, "multi", path_b)
        run = await stack.enter_async_context(_run(handler, ""))
        await _until(run, lambda d: _only(d) == ["a0", "b0", "x"], keep=set())
        await serving_a.__aexit__(None, None, None)  # its stream breaks
        after = await _until(run, lambda d: "a0" not in _ids(d), keep={"b0", "x"})
        assert _only(after) == ["b0", "x"]
        assert any(f"at {path_a} is unreachable" in w for w in warnings_of(after))
        assert second.calls == 1
