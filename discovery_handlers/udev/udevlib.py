"""The thin seam over libudev (through pyudev): enumeration, device reads, the event monitor.

Reads that fail (a vanished device, an unreadable attribute) read as absent. Everything here blocks
except ``Monitor.drain``; see docs/handlers/udev.md, "Inside the handler".
"""

from __future__ import annotations

import errno
import logging
import os
import select
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyudev

from discovery_handlers import pci
from discovery_handlers.udev.devices import NodeRecord
from discovery_handlers.udev.matching import MAX_PARENT_DEPTH, first_match
from discovery_handlers.udev.patterns import enumerator_safe
from discovery_handlers.udev.rules import SUBSYSTEM_ALIASES, Key, Rule

log = logging.getLogger(__name__)

#: Present when a udev daemon runs on the host: then listen to udev's processed events too
#: (with its database written: ID_* properties, links), besides the kernel's own uevents.
UDEV_CONTROL = "/run/udev/control"
#: Kernel receive buffer asked for the monitor socket (udevadm asks 128 MiB); a burst larger
#: than this overflows, and discovery re-enumerates.
MONITOR_BUFFER_BYTES = 16 * 1024 * 1024
#: Events taken per reader callback, so a flood cannot hold the event loop.
MAX_EVENTS_PER_DRAIN = 512


class View:
    """A ``matching.DeviceView`` over a pyudev Device; reads that fail read as absent."""

    __slots__ = ("_device", "_parent", "_parent_read")

    def __init__(self, device: Any) -> None:
        self._device = device
        self._parent: View | None = None
        self._parent_read = False

    @property
    def devpath(self) -> str:
        return _safe(lambda: str(self._device.device_path)) or ""

    @property
    def sys_path(self) -> str:
        return _safe(lambda: str(self._device.sys_path)) or ""

    @property
    def kernel(self) -> str:
        return _safe(lambda: str(self._device.sys_name)) or ""

    @property
    def subsystem(self) -> str | None:
        return _text(lambda: self._device.subsystem)

    @property
    def driver(self) -> str | None:
        return _text(lambda: self._device.driver)

    @property
    def tags(self) -> frozenset[str]:
        return _safe(lambda: frozenset(str(t) for t in self._device.tags)) or frozenset()

    @property
    def parent(self) -> View | None:
        if not self._parent_read:
            self._parent_read = True
            parent = _safe(lambda: self._device.parent)
            self._parent = View(parent) if parent is not None else None
        return self._parent

    @property
    def devnode(self) -> str | None:
        return _text(lambda: self._device.device_node)

    def attribute(self, name: str) -> bytes | None:
        value = _safe(lambda: self._device.attributes.get(name))
        return value if isinstance(value, bytes) else None

    def property(self, name: str) -> str | None:
        value = _safe(lambda: self._device.properties.get(name))
        return value if isinstance(value, str) else None


def _safe(read: Any) -> Any:
    try:
        return read()
    except Exception as exc:  # a vanished device, an unreadable attribute, odd bytes
        log.debug("udev read failed: %s", exc)
        return None


def _text(read: Any) -> str | None:
    value = _safe(read)
    return str(value) if value is not None else None


def record_of(view: View, *, anchor: str | None = None) -> NodeRecord:
    """What discovery keeps of a matched device (all reads done now, while it is there).
    ``anchor``: the DEVTYPE of the ancestor whose DEVPATH becomes the device's id."""
    devnode = view.devnode
    ancestor_node = None
    anchor_path = None
    usb: View | None = None
    depth = 0
    current: View | None = view
    while current is not None and depth < MAX_PARENT_DEPTH:
        if current is not view and ancestor_node is None and devnode is None:
            ancestor_node = current.devnode
        if (usb is None and current.subsystem == "usb"
                and current.property("DEVTYPE") == "usb_device"):
            usb = current
        if anchor is not None and anchor_path is None and current.property("DEVTYPE") == anchor:
            anchor_path = current.devpath
        if (usb is not None and (devnode is not None or ancestor_node is not None)
                and (anchor is None or anchor_path is not None)):
            break
        current = current.parent
        depth += 1
    links = (view.property("DEVLINKS") or "").split()
    location = pci.locate(view.sys_path) if view.sys_path else {}
    return NodeRecord(
        devpath=view.devpath,
        devnode=devnode,
        ancestor_node=ancestor_node,
        devlinks=tuple(links),
        vendor_id=_attr_text(usb, "idVendor") or view.property("ID_VENDOR_ID"),
        product_id=_attr_text(usb, "idProduct") or view.property("ID_MODEL_ID"),
        serial=_attr_text(usb, "serial") or view.property("ID_SERIAL_SHORT"),
        anchor=anchor_path,
        pcie_root=location.get("pcie_root"),
        numa_node=location.get("numa_node"),
    )


def _attr_text(view: View | None, name: str) -> str | None:
    if view is None:
        return None
    raw = view.attribute(name)
    return raw.decode("utf-8", errors="replace").strip() if raw is not None else None


def new_context() -> Any:
    return pyudev.Context()


def enumerate_matches(context: Any, rules: tuple[Rule, ...]) -> dict[str, NodeRecord]:
    """Every device on the host that matches any rule, by DEVPATH."""
    found: dict[str, NodeRecord] = {}
    prefilters = [_prefilter(rule) for rule in rules]
    if all(p is not None for p in prefilters):
        candidates: Iterable[Any] = _chain_enumerations(context, prefilters)
    else:
        candidates = context.list_devices()
    for device in _safe_iter(candidates):
        view = View(device)
        if view.devpath and view.devpath not in found:
            _keep_if_matched(found, rules, view)
    return found


