"""One Configuration's ONVIF discovery: probe passes, Hello and Bye, SOAP checks, device lists.

``Scanner.devices`` yields a device list whenever it changes. Passes every
``discoveryIntervalSeconds``, Hello and Bye acted on at once, a camera gone after
``MISSED_PASSES_BEFORE_GONE`` missed passes, each check failure logged once per cause:
docs/handlers/onvif.md, "How it works, and why" and "Health".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence

from discovery_handlers.contract import Device
from discovery_handlers.onvif import wsd_messages
from discovery_handlers.onvif.cameras import (
    WARNING_EXTRA,
    Camera,
    Description,
    auth_warning,
    may_pass_filters,
    visible_devices,
)
from discovery_handlers.onvif.details import OnvifDetails
from discovery_handlers.onvif.soap import CameraError, CameraSession, SoapClients
from discovery_handlers.onvif.wsd_transport import WsdTransport
from discovery_handlers.onvif.xmlsafe import UnsafeXml

log = logging.getLogger(__name__)

MISSED_PASSES_BEFORE_GONE = 2
DESCRIBE_REFRESH_S = 300.0  # a known camera's full description is re-read this often
PROBE_REPEAT_DELAY_S = 0.1  # UDP is lossy: each Probe goes out twice (WS-Discovery's advice)
MAX_CONCURRENT_CHECKS = 32  # SOAP conversations in flight at once
MAX_CAMERAS = 4096  # cameras tracked per Configuration; more are ignored and logged
OLD_PROBE_IDS = 4  # our last Probes, so a late answer is told from a stray one
MAX_WARNED_CAUSES = 8  # per camera; past that the set starts again (a camera failing anew)


def description_due(described_at: float | None, now: float) -> bool:
    """Whether a camera's full description is to be read: never read (or marked stale), or
    read more than ``DESCRIBE_REFRESH_S`` ago. Monotonic clocks start anywhere (near 0 after
    boot), so "never" is ``None``, never a time."""
    return described_at is None or now - described_at > DESCRIBE_REFRESH_S


class Scanner:
    """Runs discovery for one Configuration's details; ``devices()`` streams the lists."""

    def __init__(self, details: OnvifDetails) -> None:
        self._details = details
        self._cameras: dict[str, Camera] = {}
        self._sessions: dict[str, CameraSession] = {}
        self._clients = SoapClients()
        self._pass_checks: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self._probe_id = ""
        self._pass_started: float | None = None  # monotonic; None before the first pass
        self._first_pass_done = False
        self._gathering = False  # a pass is gathering answers to its Probe
        self._checks = asyncio.Semaphore(MAX_CONCURRENT_CHECKS)
        self._hello_tasks: set[asyncio.Task[None]] = set()
        self._warned: set[str] = set()  # senders whose dropped messages were logged
        self._old_probe_ids: collections.deque[str] = collections.deque(maxlen=OLD_PROBE_IDS)
        self._transport = WsdTransport(
            receive=self._on_datagram, multicast=details.multicast, ipv6=details.ipv6
        )

    async def devices(self) -> AsyncGenerator[Sequence[Device], None]:
        await self._transport.open()
        passes = asyncio.create_task(self._passes(), name="onvif-passes")
        last: list[Device] | None = None
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                if passes.done():
                    passes.result()  # a crash of the pass loop propagates to the agent
                if not self._first_pass_done:
                    continue
                current = visible_devices(self._details, self._cameras)
                if current != last:
                    last = current
                    yield current
        finally:
            passes.cancel()
            for task in (passes, *self._hello_tasks):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for check in self._pass_checks.values():
                check.cancel()
            self._transport.close()
            await self._clients.close()

    async def _passes(self) -> None:
        try:
            while True:
                started = time.monotonic()
                await self._one_pass()
                self._first_pass_done = True
                self._changed.set()
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(0.0, self._details.discovery_interval_s - elapsed))
        finally:
            self._changed.set()  # wake the consumer so it sees a crash

    async def _one_pass(self) -> None:
        """Probe, then check every camera: each as soon as it answers, the rest after the wait."""
        self._probe_id = wsd_messages.new_message_id()
        started = self._pass_started = time.monotonic()
        self._pass_checks = {}
        self._gathering = True
        message = wsd_messages.probe(self._probe_id)
        self._transport.send_probe(message, self._details.unicast_targets)
        await asyncio.sleep(PROBE_REPEAT_DELAY_S)
        self._transport.send_probe(message, self._details.unicast_targets)
        await asyncio.sleep(max(0.0, self._details.discovery_timeout_s - PROBE_REPEAT_DELAY_S))
        self._gathering = False  # from now on an answer is checked and published at once
        missed = MISSED_PASSES_BEFORE_GONE * self._details.discovery_interval_s
        horizon = started - missed
        for uuid in [u for u, c in self._cameras.items() if c.last_seen < horizon]:
            self._forget(uuid)
        for camera in list(self._cameras.values()):
            self._check_in_pass(camera)
        await asyncio.gather(*list(self._pass_checks.values()))
        self._pass_checks = {}
        self._old_probe_ids.append(self._probe_id)
        self._probe_id = ""

    def _check_in_pass(self, camera: Camera) -> None:
        if camera.match.uuid not in self._pass_checks:
            task = asyncio.create_task(self._check(camera))
            self._pass_checks[camera.match.uuid] = task

    def _check_now(self, camera: Camera, *, late: bool = False) -> None:
        """Check a camera and publish at once (a Hello, a late answer), unless a pass is
        checking it already or, for a late answer (to the Probe's repeat, often), has found it
        healthy since the pass began."""
        if camera.match.uuid in self._pass_checks:
            return
        fresh = (camera.description is not None and camera.checked_at is not None
                 and self._pass_started is not None and camera.checked_at >= self._pass_started)
        if late and fresh and camera.healthy:
            return
        task = asyncio.create_task(self._check_and_publish(camera))
        self._hello_tasks.add(task)
        task.add_done_callback(self._hello_tasks.discard)

    def _on_datagram(self, data: bytes, sender: str) -> None:
        try:
            message = wsd_messages.read(data)
        except (UnsafeXml, ValueError) as exc:
            self._dropped(sender, str(exc))
            return
        if isinstance(message, wsd_messages.Dropped):
            self._dropped(sender, message.reason, quiet=message.quiet)
        elif isinstance(message, wsd_messages.ProbeMatches):
            self._on_probe_matches(message, sender)
        elif isinstance(message, wsd_messages.Hello):
            camera = self._seen(message.match, sender)
            if camera is not None:
                self._check_now(camera)
        elif isinstance(message, wsd_messages.Bye) and message.uuid in self._cameras:
            self._forget(message.uuid)
            self._changed.set()

    def _on_probe_matches(self, message: wsd_messages.ProbeMatches, sender: str) -> None:
        current = bool(self._probe_id) and message.relates_to == self._probe_id
        if not current and message.relates_to not in self._old_probe_ids:
            self._dropped(sender, "ProbeMatches that relate to no Probe we sent (RelatesTo "
                          f"{wsd_messages.short(message.relates_to)!r})")
            return
        in_time = current and self._gathering
        if not in_time:
            timeout = self._details.discovery_timeout_s
            log.debug("%s answered after discoveryTimeoutSeconds (%g); checked at once",
                      sender, timeout)
        for reason in message.dropped:
            self._dropped(sender, reason)
        for match in message.matches:
            camera = self._seen(match, sender)
            if camera is None:
                continue
            if in_time:
                self._check_in_pass(camera)
            else:
                self._check_now(camera, late=True)

    def _seen(self, match: wsd_messages.Match, sender: str) -> Camera | None:
        camera = self._cameras.get(match.uuid)
        now = time.monotonic()
        if camera is None:
            if len(self._cameras) >= MAX_CAMERAS:
                self._dropped(sender, f"more than {MAX_CAMERAS} cameras; ignoring the rest")
                return None
            camera = Camera(match=match, source=sender, last_seen=now)
            camera.pin_url()
            self._cameras[match.uuid] = camera
            return camera
        if camera.match != match or camera.source != sender:
            stale = camera.match.xaddrs != match.xaddrs or (
                camera.match.metadata_version != match.metadata_version
            )
            camera.match, camera.source = match, sender
            camera.pin_url()
            if stale:
                camera.described_at = None  # re-read the description on the next check
        camera.last_seen = now
        return camera

    def _forget(self, uuid: str) -> None:
        self._cameras.pop(uuid, None)
        self._sessions.pop(uuid, None)

    async def _check_and_publish(self, camera: Camera) -> None:
        await self._check(camera)
        self._changed.set()

    async def _check(self, camera: Camera) -> None:
        """Clock check, and a description when due; updates health in place."""
        async with self._checks:
            session = self._session_for(camera)
            try:
                was_locked = session.locked
                await session.check_clock()
                due = description_due(camera.described_at, time.monotonic())
                if due or session.locked != was_locked:
                    description = await session.describe()
                    if description.mandatory_fault:
                        self._keep_faulted(camera, description)
                        raise CameraError(description.mandatory_fault)
                    self._note_profiles(camera, description)
                    camera.description = description
                    camera.described_at = time.monotonic()
                    self._note_auth(camera)
            except CameraError as exc:
                self._note_failure(camera, exc)
                camera.healthy, camera.reason = False, exc.reason
                return
            if not camera.healthy:
                log.info("%s answers again", _name(camera))
            camera.healthy, camera.reason = True, ""
            camera.warned.clear()
            camera.checked_at = time.monotonic()

    @staticmethod
    def _keep_faulted(camera: Camera, description: Description) -> None:
        """A camera whose mandatory call faulted keeps what it last said in full; one that never
        did is listed with what it says now (it answers SOAP: it is a camera, unhealthy). Its
        description stays due, so the next check asks again."""
        if camera.description is None or camera.description.mandatory_fault:
            camera.description = description

    def _note_failure(self, camera: Camera, exc: CameraError) -> None:
        """Log a failed check: once per cause at warning level, then at debug level."""
        if camera.description is not None:
            outcome = "is unhealthy"
        else:
            outcome = "is not listed (it has not answered SOAP in full yet)"
        message = f"{_name(camera)} {outcome}: {exc.reason}"
        if exc.cause in camera.warned or not may_pass_filters(self._details, camera):
            log.debug("%s", message)
            return
        if len(camera.warned) >= MAX_WARNED_CAUSES:
            camera.warned.clear()
        camera.warned.add(exc.cause)
        log.warning("%s (until it answers, the same again at debug level)", message)

    @staticmethod
    def _note_profiles(camera: Camera, description: Description) -> None:
        """Say which profiles have no stream URI (so no ONVIF_STREAM_URI_<TOKEN>, and not in
        ONVIF_DEVICE_PROFILES), when that changes."""
        left_out = description.profiles_left_out
        before = camera.description.profiles_left_out if camera.description else ()
        if not left_out or left_out == before:
            return
        tokens = ", ".join(token for token, _ in left_out)
        reasons = "; ".join(sorted({why for _, why in left_out}))
        log.info("%s: profile(s) %s have no stream URI and are left out of "
                 "ONVIF_DEVICE_PROFILES: %s", _name(camera), tokens, reasons)

    def _session_for(self, camera: Camera) -> CameraSession:
        uuid = camera.match.uuid
        session = self._sessions.get(uuid)
        if session is None or session.xaddr != camera.service_url:
            credential = self._details.credentials.lookup(uuid)
            session = CameraSession(self._clients, camera.service_url, credential)
            self._sessions[uuid] = session
        return session

    def _note_auth(self, camera: Camera) -> None:
        warning = auth_warning(camera)
        if warning and camera.extra.get(WARNING_EXTRA) != warning:
            log.warning("%s", warning)
        camera.extra = {WARNING_EXTRA: warning} if warning else {}

    def _dropped(self, sender: str, reason: str, *, quiet: bool = False) -> None:
        """Say why a message was not used: a warning the first time per sender, then debug."""
        if quiet or sender in self._warned:
            log.debug("ignored a WS-Discovery datagram from %s: %s", sender, reason)
            return
        if len(self._warned) >= MAX_CAMERAS:
            self._warned.clear()
        self._warned.add(sender)
        log.warning(
            "ignored a WS-Discovery datagram from %s: %s (more from this sender: debug level)",
            sender, reason,
        )


def _name(camera: Camera) -> str:
    """How logs name a camera: its service URL, uuid and the address it was heard from."""
    return (f"camera {camera.service_url} (uuid {camera.match.uuid}, "
            f"heard from {camera.source})")
