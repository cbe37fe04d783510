"""Keep the list of OPC-UA servers current: one task per discovery URL, one per server.

``Monitor.lists`` yields the first list once every URL and server has answered or timed out, then a
new list on every change, with warnings for discovery URLs that stopped answering
(docs/handlers/opcua.md, "How it works, and why" and "When a discovery server stops answering").
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from discovery_handlers.contract import Device, DeviceList, Health, run_blocking
from discovery_handlers.opcua import client
from discovery_handlers.opcua.details import OpcuaDetails
from discovery_handlers.opcua.selection import (
    Answer,
    Candidate,
    hosts_to_resolve,
    select,
    url_key,
)

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 1.0  # how long a cancelled task gets to end before it is cancelled again
CANCEL_ROUNDS = 5  # after that many, a task that still runs is left (and logged)
COALESCE_S = 0.02
_ASKED = "discovery URL"  # roles in log lines (and keys of the problems logged once)
_CHECKED = "server"  # after a change, wait this long so a burst of changes makes one list
RESOLVE_CACHE_S = 30.0  # how long a host name's look-up result is reused


@dataclass
class _Server:
    candidate: Candidate
    task: asyncio.Task[None]
    health: Health | None = None  # None: not reachable (absent)
    checked: bool = False


class Monitor:
    """Runs the discovery and check tasks for one Configuration's details."""

    def __init__(self, details: OpcuaDetails) -> None:
        self._details = details
        self._limit = asyncio.Semaphore(details.max_concurrent_checks)
        self._answers: dict[str, Answer] = {}
        self._unresolvable: dict[str, frozenset[str]] = {}
        self._servers: dict[tuple[str, int, str], _Server] = {}
        self._changed = asyncio.Event()
        self._problems: dict[tuple[str, str], str] = {}
        self._resolved: dict[str, tuple[float, bool]] = {}

    async def lists(self) -> AsyncGenerator[Sequence[Device], None]:
        finders = [asyncio.create_task(self._find_loop(url), name=f"opcua-find {url}")
                   for url in self._details.discovery_urls]
        try:
            while not self._settled():
                await self._next_change()
            last: tuple[DeviceList, tuple[str, ...]] | None = None
            while True:
                devices = self._snapshot()
                if (devices, devices.warnings) != last:
                    last = (devices, devices.warnings)
                    yield devices
                await self._next_change()
                await asyncio.sleep(COALESCE_S)
        finally:
            await _cancel_all(finders + [server.task for server in self._servers.values()])

    async def _next_change(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    def _settled(self) -> bool:
        return (len(self._answers) == len(self._details.discovery_urls)
                and all(server.checked for server in self._servers.values()))

    def _snapshot(self) -> DeviceList:
        present = [s for s in self._servers.values() if s.health is not None]
        present.sort(key=lambda s: s.candidate.url)
        warnings = sorted(f"{_ASKED} {url}: {problem}"
                          for (role, url), problem in self._problems.items() if role == _ASKED)
        return DeviceList((s.candidate.device(s.health) for s in present if s.health is not None),
                          warnings)

    async def _find_loop(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._find_once(url)
            except Exception as exc:  # a bug must not end discovery for this URL for good
                log.exception("opcua: %s: discovery round failed", url)
                self._problem(_ASKED, url, f"discovery round failed: {type(exc).__name__}")
                if url not in self._answers:  # the first list must not wait on it forever
                    self._answers[url] = Answer(url, ())
                    self._reconcile()
            await asyncio.sleep(max(0.0, self._details.interval_s - (loop.time() - started)))

    async def _find_once(self, url: str) -> None:
        async with self._limit:
            try:
                found = await client.find_servers(url, limit_s=self._details.timeout_s)
            except client.Unreachable as exc:
                self._problem(_ASKED, url, f"FindServers failed ({exc}); servers known only "
                                           "through it are not listed until it answers")
                answer = Answer(url, ())
            else:
                dropped = found.total - len(found.records)
                self._problem(_ASKED, url, f"FindServers answered {found.total} servers; kept "
                                           f"the first {len(found.records)}" if dropped else None)
                answer = Answer(url, found.records)
        hosts = hosts_to_resolve([answer], names=self._details.application_names)
        self._unresolvable[url] = await self._unresolvable_of(hosts)
        self._answers[url] = answer
        self._reconcile()

    def _reconcile(self) -> None:
        unresolvable = frozenset().union(*self._unresolvable.values())
        wanted = {url_key(c.url): c for c in select(
            self._answers.values(), names=self._details.application_names,
            unresolvable=unresolvable)}
        changed = False
        for key in list(self._servers):
            if key not in wanted:
                gone = self._servers.pop(key)
                gone.task.cancel()
                self._problems.pop((_CHECKED, gone.candidate.url), None)
                changed = changed or gone.health is not None
        for key, candidate in wanted.items():
            known = self._servers.get(key)
            if known is None:
                task = asyncio.create_task(self._check_loop(key), name=f"opcua-check {key}")
                self._servers[key] = _Server(candidate, task)
                changed = True  # the list is not settled until this server is checked
            elif known.candidate != candidate:
                known.candidate = candidate
                changed = changed or known.health is not None
        if changed or len(self._answers) == len(self._details.discovery_urls):
            self._changed.set()

    async def _check_loop(self, key: tuple[str, int, str]) -> None:
        loop = asyncio.get_running_loop()
        while (server := self._servers.get(key)) is not None:
            started = loop.time()
            try:
                await self._check_once(key, server)
            except Exception as exc:  # a bug must not freeze this server's health for good
                log.exception("opcua: %s: check failed", server.candidate.url)
                self._problem(_CHECKED, server.candidate.url, f"check failed: {type(exc).__name__}")
                if not server.checked:  # the first list must not wait on it forever
                    server.checked = True
                    self._changed.set()
            await asyncio.sleep(max(0.0, self._details.interval_s - (loop.time() - started)))

    async def _check_once(self, key: tuple[str, int, str], server: _Server) -> None:
        url = server.candidate.url
        health: Health | None = None
        async with self._limit:
            try:
                health = await client.check(
                    url, limit_s=self._details.timeout_s, security=self._details.security)
            except client.Unreachable as exc:
                problem: str | None = f"not reachable: {exc}"
            else:
                problem = None if health.healthy else f"unhealthy: {health.reason}"
        if self._servers.get(key) is not server:
            return  # dropped by a discovery answer while this check ran
        self._problem(_CHECKED, url, problem)
        if health != server.health or not server.checked:
            server.health = health
            server.checked = True
            self._changed.set()

    async def _unresolvable_of(self, hosts: set[str]) -> frozenset[str]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._resolved = {h: seen for h, seen in self._resolved.items() if seen[0] > now}
        fresh = {h for h in hosts if h in self._resolved and self._resolved[h][0] > now}
        todo = sorted(hosts - fresh)
        results = await asyncio.gather(*(self._resolves(h) for h in todo))
        for host, ok in zip(todo, results, strict=True):
            self._resolved[host] = (now + RESOLVE_CACHE_S, ok)
        return frozenset(h for h in hosts if not self._resolved[h][1])

    async def _resolves(self, host: str) -> bool:
        try:
            async with asyncio.timeout(self._details.timeout_s):
                await run_blocking(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError, UnicodeError):
            return False
        return True

    def _problem(self, role: str, url: str, problem: str | None) -> None:
        """Log a problem when it starts or changes, and its end (never each interval).

        ``role`` keeps a URL asked for servers apart from the same URL checked as a server.
        A discovery URL's problems are also the list's warnings: a change is a new list.
        """
        key = (role, url)
        before = self._problems.get(key)
        if problem == before:
            return
        if role == _ASKED:
            self._changed.set()
        if problem is None:
            del self._problems[key]
            log.info("opcua: %s %s: recovered (%s)", role, url, before)
            return
        self._problems[key] = problem
        log.warning("opcua: %s %s: %s", role, url, problem)


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them, bounded: a library that swallows one cancellation
    (a request finishing as its deadline passes) gets it again, and none can hang the caller."""
    pending = {task for task in tasks if not task.done()}
    for _ in range(CANCEL_ROUNDS):
        if not pending:
            return
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
    if pending:
        log.warning("opcua: %d discovery tasks did not end when cancelled", len(pending))