def subtree_matches(context: Any, rules: tuple[Rule, ...], sys_path: str) -> dict[str, NodeRecord]:
    """The matching devices at ``sys_path`` and below it (after an add or change there)."""
    try:
        top = pyudev.Devices.from_sys_path(context, sys_path)
    except Exception as exc:  # gone already: nothing there matches
        log.debug("device %s vanished before it was read: %s", sys_path, exc)
        return {}
    found: dict[str, NodeRecord] = {}
    for device in _safe_iter(context.list_devices().match_parent(top)):
        view = View(device)
        if view.devpath:
            _keep_if_matched(found, rules, view)
    return found


def _keep_if_matched(found: dict[str, NodeRecord], rules: tuple[Rule, ...], view: View) -> None:
    rule = first_match(rules, view)
    if rule is not None:
        found[view.devpath] = record_of(view, anchor=rule.anchor)


def _prefilter(rule: Rule) -> dict[str, str] | None:
    """libudev enumeration filters that narrow the scan for ``rule`` without changing the
    result (our matcher still checks every clause); None when the rule gives none."""
    for match in rule.own:
        source = match.pattern.source
        if match.negate or not enumerator_safe(source) or source in SUBSYSTEM_ALIASES:
            continue  # libudev's filters would read this value differently from udev's rules
        if match.key is Key.SUBSYSTEM:
            return {"subsystem": match.pattern.source}
        if match.key is Key.KERNEL:
            return {"sys_name": match.pattern.source}
    return None


def _chain_enumerations(context: Any, filters: list[dict[str, str] | None]) -> Iterator[Any]:
    for kwargs in filters:
        assert kwargs is not None
        yield from context.list_devices(**kwargs)


def _safe_iter(devices: Iterable[Any]) -> Iterator[Any]:
    iterator = iter(devices)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except Exception as exc:  # a device that vanished between listing and reading
            log.debug("skipping a device during enumeration: %s", exc)


@dataclass(frozen=True)
class Event:
    """One uevent as discovery needs it."""

    action: str
    sys_path: str
    old_sys_path: str | None = None  # for ``move``


class MonitorBroken(OSError):
    """The monitor socket failed (not an overflow): it must be reopened."""


class Overflow(OSError):
    """The kernel dropped events (``ENOBUFS``): the device list must be re-enumerated."""


class Monitor:
    """The started uevent monitors behind one pollable descriptor (an epoll set): ``fileno``
    for the loop's reader, ``drain`` to receive from every source.

    The kernel source always: kernel uevents reach a pod in its own network namespace too.
    The udev source as well when a udev daemon runs on the host (``/run/udev/control``): its
    events come once udev has written its database (``ID_*`` properties, ``/dev/serial/by-id``
    links), which rules on ``ENV{...}`` need; they reach only processes in the host's network
    namespace (``hostNetwork``). Either event makes discovery re-read the device, so a second
    copy of the same change costs one re-read and changes nothing.
    """

    def __init__(self, context: Any) -> None:
        self.sources = ["kernel", *(["udev"] if os.path.exists(UDEV_CONTROL) else [])]
        self.source = "+".join(self.sources)
        self._monitors = [_started(context, source) for source in self.sources]
        self._epoll: select.epoll | None = select.epoll()
        for monitor in self._monitors:
            self._epoll.register(monitor.fileno(), select.EPOLLIN)

    def fileno(self) -> int:
        if self._epoll is None:
            raise MonitorBroken(errno.EBADF, "uevent monitor closed")
        return self._epoll.fileno()

    def socket_fds(self) -> list[int]:
        """The netlink sockets themselves (tests break one to see discovery recover)."""
        return [int(m.fileno()) for m in self._monitors]

    def drain(self) -> list[Event]:
        """Events waiting now (never blocks). Raises ``Overflow`` or ``MonitorBroken``."""
        events: list[Event] = []
        for monitor in self._monitors:
            events += _drain_one(monitor)
        return events

    def close(self) -> None:
        """Let go of the sockets: pyudev unrefs each monitor (closing it) when collected."""
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        self._monitors = []


def _started(context: Any, source: str) -> Any:
    monitor = pyudev.Monitor.from_netlink(context, source=source)
    try:
        monitor.set_receive_buffer_size(MONITOR_BUFFER_BYTES)
    except Exception as exc:  # needs CAP_NET_ADMIN; the default buffer still works
        log.debug("monitor buffer size not raised: %s", exc)
    monitor.start()
    return monitor


def _drain_one(monitor: Any) -> list[Event]:
    events: list[Event] = []
    for _ in range(MAX_EVENTS_PER_DRAIN):
        try:
            device = monitor.poll(timeout=0)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                raise Overflow(errno.ENOBUFS, "uevent monitor overflowed") from exc
            raise MonitorBroken(exc.errno or errno.EIO,
                                f"uevent monitor failed: {exc}") from exc
        except Exception as exc:
            raise MonitorBroken(errno.EIO, f"uevent monitor failed: {exc}") from exc
        if device is None:
            break
        event = _event_of(device)
        if event is not None:
            events.append(event)
    return events


def _event_of(device: Any) -> Event | None:
    action = _safe(lambda: device.action) or "change"
    sys_path = _safe(lambda: device.sys_path)
    if not sys_path:
        return None
    old = _safe(lambda: device.properties.get("DEVPATH_OLD"))
    return Event(action=str(action), sys_path=str(sys_path),
                 old_sys_path=f"/sys{old}" if isinstance(old, str) and old else None)
