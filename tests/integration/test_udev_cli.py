"""``edgeplug discover`` with udev Configurations, as a user runs it: a subprocess, no cluster.
On this machine's real /sys it shows what the handler finds in-process; a bad rule exits 2
naming the rule, position and token; under the umockdev bed ``--watch`` shows a radio plugged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from crds.naming import instance_name
from tests.harness.controller_process import configuration_file
from tests.harness.udev_testbed import UmockdevBed
from tests.integration.test_udev_discovery import PORT_1, RADIO, first_list

CLI_DEADLINE_S = 60.0


def configuration(path: Path, details: str) -> Path:
    return configuration_file(path, "mem", "udev", details)


def discover(cfg: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "discover", "-f", str(cfg), "--node", "n1", *args],
        capture_output=True, text=True, timeout=CLI_DEADLINE_S, env=env, check=False)


async def test_discover_shows_what_the_handler_finds(tmp_path: Path) -> None:
    details = "udevRules: ['SUBSYSTEM==\"mem\"', 'KERNEL==\"null\"']\npermissions: rw\n"
    done = discover(configuration(tmp_path / "mem.yaml", details), "-o", "json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout.splitlines()[0])
    assert (listing["handler"], listing["shared"]) == ("udev", False)
    expected = await first_list(details)
    assert len(expected) >= 2
    assert [d["id"] for d in listing["devices"]] == [d.id for d in expected]
    for shown, device in zip(listing["devices"], expected, strict=True):
        assert shown["instance"] == instance_name("mem", device.id, shared=False, node="n1")
        assert shown["properties"] == dict(device.properties)
        assert shown["deviceSpecs"] == [
            {"hostPath": s.host_path, "containerPath": s.container_path, "permissions": "rw"}
            for s in device.device_specs]
        assert shown["healthy"] is True
    null = {d["id"]: d["properties"]["UDEV_DEVNODE"] for d in listing["devices"]}
    assert null["/devices/virtual/mem/null"] == "/dev/null"


def test_discover_refuses_a_bad_rule_naming_it(tmp_path: Path) -> None:
    details = "udevRules: ['KERNEL==\"null\"', 'KERNEL==\"x\", SYMLINK+=\"radio\"']\n"
    done = discover(configuration(tmp_path / "bad.yaml", details))
    assert done.returncode == 2
    assert "udevRules[1]" in done.stderr
    assert "at position 14 ('SYMLINK+=\"radio\"')" in done.stderr


def test_discover_watch_shows_a_radio_plugged(tmp_path: Path) -> None:
    cfg = configuration(tmp_path / "radio.yaml", RADIO)
    with UmockdevBed() as bed:
        env = dict(os.environ)
        env.update(bed.env())
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "discover", "-f", str(cfg), "--node", "n1",
             "--watch", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env)
        deadline = threading.Timer(CLI_DEADLINE_S, process.kill)  # a hung CLI fails the test
        deadline.start()
        try:
            assert process.stdout is not None
            first: dict[str, Any] = json.loads(process.stdout.readline())
            assert first["devices"] == []
            bed.plug("1-1", "ttyUSB0", "A50285BI")
            second: dict[str, Any] = json.loads(process.stdout.readline())
            [radio] = second["devices"]
            assert radio["id"] == PORT_1
            assert radio["properties"]["UDEV_DEVNODE"] == "/dev/ttyUSB0"
            assert radio["deviceSpecs"] == [{"hostPath": "/dev/ttyUSB0",
                                             "containerPath": "/dev/ttyUSB0",
                                             "permissions": "rwm"}]
        finally:
            deadline.cancel()
            process.terminate()
            process.wait(timeout=CLI_DEADLINE_S)
