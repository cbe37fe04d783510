"""Keep every process the suite starts off this machine's own kubelet, CDI and Akri directories.

The agent's defaults are a node's paths (``/var/lib/kubelet/device-plugins``,
``/var/run/cdi``, ``/var/lib/akri``, ...). An agent a test starts with one of them left at its
default shares it with whatever else runs on the machine: test_helm's agent once served its
handler registration in the host's ``/var/lib/akri``, where another process had registered a
debugEcho handler; the agent restored that registration from the record kept there and let it
take debugEcho over, and the test failed for a reason that was not in the test.

- ``PATH_SETTINGS``: the agent's path settings (variable, field, the environment's default),
  read from ``agent.settings`` itself, so a path setting added there is covered here at once.
- ``refuse_host_paths`` / ``refuse_host_environment``: raise ``NotHermetic`` naming the
  variable and the path for every path the agent would use (its feature on) that lies in one
  of those default directories. Every harness start of an agent process calls one.
- ``own_paths``: an environment (a rendered DaemonSet's) with every path the agent would use
  moved under a directory of the test's own, as a node's mounts would place them
  (``/var/lib/akri`` -> ``<own>/var/lib/akri``); a setting turned off (empty) stays off.
- ``controller_environment``: the controller's namespace given (``POD_NAMESPACE``), so it never
  reads the namespace of a pod the suite happens to run in.
- ``HostWatch``: what any process does to a file in those directories (inotify: opened, read,
  written, created, deleted), even a socket that is gone again by the test's end;
  tests/conftest.py reads it after every test and fails the test during which it happened.
  Directories alone are not reported: a real node's mount namespace leaves empty mount points
  behind, which hold nothing a process could read.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from asyncinotify import Event, Inotify, Mask, Watch

from agent.settings import ENVIRONMENT, AgentSettings, SettingsError
from controller.settings import DEFAULT_NAMESPACE

_PROBE_NODE: Final = "hermetic-probe"
_PROBE_PATH: Final = Path("/edgeplug-hermetic-probe")
#: Fields the agent reads only while other settings are on: one of the groups listed, each
#: field of that group truthy.
ONLY_WITH: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "plugin_dir": (("serve_device_plugins",),),
    "pod_resources_socket": (("serve_device_plugins",),),
    "dra_plugins_dir": (("serve_dra", "dra_registry_dir"),),
    "dra_registry_dir": (("serve_dra",),),
    # The pods bound here (device plugins) and the claims to prepare (the DRA plugin).
    "kubelet_client_cert": (("serve_device_plugins",), ("serve_dra", "dra_registry_dir")),
}


class NotHermetic(AssertionError):
    """A process a test starts would use one of this machine's own default directories."""


@dataclass(frozen=True)
class PathSetting:
    """One path setting of the agent: its variable, its ``AgentSettings`` field, and the
    path the environment gives it by default (a node's)."""

    variable: str
    field: str
    default: Path

    @property
    def directory(self) -> Path:
        """The default's directory (a socket's parent)."""
        return self.default.parent if self.default.suffix else self.default


def _path_settings() -> tuple[PathSetting, ...]:
    base = {"NODE_NAME": _PROBE_NODE}
    defaults = AgentSettings.from_env(base)
    found = []
    for variable in (v.name for v in ENVIRONMENT):
        try:
            probed = AgentSettings.from_env({**base, variable: str(_PROBE_PATH)})
        except SettingsError:
            continue  # not a path (a port, a number)
        for setting in fields(AgentSettings):
            default = getattr(defaults, setting.name)
            if getattr(probed, setting.name) == _PROBE_PATH and isinstance(default, Path):
                found.append(PathSetting(variable, setting.name, default))
    return tuple(found)


PATH_SETTINGS: Final = _path_settings()
#: The host directories the agent's defaults name.
HOST_DIRECTORIES: Final = tuple(sorted({s.directory for s in PATH_SETTINGS}))


