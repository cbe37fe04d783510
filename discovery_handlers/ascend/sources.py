"""One discovery pass over a node's NPUs: DCMI first, then ``npu-smi info``, then the device nodes.

Each pass tries the sources the details allow, in order, and keeps the first that lists chips;
``ScanStatus`` says which one it used and everything it could not read. Chips split into vNPUs
are served by the Configuration naming their type (``vnpuType``) and left out of the others.
The pass blocks (ctypes, a subprocess, ``stat``) and never raises on bad input from the node.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, replace

from discovery_handlers import pci
from discovery_handlers.ascend import dcmi, dcmi_lanes
from discovery_handlers.ascend.chips import Chip, wanted
from discovery_handlers.ascend.details import (
    SOURCE_DCMI,
    SOURCE_DEVICES,
    SOURCE_NPU_SMI,
    AscendDetails,
)
from discovery_handlers.ascend.devices import (
    OPTIONAL_SHARED_NODES,
    SHARED_NODES,
    chip_node,
    to_device,
    vnpu_device,
    vnpu_node,
)
from discovery_handlers.ascend.faults import chip_health
from discovery_handlers.ascend.npu_smi import (
    VNPU_TOTAL,
    MapRow,
    NpuSmiError,
    assign_ids,
    parse_info_vnpu,
    parse_npu_smi_info,
    parse_npu_smi_map,
    parse_phyid_remap,
)
from discovery_handlers.ascend.vnpu import VNpu, vnpu_type
from discovery_handlers.ascend.vnpu_claims import made_on
from discovery_handlers.ascend.vnpu_partitions import partition_devices
from discovery_handlers.contract import Device, Health

NPU_SMI_TIMEOUT_S = 10.0  # npu-smi info answers in well under a second on a healthy node
NPU_SMI_MAX_OUTPUT = 1 << 20  # bytes of npu-smi output read at most
_DAVINCI = re.compile(r"^davinci(\d+)$")
NO_SOURCE = "none"
#: What a chip found by its device node alone says to users (a Warning Event on its Instance).
NO_HEALTH = "no DCMI or npu-smi: health unknown"
MAX_REMAP_QUERIES = 64  # phyid-remap questions per node at most (more chips than any node has)
MAX_REMAPS_KEPT = 16
#: How long an ``npu-smi info -t info-vnpu`` answer is kept: vNPUs change only when an admin
#: creates or destroys one (after which Huawei's plugin must be restarted to see it).
VNPU_REREAD_S = 30.0
MAX_VNPU_ANSWERS_KEPT = 1024
_vnpu_answers: dict[tuple[str, int, int], tuple[float, tuple[VNpu, ...] | None, str]] = {}
#: Answers of ``npu-smi info -t phyid-remap``, per tool and set of device nodes.
_remaps: dict[tuple[str, frozenset[int]], dict[tuple[int, int], int]] = {}


@dataclass(frozen=True)
class ScanStatus:
    """Which source a pass used (``none`` when none listed chips) and what it could not read."""

    source: str
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()  # what is as it should be but not served (chips split in vNPUs)

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    def __str__(self) -> str:
        return "; ".join((f"source {self.source}", *self.problems, *self.notes))


@dataclass(frozen=True)
class Scan:
    devices: tuple[Device, ...]
    status: ScanStatus


def scan(details: AscendDetails) -> Scan:
    """One pass: the node's chips as devices, and how they were found."""
    problems: list[str] = []
    chips: tuple[Chip, ...] = ()
    source = NO_SOURCE
    for candidate in details.sources:
        before = len(problems)
        found = _read(candidate, details, problems)
        if found:
            chips, source = found, candidate
            break
        if len(problems) == before:  # the source worked and saw no chip
            problems.append(f"{candidate}: no chips found")
    chips = tuple(sorted({c.phy_id: c for c in chips if wanted(c, details.chip_names)}.values(),
                         key=lambda c: c.phy_id))
    for chip in chips:
        problems.extend(chip.problems)
    shared = [n for n in SHARED_NODES if os.path.exists(details.on_host(n))]
    missing_shared = [n for n in SHARED_NODES if n not in shared]
    shared += [n for n in OPTIONAL_SHARED_NODES if os.path.exists(details.on_host(n))]
    if missing_shared:
        problems.append(f"shared device nodes missing: {', '.join(missing_shared)}")
    driver = os.path.isdir(details.on_host(details.driver_path))
    if details.mount_driver and not driver:
        problems.append(f"driver directory {details.driver_path} missing: not mounted")
    devices = []
    split: list[str] = []
    ours = made_on(details.host_root)  # vNPUs made for claims: their chip stays partitioned
    for chip in chips:
        admins = tuple(v for v in chip.vnpus or () if (chip.phy_id, v.vdev_id) not in ours)
        health = chip.health
        node = chip_node(chip.phy_id)
        if not os.path.exists(details.on_host(node)):
            health = Health.unhealthy(f"device node {node} missing")
        elif missing_shared:
            health = Health.unhealthy(f"shared device nodes missing: {', '.join(missing_shared)}")
        if details.vnpu_type is not None:
            devices += _vnpu_devices(replace(chip, vnpus=admins), details, shared, driver,
                                     health)
            continue
        if details.vnpu_partitions and not admins:
            devices += partition_devices(chip, details.vnpu_partitions, health=health,
                                         problems=problems)
            continue
        if chip.vnpus:
            split.append(f"{node} ({', '.join(v.template for v in chip.vnpus)})")
            continue
        location = (pci.locate_bus_id(chip.bus_id, sys_root=details.on_host("/sys"))
                    if chip.bus_id else None)
        device = to_device(chip, details, shared_present=shared, driver_present=driver,
                           health=health, pci=location)
        if source == SOURCE_DEVICES:
            device = replace(device, warning=f"{NO_HEALTH} (advertised healthy while "
                                             f"{chip_node(chip.phy_id)} exists)")
        devices.append(device)
    notes = (f"split into vNPUs, served by vnpuType Configurations: {', '.join(split)}",) \
        if split else ()
    return Scan(devices=tuple(devices), status=ScanStatus(source, tuple(problems), notes))


