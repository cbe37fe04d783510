"""One discovery pass over a node's NPUs: DCMI first, then ``npu-smi info``, then the device nodes.

Why this exists: a node's Ascend software can be partly missing or broken (no DCMI library in
the agent's image, a driver that answers errors, an ``npu-smi`` that prints something else).
Each pass tries the sources the details allow, in order, and keeps the first that lists chips;
``ScanStatus`` says which one it used and everything it could not read, so a user sees why the
node advertises what it does. The pass blocks (ctypes, a subprocess, ``stat``): the handler runs
it through ``contract.run_blocking``. Nothing here raises on bad input from the node.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from discovery_handlers.ascend import dcmi
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
)
from discovery_handlers.ascend.npu_smi import NpuSmiError, parse_npu_smi_info
from discovery_handlers.contract import Device, Health

NPU_SMI_TIMEOUT_S = 10.0  # npu-smi info answers in well under a second on a healthy node
NPU_SMI_MAX_OUTPUT = 1 << 20  # bytes of npu-smi output read at most
_DAVINCI = re.compile(r"^davinci(\d+)$")
NO_SOURCE = "none"


@dataclass(frozen=True)
class ScanStatus:
    """Which source a pass used (``none`` when none listed chips) and what it could not read."""

    source: str
    problems: tuple[str, ...]

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    def __str__(self) -> str:
        if not self.problems:
            return f"source {self.source}"
        return f"source {self.source}; " + "; ".join(self.problems)


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
    for chip in chips:
        health = chip.health
        node = chip_node(chip.phy_id)
        if not os.path.exists(details.on_host(node)):
            health = Health.unhealthy(f"device node {node} missing")
        elif missing_shared:
            health = Health.unhealthy(f"shared device nodes missing: {', '.join(missing_shared)}")
        devices.append(to_device(chip, details, shared_present=shared, driver_present=driver,
                                 health=health))
    return Scan(devices=tuple(devices), status=ScanStatus(source, tuple(problems)))


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
        result = dcmi.load(path).scan()
    except dcmi.DcmiError as exc:
        problems.append(f"dcmi: {exc}")
        return ()
    problems.extend(f"dcmi: {p}" for p in result.problems)
    return result.chips


def _from_npu_smi(details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    tool = details.on_host(details.npu_smi_path)
    if not os.access(tool, os.X_OK):
        problems.append(f"npu-smi: {details.npu_smi_path} not found or not executable")
        return ()
    try:
        done = subprocess.run(  # a fixed argument list, no shell
            [tool, "info"], capture_output=True, timeout=NPU_SMI_TIMEOUT_S, check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        problems.append(f"npu-smi: cannot run {details.npu_smi_path} info: {exc}")
        return ()
    if done.returncode != 0:
        problems.append(f"npu-smi: {details.npu_smi_path} info exited {done.returncode}")
        return ()
    text = done.stdout[:NPU_SMI_MAX_OUTPUT].decode("utf-8", "replace")
    try:
        table = parse_npu_smi_info(text)
    except NpuSmiError as exc:
        problems.append(f"npu-smi: {exc}")
        return ()
    problems.extend(f"npu-smi: {p}" for p in table.problems)
    return table.chips


def _from_device_nodes(details: AscendDetails, problems: list[str]) -> tuple[Chip, ...]:
    directory = details.on_host("/dev")
    try:
        names = os.listdir(directory)
    except OSError as exc:
        problems.append(f"devices: cannot list /dev: {exc.strerror}")
        return ()
    chips = tuple(Chip(phy_id=int(m.group(1))) for m in map(_DAVINCI.match, names) if m)
    if chips:
        problems.append("devices: only the device nodes were read (no model, memory or health)")
    return chips
