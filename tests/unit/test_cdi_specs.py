"""The agent's CDI spec files, checked by the CDI project's own Go module (tests/harness/cdi.py).

A spec the module refuses would make containerd or CRI-O fail every container naming it.
"""

from __future__ import annotations

import stat
from pathlib import Path

from agent.discovery.cdi_specs import CdiSpecs, spec_path
from agent.discovery.node_devices import NodeDevice
from discovery_handlers.contract import Device, DeviceSpec, Mount
from tests.harness import cdi


def _record(digest: str, *, node: str = "/dev/null") -> NodeDevice:
    return NodeDevice(
        instance=f"usb-{digest}", namespace="ns", configuration="usb",
        device=Device(
            id=digest, properties={"UDEV_DEVNODE": "/dev/ttyUSB0"},
            device_specs=(DeviceSpec("/dev/ttyUSB0", node, "rw"),),
            mounts=(Mount("/opt/driver", "/tmp", read_only=True),),
        ),
        cdi_name=f"edgeplug.io/usb={digest}",
    )


def test_written_spec_resolves_to_nodes_mounts_and_env(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    assert specs.write("ns", "usb", [_record("aaa111"), _record("bbb222")])
    path = spec_path(tmp_path, "ns", "usb")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    names, errors = cdi.validate([tmp_path])
    assert errors == {}
    assert names == ["edgeplug.io/usb=aaa111", "edgeplug.io/usb=bbb222"]
    edits = cdi.resolve([tmp_path], ["edgeplug.io/usb=aaa111"])
    [node] = edits.device_nodes
    assert (node.path, node.type, node.major, node.minor, node.permissions) == (
        "/dev/ttyUSB0", "c", 1, 3, "rw")
    assert edits.mounts == (("/tmp", "/opt/driver", ("bind", "ro")),)
    assert edits.env["UDEV_DEVNODE"] == "/dev/ttyUSB0"
    assert edits.env["UDEV_DEVNODE_AAA111"] == "/dev/ttyUSB0"


def test_last_device_gone_removes_the_spec_and_start_sweeps_only_ours(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write("ns", "usb", [_record("aaa111")])
    other_vendor = tmp_path / "nvidia.com-gpu.yaml"
    other_vendor.write_text("cdiVersion: 0.6.0\n")
    assert not specs.write("ns", "usb", [])
    assert not spec_path(tmp_path, "ns", "usb").exists()
    specs.write("ns", "usb", [_record("aaa111")])
    specs.remove_all()
    assert [p.name for p in tmp_path.iterdir()] == [other_vendor.name]


def test_unwritable_directory_means_no_cdi_names_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not CdiSpecs(blocker / "cdi").write("ns", "usb", [_record("aaa111")])
    assert not CdiSpecs(None).write("ns", "usb", [_record("aaa111")])