def _vnpu_devices(chip: Chip, details: AscendDetails, shared: list[str], driver: bool,
                  health: Health) -> list[Device]:
    """The chip's vNPUs of the details' type, each as healthy as its chip and its own node."""
    out = []
    for vnpu in chip.vnpus or ():
        kind = vnpu_type(chip.family, vnpu.template)
        if kind != details.vnpu_type:
            continue
        own = health
        if own.healthy and not os.path.exists(details.on_host(vnpu_node(vnpu.vdev_id))):
            own = Health.unhealthy(f"device node {vnpu_node(vnpu.vdev_id)} missing")
        out.append(vnpu_device(chip, vnpu, kind, details, shared_present=shared,
                               driver_present=driver, health=own))
    return out


def _read(source: str, details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    if source == SOURCE_DCMI:
        return _from_dcmi(details, problems)
    if source == SOURCE_NPU_SMI:
        return _from_npu_smi(details, problems)
    if source == SOURCE_DEVICES:
        return _from_device_nodes(details, problems)
    problems.append(f"{source}: unknown source")
    return ()


def _from_dcmi(details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    path = details.on_host(details.library_path) if details.library_path else None
    try:
        result = dcmi_lanes.library(path).scan(details.dcmi_timeout_seconds)
    except dcmi.DcmiError as exc:
        problems.append(f"dcmi: {exc}")
        return ()
    problems.extend(f"dcmi: {p}" for p in result.problems)
    table = details.faults
    return tuple(replace(chip, health=chip_health(chip.error_codes, table))
                 if chip.health.healthy else chip for chip in result.chips)


def _from_npu_smi(details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    found = next((path for path in details.npu_smi_paths
                  if os.access(details.on_host(path), os.X_OK)), None)
    if found is None:
        problems.append(f"npu-smi: {' or '.join(details.npu_smi_paths)} not found or not "
                        "executable")
        return ()
    tool = details.on_host(found)
    text = _run_tool(tool, ["info"], details, problems)
    if text is None:
        return ()
    try:
        table = parse_npu_smi_info(text)
    except NpuSmiError as exc:
        problems.append(f"npu-smi: {exc}")
        return ()
    problems.extend(f"npu-smi: {p}" for p in table.problems)
    mapping: dict[tuple[int, int], MapRow] | None = None
    map_text = _run_tool(tool, ["info", "-m"], details, problems)
    if map_text is not None:
        try:
            mapping = parse_npu_smi_map(map_text)
        except NpuSmiError as exc:
            problems.append(f"npu-smi: {exc}")
    remap: dict[tuple[int, int], int] = {}
    if mapping is not None and any(row.phy_id is None for row in mapping.values()):
        remap = _remap(tool, details)
    own: list[str] = []
    chips = assign_ids(table.chips, mapping, remap, own)
    problems.extend(f"npu-smi: {p}" for p in own)
    return tuple(replace(chip, vnpus=_vnpus(tool, chip, details, problems)) for chip in chips)


def _vnpus(tool: str, chip: Chip, details: AscendDetails,
           problems: list[str]) -> tuple[VNpu, ...] | None:
    """The chip's vNPUs from ``npu-smi info -t info-vnpu`` (kept ``VNPU_REREAD_S``)."""
    if chip.card_id is None or chip.device_index is None:
        return None
    key = (tool, chip.card_id, chip.device_index)
    now = time.monotonic()
    known = _vnpu_answers.get(key)
    if known is None or now - known[0] > VNPU_REREAD_S:
        # An npu-smi or a product that does not know the query (an error, a usage text) cannot
        # tell: the chip is served whole, and so is it by every other Configuration here.
        asked: list[str] = []
        text = _run_tool(tool, ["info", "-t", "info-vnpu", "-i", str(chip.card_id), "-c",
                                str(chip.device_index)], details, [], any_exit=True)
        found: tuple[VNpu, ...] | None = None
        if text is not None:
            try:
                found = parse_info_vnpu(text)
            except NpuSmiError as exc:
                if VNPU_TOTAL in text:  # the table, but not adding up
                    asked.append(f"npu-smi: {exc}")
        if len(_vnpu_answers) >= MAX_VNPU_ANSWERS_KEPT:
            _vnpu_answers.clear()
        known = _vnpu_answers[key] = (now, found, "; ".join(asked))
    if known[2]:
        problems.append(f"NPU {chip.card_id} chip {chip.device_index}: vNPUs unreadable: "
                        f"{known[2]}")
    return known[1]


def _run_tool(tool: str, args: list[str], details: AscendDetails,
              problems: list[str], *, any_exit: bool = False) -> str | None:
    """The output of ``npu-smi <args>``, or None with the reason in ``problems`` (``any_exit``:
    the output whatever the exit code)."""
    shown = " ".join(["npu-smi", *args])
    try:
        done = subprocess.run(  # a fixed argument list, no shell
            [tool, *args], capture_output=True, timeout=NPU_SMI_TIMEOUT_S, check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        problems.append(f"npu-smi: cannot run {shown}: {exc}")
        return None
    if done.returncode != 0 and not any_exit:
        problems.append(f"npu-smi: {shown} exited {done.returncode}")
        return None
    return done.stdout[:NPU_SMI_MAX_OUTPUT].decode("utf-8", "replace")


def _remap(tool: str, details: AscendDetails) -> dict[tuple[int, int], int]:
    """(NPU id, chip id) → physical id, asked of ``npu-smi info -t phyid-remap`` for every
    ``/dev/davinci<N>`` once: the mapping is fixed while the set of device nodes is."""
    phys = frozenset(_davinci_ids(details.on_host("/dev")))
    key = (tool, phys)
    known = _remaps.get(key)
    if known is not None:
        return known
    found: dict[tuple[int, int], int] = {}
    for phy in sorted(phys)[:MAX_REMAP_QUERIES]:
        text = _run_tool(tool, ["info", "-t", "phyid-remap", "-p", str(phy)], details, [])
        answer = parse_phyid_remap(text) if text is not None else None
        if answer is not None and answer[0] == phy:
            found[(answer[1], answer[2])] = phy
    if len(_remaps) >= MAX_REMAPS_KEPT:
        _remaps.clear()
    _remaps[key] = found
    return found


def _davinci_ids(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [int(m.group(1)) for m in map(_DAVINCI.match, names) if m]


def _from_device_nodes(details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    directory = details.on_host("/dev")
    try:
        names = os.listdir(directory)
    except OSError as exc:
        problems.append(f"devices: cannot list /dev: {exc.strerror}")
        return ()
    chips = tuple(Chip(phy_id=int(m.group(1))) for m in map(_DAVINCI.match, names) if m)
    if chips:
        problems.append(f"devices: {NO_HEALTH}; only the device nodes were read")
    return chips
