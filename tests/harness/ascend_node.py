"""An emulated Ascend node for tests: a host tree, Huawei's DCMI library ABI and ``npu-smi info``.

No Ascend NPU can be here, so the tests build what the ``ascend`` handler reads
on a real node, with the real formats: device nodes under ``<root>/dev`` (``davinci<N>`` and the
shared ``davinci_manager``, ``devmm_svm``, ``hisi_hdc``), the driver directory, a DCMI library
compiled by the test from ``tests/harness/ascend_dcmi/fake_dcmi.c`` (the real C signatures and
return codes, loaded through ctypes) and an ``npu-smi`` that prints Huawei's ``npu-smi info``
table. Both read the state this class writes, so a test faults a chip while the handler runs.
vNPUs an admin created (``SimVnpu``) are in both too: DCMI's vdevice query and ``npu-smi info
-t info-vnpu`` as npu-smi prints it, and their nodes ``/dev/vdavinci<id>``.
The DCMI stand-in finds its state through ``ASCEND_DCMI_STATE`` (see ``env``); the vNPUs it
creates (``dcmi_create_vdevice``) are listed by ``created_vnpus``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

DCMI_SOURCE = Path(__file__).parent / "ascend_dcmi" / "fake_dcmi.c"
STATE_ENV = "ASCEND_DCMI_STATE"
DEV_DIR_ENV = "ASCEND_DCMI_DEV_DIR"  # where the stand-in makes the nodes of vNPUs it creates
SHARED_NODES = ("davinci_manager", "devmm_svm", "hisi_hdc")
LIBRARY_IN_TREE = "/usr/local/dcmi/libdcmi.so"  # where Huawei's driver package installs it
NPU_SMI_IN_TREE = "/usr/local/bin/npu-smi"  # where the driver installs it on servers
DRIVER_IN_TREE = "/usr/local/Ascend/driver"
NPU_SMI_WORDS = {0: "OK", 1: "Warning", 2: "Alarm", 3: "Critical"}
FAULT_CODE = 0x80E01801  # an error code as DCMI reports them (hex, as Huawei's tools print)
#: One error code of each of Huawei's handling levels, from their default fault table.
LEVEL_CODES = {
    "NotHandleFault": 0x80E21007, "SubHealthFault": 0x81A3880C,
    "RestartRequest": 0x80C98008, "RestartBusiness": 0x80E01801,
    "FreeRestartNPU": 0x8C0E4E00, "RestartNPU": 0x8C03A000,
    "PreSeparateNPU": 0x8118043C, "SeparateNPU": 0x80E3A201,
}


@dataclass(frozen=True)
class SimChip:
    """One emulated chip (DCMI's view; ``npu-smi`` shows the same)."""

    card: int
    dev: int
    logic: int
    phy: int
    name: str = "910B3"
    version: str = "V1"
    aicore: int = 20
    hbm_mb: int = 65536
    mem_mb: int = 0
    health: int = 0
    errors: tuple[int, ...] = ()
    bus: int = 0x01
    roce_ip: str = ""  # the RoCE port's address dcmi_get_device_ip gives ("": none)
    #: dcmi_get_device_network_health's result (enum dcmi_rdfx_detect_result; None: the call
    #: answers DCMI_ERR_CODE_NOT_SUPPORT)
    network: int | None = None

    def state_line(self) -> str:
        errors = ",".join(f"{e:X}" for e in self.errors) or "-"
        return (f"chip {self.card} {self.dev} {self.logic} {self.phy} Ascend {self.name} "
                f"{self.version} {self.aicore} {self.hbm_mb} {self.mem_mb} {self.health} "
                f"{errors} 0 {self.bus} 0 0 {self.roce_ip or '-'} "
                f"{'-' if self.network is None else self.network}\n")


@dataclass(frozen=True)
class SimVnpu:
    """One vNPU on chip (``card``, ``dev``), as ``npu-smi set -t create-vnpu`` leaves it."""

    card: int
    dev: int
    vdev_id: int
    template: str  # "vir04"
    aicore: int
    memory_mb: int
    vgroup: int = 0
    status: int = 0
    in_container: bool = False

    def state_line(self) -> str:
        return (f"vdev {self.card} {self.dev} {self.vdev_id} {self.template} {self.aicore} "
                f"{self.memory_mb} {self.vgroup} {self.status} {int(self.in_container)}\n")


def chips_910b(count: int = 8, *, per_card: int = 1) -> list[SimChip]:
    """``count`` 910B3 chips, ``per_card`` on each card, physical id = logic id = position."""
    return [SimChip(card=i // per_card, dev=i % per_card, logic=i, phy=i, bus=0xC1 + i)
            for i in range(count)]


def build_dcmi_library(directory: Path) -> Path:
    """Compile the DCMI stand-in with the machine's C compiler into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "libdcmi.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(DCMI_SOURCE)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def dcmi_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DCMI stand-in, compiled once per test session."""
    return build_dcmi_library(tmp_path_factory.mktemp("dcmi"))


class AscendNode:
    """A host tree under ``root`` with ``chips``; ``library`` is copied into the tree."""

    def __init__(self, root: Path, chips: Sequence[SimChip], *, library: Path | None,
                 vnpus: Sequence[SimVnpu] = ()) -> None:
        self.root = root
        self.chips = list(chips)
        self.vnpus = list(vnpus)
        self.fails: dict[str, int] = {}
        self.hangs: set[tuple[str, int]] = set()
        self.npu_smi_override: str | None = None
        self.npu_smi_map_override: str | None = None
        self.state = root / "var" / "run" / "fake-dcmi.state"
        self.npu_smi_out = root / "var" / "run" / "npu-smi-info.out"
        self.npu_smi_map = root / "var" / "run" / "npu-smi-info-m.out"
        self.remap_dir = root / "var" / "run" / "phyid-remap"
        self.remap_dir.mkdir(parents=True, exist_ok=True)
        self.vnpu_dir = root / "var" / "run" / "info-vnpu"
        self.vnpu_dir.mkdir(parents=True, exist_ok=True)
        self.state.parent.mkdir(parents=True, exist_ok=True)
        (root / "dev").mkdir(parents=True, exist_ok=True)
        for chip in self.chips:
            (root / "dev" / f"davinci{chip.phy}").touch()
        for name in SHARED_NODES:
            (root / "dev" / name).touch()
        for vnpu in self.vnpus:
            (root / "dev" / f"vdavinci{vnpu.vdev_id}").touch()
        (root / DRIVER_IN_TREE.lstrip("/") / "lib64").mkdir(parents=True, exist_ok=True)
        if library is not None:
            target = root / LIBRARY_IN_TREE.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(library, target)
        tool = root / NPU_SMI_IN_TREE.lstrip("/")
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(  # answers what the handler asks, as npu-smi prints it
            '#!/bin/sh\n'
            f'[ "$*" = info ] && exec cat "{self.npu_smi_out}"\n'
            f'[ "$*" = "info -m" ] && exec cat "{self.npu_smi_map}"\n'
            '[ "$1 $2 $3 $4" = "info -t phyid-remap -p" ] && '
            f'[ -f "{self.remap_dir}/$5" ] && exec cat "{self.remap_dir}/$5"\n'
            '[ "$1 $2 $3 $4 $6" = "info -t info-vnpu -i -c" ] && '
            f'[ -f "{self.vnpu_dir}/$5-$7" ] && exec cat "{self.vnpu_dir}/$5-$7"\n'
            'echo "unsupported: $*" >&2; exit 2\n')
        tool.chmod(0o755)
        self.write()

    def pci_sysfs(self, numa: Mapping[int, int], *, root_bus: int = 0xC0) -> None:
        """Each chip's PCI device in ``<root>/sys`` as the kernel lays it out: the directory
        below its root complex ``pci0000:<root_bus>`` (behind a root port) with its
        ``numa_node`` (``numa``: physical id → node; -1 where not given), and the link
        ``sys/bus/pci/devices/<bus id>`` to it."""
        complex_ = f"pci0000:{root_bus:02x}"
        port = f"0000:{root_bus:02x}:00.0"
        links = self.root / "sys" / "bus" / "pci" / "devices"
        links.mkdir(parents=True, exist_ok=True)
        for chip in self.chips:
            bus_id = f"0000:{chip.bus:02x}:00.0"
            device = self.root / "sys" / "devices" / complex_ / port / bus_id
            device.mkdir(parents=True, exist_ok=True)
            (device / "numa_node").write_text(f"{numa.get(chip.phy, -1)}\n")
            link = links / bus_id
            if not link.is_symlink():
                link.symlink_to(f"../../../devices/{complex_}/{port}/{bus_id}")

    @property
    def env(self) -> dict[str, str]:
        return {STATE_ENV: str(self.state), DEV_DIR_ENV: str(self.root / "dev")}

    def created_vnpus(self) -> list[tuple[int, int, int, str]]:
        """The vNPUs DCMI's ``dcmi_create_vdevice`` made and not destroyed: (card, dev, vNPU
        id, template), from the stand-in's ``<state>.created``."""
        path = self.state.with_name(self.state.name + ".created")
        lines = path.read_text().split("\n") if path.exists() else []
        return [(int(f[1]), int(f[2]), int(f[3]), f[4])
                for f in (line.split() for line in lines) if f and f[0] == "vdev"]

    def details(self, **fields: object) -> str:
        """``discoveryDetails`` YAML for this tree (DCMI from the tree, fast polling)."""
        lines = {"hostRoot": str(self.root), "libraryPath": LIBRARY_IN_TREE,
                 "healthPollSeconds": 1, **fields}
        return "".join(f"{k}: {_yaml(v)}\n" for k, v in lines.items())

    def fault(self, phy: int, *, level: int = 3, errors: tuple[int, ...] = (FAULT_CODE,)) -> None:
        self._set(phy, health=level, errors=errors)

    def clear(self, phy: int) -> None:
        self._set(phy, health=0, errors=())

    def link(self, phy: int, result: int | None) -> None:
        """Set chip ``phy``'s RoCE link check result (``enum dcmi_rdfx_detect_result``: 0 up,
        3 unreachable, ...; None: not supported)."""
        self._set(phy, network=result)

    def fail(self, function: str, code: int) -> None:
        """Make DCMI's ``function`` return ``code`` from now on."""
        self.fails[function] = code
        self.write()

    def library_copy(self, name: str) -> str:
        """The DCMI stand-in copied to ``/opt/<name>`` in the tree (a file of its own, so the
        loader gives it its own handle and state); its path in the tree."""
        target = self.root / "opt" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / LIBRARY_IN_TREE.lstrip("/"), target)
        return f"/opt/{name}"

    def hang(self, function: str, card: int) -> None:
        """Make DCMI's ``function`` block for ``card`` (-1: calls without a card) until
        ``unhang``, as DCMI can after a card drops off the bus."""
        self.hangs.add((function, card))
        self.write()

    def unhang(self) -> None:
        self.hangs.clear()
        self.write()

    def remove_shared_nodes(self) -> None:
        for name in SHARED_NODES:
            (self.root / "dev" / name).unlink()

    def _set(self, phy: int, **changes: object) -> None:
        self.chips = [replace(c, **changes) if c.phy == phy else c  # type: ignore[arg-type]
                      for c in self.chips]
        self.write()

    def write(self) -> None:
        """Write the state both tools read (atomically: the handler may be reading)."""
        state = "".join(c.state_line() for c in self.chips)
        state += "".join(v.state_line() for v in self.vnpus)
        state += "".join(f"fail {f} {code}\n" for f, code in self.fails.items())
        state += "".join(f"hang {f} {card}\n" for f, card in sorted(self.hangs))
        _atomic(self.state, state)
        _atomic(self.npu_smi_out, self.npu_smi_override if self.npu_smi_override is not None
                else render_npu_smi_info(self.chips))
        _atomic(self.npu_smi_map, self.npu_smi_map_override
                if self.npu_smi_map_override is not None else render_npu_smi_map(self.chips))
        for chip in self.chips:
            _atomic(self.remap_dir / str(chip.phy), render_phyid_remap(chip))
            _atomic(self.vnpu_dir / f"{chip.card}-{chip.dev}", render_info_vnpu(
                chip, [v for v in self.vnpus if (v.card, v.dev) == (chip.card, chip.dev)]))


def render_npu_smi_info(chips: Sequence[SimChip], *, version: str = "24.1.rc2") -> str:
    """``npu-smi info`` as npu-smi 24.1 prints it on a 910B node (two rows per chip)."""
    rule = "+---------------------------+---------------+" + "-" * 52 + "+"
    double = "+===========================+===============+" + "=" * 52 + "+"
    head = "|" + f" npu-smi {version:<25}Version: {version}".ljust(96) + "|"
    out = ["+" + "-" * 96 + "+", head, rule,
           "| NPU   Name                | Health        | Power(W)    Temp(C)           "
           "Hugepages-Usage(page)|",
           "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  "
           "HBM-Usage(MB)        |", double]
    for chip in chips:
        word = NPU_SMI_WORDS.get(chip.health, "Critical")
        first = f"| {chip.card:<5} {chip.name:<19} | {word:<13} | {92.5:<11} {36:<17} "
        out.append(first + f"{'0    / 0':<21}|")
        hbm = f"{3400:<5}/ {chip.hbm_mb}"
        second = f"| {chip.dev:<25} | 0000:{chip.bus:02X}:00.0  | {0:<11} {'0    / 0':<17} "
        out.append(second + f"{hbm:<21}|")
        out.append(double)
    out += [rule, "| NPU     Chip              | Process id    | Process name             | "
                  "Process memory(MB)      |", double]
    for chip in chips:
        out.append(f"| No running processes found in NPU {chip.card:<61}|")
        out.append(double)
    return "\n".join(out) + "\n"


def render_npu_smi_map(chips: Sequence[SimChip]) -> str:
    """``npu-smi info -m`` as npu-smi 24.1 prints it on a 910B node: a row per chip, then a row
    for the card's MCU (logic id ``-``), tab-indented, in columns 31 characters wide."""
    def row(*cells: object) -> str:
        return "\t" + "".join(f"{c!s:<31}" for c in cells) + "\n"

    out = [row("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")]
    cards = sorted({c.card for c in chips})
    for card in cards:
        mine = sorted((c for c in chips if c.card == card), key=lambda c: c.dev)
        out += [row(c.card, c.dev, c.logic, f"Ascend {c.name}") for c in mine]
        out.append(row(card, len(mine), "-", "Mcu"))
    return "".join(out)


def render_info_vnpu(chip: SimChip, vnpus: Sequence[SimVnpu]) -> str:
    """``npu-smi info -t info-vnpu -i <card> -c <dev>`` as npu-smi prints it on a 910B: the
    chip's free/total resources (AI cores, memory in GB), the count, a row per vNPU."""
    rule = "+" + "-" * 79 + "+"

    def line(text: str) -> str:
        return f"| {text:<78}|"

    free_cores = chip.aicore - sum(v.aicore for v in vnpus)
    total_gb = chip.hbm_mb // 1024
    free_gb = max(total_gb - sum(v.memory_mb for v in vnpus) // 1024, 0)
    out = [rule, line("NPU resource static info as follow:"),
           line("Format:Free/Total                   NA: Currently, query is not supported."),
           line("AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD"),
           line("           GB"), "|" + "=" * 79 + "|",
           line(f"{f'{free_cores}/{chip.aicore}':<9} {f'{free_gb}/{total_gb}':<9} 6/6      "
                "9/9    0/0     2/2     24/24    4/4      NA/NA"),
           rule, line(f"Total number of vnpu: {len(vnpus)}"), rule,
           "|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |",
           rule]
    for vnpu in vnpus:
        container = "ffffffffffff" if vnpu.in_container else "000000000000"
        out += [f"|  {vnpu.vdev_id:<9}|  {vnpu.vgroup:<14}|  {container:<14}|  "
                f"{vnpu.status:<8}|  {vnpu.template:<20}|", rule]
    return "\n".join(out) + "\n"


def render_phyid_remap(chip: SimChip) -> str:
    """``npu-smi info -t phyid-remap -p <phy>`` for ``chip``."""
    return "".join(f"\t{key:<30}:{value}\n" for key, value in (
        ("Chip Phy-ID", chip.phy), ("NPU ID", chip.card), ("Slot ID", chip.card),
        ("Chip ID", chip.dev)))


def _yaml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
