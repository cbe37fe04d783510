"""``edgeplug discover`` on an emulated Ascend node, as a user runs it: a subprocess, no cluster.

Stands in for a real node: tests/harness/ascend_node.py's tree, with the DCMI stand-in library
(built here, loaded by the subprocess through ctypes) and the fake ``npu-smi``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
LINE_DEADLINE_S = 30.0  # the first list comes in well under a second; a poll is 1 s


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path) -> AscendNode:
    return AscendNode(tmp_path / "host", chips_910b(8), library=dcmi_library)


def configuration(path: Path, details: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "ascend-910"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": details},
                 "resourceName": "huawei.com/Ascend910"}}))
    return path


async def discover(node: AscendNode, cfg: Path, *args: str
                   ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "discover", "-f", str(cfg), "--node", "gpu-7", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **node.env})


async def finished(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), LINE_DEADLINE_S)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_discover_lists_the_chips(node: AscendNode, tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", node.details())
    code, out, err = await finished(await discover(node, cfg, "-o", "json"))
    assert code == 0, err
    listing: dict[str, Any] = json.loads(out)
    assert listing["shared"] is False
    devices = listing["devices"]
    assert [d["id"] for d in devices] == [f"davinci{i}" for i in range(8)]
    assert all(d["healthy"] for d in devices)
    assert {d["properties"]["ASCEND_CHIP_MODEL"] for d in devices} == {"Ascend910B3"}
    assert devices[4]["properties"]["ASCEND_VISIBLE_DEVICES"] == "4"
    assert {"hostPath": "/usr/local/Ascend/driver", "containerPath": "/usr/local/Ascend/driver",
            "readOnly": True} in devices[0]["mounts"]


async def test_discover_shows_a_degraded_source_and_why(node: AscendNode, tmp_path: Path) -> None:
    node.fault(2)
    cfg = configuration(tmp_path / "c.yaml", node.details(libraryPath="/opt/none/libdcmi.so"))
    code, out, err = await finished(await discover(node, cfg))
    assert code == 0, err
    assert "- device davinci2 (UNHEALTHY: npu-smi health 'Critical')" in out
    assert "source npu-smi" in err
    assert "cannot load" in err
    assert "/opt/none/libdcmi.so" in err


async def test_discover_refuses_bad_details_naming_the_field(node: AscendNode,
                                                             tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", "healthPollSeconds: 0\n")
    code, _, err = await finished(await discover(node, cfg))
    assert code == 2
    assert "healthPollSeconds" in err


async def test_discover_watch_shows_a_fault_and_its_end(node: AscendNode, tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "c.yaml", node.details())
    process = await discover(node, cfg, "--watch", "-o", "json")
    assert process.stdout is not None

    async def health() -> dict[str, bool]:
        line = await asyncio.wait_for(process.stdout.readline(), LINE_DEADLINE_S)  # type: ignore[union-attr]
        return {d["id"]: d["healthy"] for d in json.loads(line)["devices"]}

    try:
        assert all((await health()).values())
        node.fault(6)
        faulted = await health()
        assert [name for name, ok in faulted.items() if not ok] == ["davinci6"]
        node.clear(6)
        assert all((await health()).values())
    finally:
        process.kill()
        await process.wait()