def _within(path: Path, directory: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real == top or real.startswith(top.rstrip("/") + "/")


def on_host(path: Path) -> bool:
    """Whether ``path`` lies in one of the host directories the agent's defaults name."""
    return any(_within(path, d) for d in HOST_DIRECTORIES)


def _used(settings: AgentSettings, field_name: str) -> bool:
    return any(all(getattr(settings, switch) for switch in group)
               for group in ONLY_WITH.get(field_name, ((),)))


def host_paths(settings: AgentSettings) -> list[tuple[PathSetting, Path]]:
    """The path settings ``settings`` would have the agent use on the host."""
    found = []
    for setting in PATH_SETTINGS:
        value = getattr(settings, setting.field)
        if isinstance(value, Path) and _used(settings, setting.field) and on_host(value):
            found.append((setting, value))
    return found


def refuse_host_paths(settings: AgentSettings, *, what: str) -> None:
    """Raise ``NotHermetic`` if ``settings`` would have ``what`` use a host default path."""
    used = host_paths(settings)
    if used:
        named = ", ".join(f"{s.variable}={path}" for s, path in used)
        raise NotHermetic(
            f"{what} would use this machine's own {named}: give it directories of the test's "
            "own (tests/harness/hermetic.py own_paths), or turn the setting off (empty)")


def refuse_host_environment(env: Mapping[str, str], *, what: str) -> None:
    """``refuse_host_paths`` for the settings an agent started with ``env`` reads."""
    refuse_host_paths(AgentSettings.from_env(env), what=what)


def own_paths(env: Mapping[str, str], own: Path) -> dict[str, str]:
    """``env`` with each of the agent's path settings moved under ``own``: a path given (the
    host path a DaemonSet mounts) or left to its default goes to ``own`` plus that path; an
    empty one (the feature off) stays empty."""
    moved = dict(env)
    for setting in PATH_SETTINGS:
        value = env.get(setting.variable)
        if value == "":
            continue
        path = Path(value) if value is not None else setting.default
        moved[setting.variable] = str(own / path.relative_to(path.anchor))
    return moved


def controller_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the controller's own namespace given, as the downward API gives it
    (``POD_NAMESPACE``); without it the controller reads the service-account namespace file
    of whatever pod this machine is."""
    return {**env, "POD_NAMESPACE": env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE}


# -- the guard ------------------------------------------------------------------------------

#: What a process does to a file that the guard reports (a directory alone is not reported).
_REPORTED: Final = (Mask.ACCESS | Mask.MODIFY | Mask.ATTRIB | Mask.CLOSE_WRITE | Mask.OPEN
                    | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.CREATE | Mask.DELETE)
#: Events on a watched directory itself, or on an ancestor that leads to one not made yet.
_TREE: Final = Mask.CREATE | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
#: How often the watch's thread looks whether it is to stop.
POLL_S: Final = 0.2
_WORDS: Final = (("CREATE", "created"), ("DELETE", "deleted"), ("MOVED_TO", "moved in"),
                 ("MOVED_FROM", "moved out"), ("MODIFY", "written"), ("CLOSE_WRITE", "written"),
                 ("ATTRIB", "changed"), ("OPEN", "opened"), ("ACCESS", "read"))


def _what(mask: Mask) -> str:
    return next((word for flag, word in _WORDS if mask & Mask[flag]), str(mask))


class HostWatch:
    """What any process does, while the suite runs, to a file in the host's default
    directories (inotify): opened, read, written, created, deleted. A directory that does not
    exist yet is watched for from its nearest ancestor and watched as soon as it is made, its
    files at that moment reported as created; likewise every directory made inside one. A
    thread of its own reads the events as they come, so a directory made is watched at once;
    ``changed`` reads what the kernel holds by then as well."""

    def __init__(self, directories: Iterable[Path] = HOST_DIRECTORIES) -> None:
        self.directories = tuple(Path(os.path.realpath(d)) for d in directories)
        self._inotify = Inotify(sync_timeout=0)
        self._watched: dict[Path, Watch] = {}
        self._found: list[str] = []
        self._lock = threading.RLock()  # the thread's drain, or the caller's
        self._stop = threading.Event()
        self._arm()
        self._reader = threading.Thread(target=self._read, name="hermetic-watch", daemon=True)
        self._reader.start()

    def close(self) -> None:
        self._stop.set()
        self._reader.join()
        self._inotify.close()

    def _inside(self, path: Path) -> bool:
        return any(path == d or d in path.parents for d in self.directories)

    def _note(self, line: str) -> None:
        if line not in self._found:
            self._found.append(line)

    def _add(self, path: Path, mask: Mask) -> bool:
        """Watch ``path``; True when this made a new watch."""
        if path in self._watched:
            return False
        with contextlib.suppress(OSError):  # gone again: the ancestor's watch still tells
            self._watched[path] = self._inotify.add_watch(path, mask)
            return True
        return False

    def _arm(self, *, report: bool = False) -> None:
        """Watch each directory's tree where it exists, else its nearest existing ancestor,
        again until a pass adds no watch (what was made before a watch began shows up in the
        next pass, what after it as an event). ``report``: files in a directory watched only
        now are reported as created."""
        while True:
            added = False
            for directory in self.directories:
                if directory.is_dir():
                    added = self._watch_tree(directory, report=report) or added
                    continue
                ancestor = directory.parent
                while not ancestor.is_dir():
                    ancestor = ancestor.parent
                added = self._add(ancestor, _TREE) or added
            if not added:
                return

    def _watch_tree(self, top: Path, *, report: bool) -> bool:
        """Watch ``top`` and every directory below it, each before it is listed."""
        new = added = self._add(top, _REPORTED | _TREE)
        try:
            entries = list(os.scandir(top))
        except OSError:
            return added
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                added = self._watch_tree(Path(entry.path), report=report) or added
            elif report and new:
                self._note(f"created {entry.path}")
        return added

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._inotify.fd], [], [], POLL_S)
            if ready:
                self._drain()

    def _drain(self) -> None:
        """Handle every event the kernel holds now (the thread and ``changed`` both call it)."""
        with self._lock:
            while (event := self._inotify.sync_get()) is not None:
                self._handle(event)

    def _handle(self, event: Event) -> None:
        if event.mask & Mask.Q_OVERFLOW:
            self._note("events lost (the kernel's queue overflowed)")
            self._arm(report=True)
            return
        if event.mask & (Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF):
            gone = event.watch
            self._watched = {p: w for p, w in self._watched.items() if w is not gone}
            self._arm(report=True)
            return
        if event.path is None:
            return
        if event.mask & Mask.ISDIR:
            if event.mask & (Mask.CREATE | Mask.MOVED_TO):
                self._arm(report=True)
            return
        path = Path(os.path.realpath(event.path.parent)) / event.path.name
        if self._inside(path):
            self._note(f"{_what(event.mask)} {path}")

    def changed(self) -> list[str]:
        """What was done to files there since the last call (or since this watch began),
        every event the kernel holds by now included."""
        self._drain()
        with self._lock:
            found, self._found = self._found, []
        return found

    def complaint(self, during: str) -> str | None:
        """The failure message for what was done there since the last look, or None."""
        found = self.changed()
        if not found:
            return None
        listed = "\n".join(f"  {line}" for line in found)
        return (f"NOT HERMETIC: files in this machine's own "
                f"{', '.join(map(str, self.directories))} were used during {during} (or a "
                f"fixture that ended just before it):\n{listed}\n"
                "Every process a test starts must use directories of its own "
                "(tests/harness/hermetic.py); a process outside the suite using them "
                "shows here too.")
