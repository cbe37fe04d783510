"""A registered handler that has not answered yet leaves the built-in of its name serving.

The handler here is a grpcio ``DiscoveryHandler`` on a Unix socket of the test's own, told to
refuse or to answer; the run is ``ExternalHandler.discover`` with the real debugEcho built-in.
The integration tests (tests/integration/test_akri_rust_handler.py) do the same with Akri's
HTTP/2 stack (tonic) against the real API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from discovery_handlers.contract import Device, warnings_of
from discovery_handlers.debug_echo import handler as debug_echo
from discovery_handlers.external import handler as external
from discovery_handlers.external.akriapi import discovery_pb2 as pb
from discovery_handlers.external.akriapi import discovery_pb2_grpc as pb_grpc
from discovery_handlers.external.handler import ExternalHandler, SharingChanged
from discovery_handlers.external.registrations import EndpointType, Registrations
from discovery_handlers.external.retries import REFUSED_RETRY_MAX, RETRY_MAX, retry_delay
from discovery_handlers.external.status import HandlerStatus

NEXT_S = 10.0  # bound on every wait for the run's next list


class _Handler(pb_grpc.DiscoveryHandlerServicer):
    """Refuses every Discover while ``refuse`` is set, else sends ``ids`` (unless ``silent``)
    and holds the stream; ``on_call`` runs at each call (a handler that registers again, say)."""

    def __init__(self) -> None:
        self.refuse: str | None = "not today"
        self.silent = False
        self.ids = ["h0"]
        self.calls = 0
        self.called = asyncio.Condition()
        self.on_call: Callable[[], None] = lambda: None

    async def Discover(
        self, request: pb.DiscoverRequest,
        context: grpc.aio.ServicerContext[pb.DiscoverRequest, pb.DiscoverResponse],
    ) -> AsyncIterator[pb.DiscoverResponse]:
        self.calls += 1
        async with self.called:
            self.called.notify_all()
        self.on_call()
        if self.refuse is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refuse)
        if self.silent:
            await asyncio.Event().wait()
        yield pb.DiscoverResponse(devices=[pb.Device(id=i) for i in self.ids])
        await asyncio.Event().wait()  # the list never changes


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="standin-", dir="/tmp") as tmp:
        yield Path(tmp) / "h.sock"


@contextlib.asynccontextmanager
async def _serving(path: Path) -> AsyncIterator[_Handler]:
    servicer = _Handler()
    server = grpc.aio.server()
    pb_grpc.add_DiscoveryHandlerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(grace=None)


def _register(table: Registrations, path: Path, *, shared: bool = True) -> None:
    table.register(name="debugEcho", endpoint=str(path), endpoint_type=EndpointType.UDS,
                   shared=shared)


class _Run:
    """A discovery run's lists, read as they come (a generator only runs while read)."""

    def __init__(self, lists: AsyncIterator[Sequence[Device]]) -> None:
        self._lists = lists
        self._queue: asyncio.Queue[Sequence[Device] | BaseException] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for devices in self._lists:
                await self._queue.put(devices)
        except Exception as exc:
            await self._queue.put(exc)

    async def next(self) -> Sequence[Device]:
        got = await asyncio.wait_for(self._queue.get(), NEXT_S)
        if isinstance(got, BaseException):
            raise got
        return got

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@contextlib.asynccontextmanager
async def _run(handler: ExternalHandler, details: str) -> AsyncIterator[_Run]:
    run = _Run(handler.discover(handler.parse_details(details, {})))
    try:
        yield run
    finally:
        await run.close()


async def _calls(servicer: _Handler, at_least: int) -> None:
    async with asyncio.timeout(NEXT_S), servicer.called:
        await servicer.called.wait_for(lambda: servicer.calls >= at_least)


def _ids(devices: Sequence[Device]) -> list[str]:
    return [d.id for d in devices]


