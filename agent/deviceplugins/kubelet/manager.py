"""Many plugins, one kubelet: serving, registering, and surviving kubelet restarts.

``PluginManager`` serves each plugin's socket and registers it with the kubelet; it sleeps until
inotify reports a change in the plugin directory (``dirwatch``), then serves again a plugin whose
socket vanished and registers again every plugin the current ``kubelet.sock`` has not seen (a
kubelet restart deletes the sockets). A plugin whose last ListAndWatch stream the kubelet ended
registers again unless a new stream opens within ``settings.device_plugins.hung_up_s``. Its
timers (retry, safety check, polling where inotify is missing) are ``settings.device_plugins``'s.
Why each of these: docs/architecture.md, "The kubelets' allocator".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent.deviceplugins.kubelet.backend import PluginSpec
from agent.deviceplugins.kubelet.dirwatch import DirectoryWatch
from agent.deviceplugins.kubelet.registration import (
    KUBELET_SOCKET_NAME,
    RegistrationFailed,
    register,
)
from agent.deviceplugins.kubelet.server import PluginServer
from agent.metrics import AgentMetrics
from agent.settings import current

log = logging.getLogger(__name__)


_Identity = tuple[int, int]


def _identity(path: Path) -> _Identity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


@dataclass
class _Plugin:
    server: PluginServer
    registered_with: _Identity | None = None
    ever_registered: bool = False
    #: When a registration may be tried again (monotonic); -inf: at once, whatever the clock.
    retry_after: float = -math.inf
    #: Registrations failed in a row (the kubelet down): only the first is a warning.
    failures: int = 0
    #: When the kubelet ended the plugin's last stream (monotonic), while it stays served.
    hung_up_at: float | None = None


class PluginManager:
    """Runs plugins in ``plugin_dir`` and keeps them registered with its kubelet."""

    def __init__(
        self,
        *,
        plugin_dir: Path,
        metrics: AgentMetrics,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET_NAME
        self._metrics = metrics
        self._plugins: dict[str, _Plugin] = {}
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        #: When the earliest registration retry that the last reconcile put off is due.
        self._retry_due: float | None = None

    @property
    def resource_names(self) -> frozenset[str]:
        return frozenset(self._plugins)

    def spec(self, resource_name: str) -> PluginSpec | None:
        plugin = self._plugins.get(resource_name)
        return plugin.server.spec if plugin else None

    async def add(self, spec: PluginSpec) -> None:
        """Serve ``spec`` (replacing a plugin of the same resource) and register it if we can."""
        async with self._lock:
            old = self._plugins.pop(spec.resource_name, None)
            if old is not None:
                await old.server.stop()
            server = PluginServer(
                spec=spec,
                plugin_dir=self.plugin_dir,
                on_hung_up=lambda: self._hung_up(spec.resource_name),
            )
            await server.start()
            plugin = _Plugin(server=server, ever_registered=old is not None and old.ever_registered)
            self._plugins[spec.resource_name] = plugin
            kubelet = _identity(self.kubelet_socket)
            if kubelet is not None:
                await self._register(plugin, kubelet)

    async def remove(self, *resource_names: str) -> None:
        """Stop serving ``resource_names`` and delete their sockets (the kubelet then drops
        them). Every stream ends before the first server stops: one by one, each plugin's end
        waited for the stop of the one before."""
        async with self._lock:
            going = [
                (name, plugin) for name in resource_names
                if (plugin := self._plugins.pop(name, None)) is not None
            ]
            for _name, plugin in going:
                plugin.server.end_streams()
            for name, plugin in going:
                await plugin.server.stop()
                log.info("device plugin removed", extra={"resource": name})

    async def run(self) -> None:
        """Watch for kubelet restarts until cancelled; then stop every plugin."""
        watch = DirectoryWatch(self.plugin_dir, self._changed)
        next_watch_try = -math.inf
        try:
            while True:
                if not watch.alive and time.monotonic() >= next_watch_try:
                    next_watch_try = time.monotonic() + current().device_plugins.watch_retry_s
                    await watch.start()
                try:
                    await self.reconcile()
                except Exception:
                    # A socket that cannot be served now (disk full, directory gone) must not
                    # end the watch; the next event or tick tries again.
                    log.exception("kubelet watch tick failed; retrying")
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
                # cancellation that lands as the event fires.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._next_check(polling=not watch.alive)):
                        await self._changed.wait()
                self._changed.clear()
        finally:
            await watch.close()
            await self.close()

    def _next_check(self, *, polling: bool) -> float:
        """Seconds until a check is due without an event: a retry, the safety net, or a poll."""
        if polling:
            return current().device_plugins.kubelet_watch_interval_s
        if self._retry_due is None:
            return current().device_plugins.safety_check_s
        return max(0.0, min(self._retry_due - time.monotonic(),
                            current().device_plugins.safety_check_s))

    def _hung_up(self, resource_name: str) -> None:
        plugin = self._plugins.get(resource_name)
        if plugin is not None:
            plugin.hung_up_at = time.monotonic()
            self._changed.set()  # the run loop then times the check

    def _due(self, when: float) -> None:
        if self._retry_due is None or when < self._retry_due:
            self._retry_due = when

    async def reconcile(self) -> None:
        """One watch tick: re-serve plugins whose socket went, register unregistered ones."""
        async with self._lock:
            kubelet = _identity(self.kubelet_socket)
            pending = []
            self._retry_due = None
            for plugin in self._plugins.values():
                resource = plugin.server.spec.resource_name
                if not plugin.server.socket_intact():
                    log.info(
                        "plugin socket gone (kubelet restart?): serving again",
                        extra={"resource": resource},
                    )
                    await plugin.server.start()
                    plugin.registered_with = None
                if plugin.hung_up_at is not None:
                    if plugin.server.streams or plugin.registered_with is None:
                        plugin.hung_up_at = None  # called back, or registering anyway
                    elif time.monotonic() >= plugin.hung_up_at + current().device_plugins.hung_up_s:
                        log.info("the kubelet hung up on the plugin and did not call back: "
                                 "registering again", extra={"resource": resource})
                        plugin.hung_up_at = None
                        plugin.registered_with = None
                    else:
                        self._due(plugin.hung_up_at + current().device_plugins.hung_up_s)
                if kubelet is None or plugin.registered_with == kubelet:
                    continue
                if time.monotonic() >= plugin.retry_after:
                    pending.append(self._register(plugin, kubelet))
                else:
                    self._due(plugin.retry_after)
            if pending:
                await asyncio.gather(*pending)

    async def close(self) -> None:
        async with self._lock:
            plugins, self._plugins = self._plugins, {}
            for plugin in plugins.values():
                with contextlib.suppress(Exception):
                    await plugin.server.stop()

    async def _register(self, plugin: _Plugin, kubelet: _Identity) -> None:
        spec = plugin.server.spec
        try:
            await register(
                kubelet_socket=self.kubelet_socket,
                endpoint=spec.socket_name,
                resource_name=spec.resource_name,
                pre_start_required=spec.pre_start_required,
            )
        except RegistrationFailed as error:
            plugin.retry_after = time.monotonic() + current().device_plugins.register_retry_s
            self._changed.set()  # the run loop then times its retry
            plugin.failures += 1
            log.log(logging.WARNING if plugin.failures == 1 else logging.DEBUG,
                    "registration failed; will retry every %.0f s",
                    current().device_plugins.register_retry_s,
                    extra={"resource": spec.resource_name, "error": str(error)})
            return
        if plugin.failures:
            log.info("registered after %d failed attempts", plugin.failures,
                     extra={"resource": spec.resource_name})
        plugin.failures = 0
        plugin.retry_after = -math.inf
        plugin.hung_up_at = None  # a hang-up from here on is about this registration
        kind = "re" if plugin.ever_registered else "first"
        plugin.registered_with = kubelet
        plugin.ever_registered = True
        self._metrics.kubelet_registrations.labels(kind=kind).inc()
        log.info("registered with kubelet", extra={"resource": spec.resource_name, "kind": kind})