def test_retries_back_off_to_a_bound() -> None:
    assert [retry_delay(n, refused=True) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert retry_delay(9, refused=True) == REFUSED_RETRY_MAX
    assert retry_delay(10_000, refused=True) == REFUSED_RETRY_MAX
    assert retry_delay(10_000, refused=False) == RETRY_MAX


async def test_a_refusing_handler_leaves_the_built_in_serving_and_says_why(
    socket_path: Path,
) -> None:
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=1.0, waiting_on="/x")
    async with _serving(socket_path) as servicer, _run(handler, "descriptions: [foo0]") as run:
        assert _ids(await run.next()) == ["foo0"]
        _register(table, socket_path)
        noted = await run.next()
        assert _ids(noted) == ["foo0"], "the built-in's devices stay"
        [note] = warnings_of(noted)
        assert f"'debugEcho' at {socket_path} has not answered Discover" in note
        assert "INVALID_ARGUMENT: not today" in note
        assert "the built-in 'debugEcho' serves on this node until it does" in note
        # Refused past the grace for lost handlers: it answered, so it stays registered.
        await _calls(servicer, 4)
        assert table.get("debugEcho") is not None

        servicer.refuse = None  # it answers: it serves from now on
        served = await run.next()
        assert isinstance(served, HandlerStatus)
        assert served.ready
        assert _ids(served) == ["h0"]
        assert warnings_of(served) == (
            f"discovery handler 'debugEcho' registered at {socket_path} serves in place of "
            "the built-in 'debugEcho' on this node",)


async def test_an_unreachable_handler_is_dropped_after_the_grace_and_the_built_in_goes_on(
    socket_path: Path,
) -> None:
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=0.5, waiting_on="/x")
    async with _run(handler, "descriptions: [foo0]") as run:
        assert _ids(await run.next()) == ["foo0"]
        _register(table, socket_path)  # nothing serves there
        noted = await run.next()
        assert "the socket does not exist" in warnings_of(noted)[0]
        again = await run.next()  # dropped after the grace: the note is over
        assert table.get("debugEcho") is None
        assert _ids(again) == ["foo0"]
        assert warnings_of(again) == ()


async def test_a_handler_registering_at_every_call_is_not_asked_faster(
    socket_path: Path,
) -> None:
    """Registering again wakes a retry of a handler that could not be reached (it is back); one
    that refused is asked on its backoff, whatever it does, or it would be called hot."""
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=60.0, waiting_on="/x")
    async with _serving(socket_path) as servicer, _run(handler, "descriptions: [foo0]") as run:
        servicer.on_call = lambda: _register(table, socket_path)
        _register(table, socket_path)
        await run.next()
        await asyncio.sleep(1.5)  # the window counted, the run reading meanwhile
        # Tries at 0, 0.25, 0.75 s (then 1.75): with every registration waking one, hundreds.
        assert servicer.calls <= 4, servicer.calls


async def test_a_handler_of_other_sharing_restarts_the_run_once_it_answers(
    socket_path: Path,
) -> None:
    """Instance names depend on sharing: a local built-in run stays as it is while a handler of
    shared devices has not answered, and starts again (the agent restarts it) once it does."""
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=60.0, waiting_on="/x")
    raw = "descriptions: [foo0]\nshared: false"
    async with _serving(socket_path) as servicer, _run(handler, raw) as run:
        assert _ids(await run.next()) == ["foo0"]
        _register(table, socket_path, shared=True)
        noted = await run.next()
        assert "has not answered" in warnings_of(noted)[0]
        assert handler.parse_details(raw, {}).shared is False, "the built-in serves"
        servicer.refuse = None
        with pytest.raises(SharingChanged, match="shared devices"):
            await run.next()
    assert handler.parse_details(raw, {}).shared is True


async def test_a_handler_answering_at_once_serves_without_the_built_in(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that serves nothing yet gives a registered handler ``HEAD_START`` to answer before
    the built-in serves meanwhile: one that answers at once is all the run sees."""
    monkeypatch.setattr(external, "HEAD_START", 60.0)
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=60.0, waiting_on="/x")
    async with _serving(socket_path) as servicer:
        servicer.refuse = None
        _register(table, socket_path)
        async with _run(handler, "descriptions: [foo0]") as run:
            first = await run.next()
            assert _ids(first) == ["h0"]
            assert isinstance(first, HandlerStatus)
            assert first.ready


async def test_a_handler_that_takes_the_call_and_sends_nothing_leaves_the_built_in_serving(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(external, "HEAD_START", 0.3)
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=60.0, waiting_on="/x")
    async with _serving(socket_path) as servicer:
        servicer.refuse, servicer.silent = None, True
        _register(table, socket_path)
        async with _run(handler, "descriptions: [foo0]") as run:
            first = await run.next()
            assert _ids(first) == ["foo0"]
            if not warnings_of(first):  # the built-in's list came before the note
                first = await run.next()
            [note] = warnings_of(first)
            assert "has not answered Discover (no list 0.3s after the call)" in note
