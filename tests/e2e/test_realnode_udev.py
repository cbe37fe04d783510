"""On a real node: a udev broker opens and reads a real block device it was given.

The device is a loop device the test attaches (``losetup``) to a file whose first bytes are a
marker. The agent, beside the kubelet, finds it with real libudev (a udev rule on
``SUBSYSTEM=="block", KERNEL=="loopN"``), publishes its Instance and serves it; its CDI spec
names ``/dev/loopN`` as a device node; containerd creates that node in the broker's container
and allows it in the device cgroup, and the broker (busybox) reads the marker from it. The
broker's ``kubectl logs`` is the evidence: ``UDEV_DEVNODE``, ``ls -l`` showing a block device,
the marker.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crds.naming import instance_name
from tests.harness.controlplane import ControlPlane
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    allocates,
    broker_log,
    broker_spec,
    deployed,
    logged_env,
    node,
    plane,
    running_container,
)

__all__ = ["node", "plane"]  # the module fixtures

pytestmark = pytest.mark.timeout(1500)
BACKING_BYTES = 1 << 20


@contextlib.contextmanager
def loop_device(backing: Path, marker: bytes) -> Iterator[str]:
    """A loop device over ``backing`` (the marker, then zeros); detached afterwards."""
    if shutil.which("losetup") is None:
        raise RuntimeError("the udev real-node test needs losetup (util-linux)")
    backing.write_bytes(marker + bytes(BACKING_BYTES - len(marker)))
    device = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                            capture_output=True, text=True).stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


def _configuration(name: str, kernel: str) -> dict[str, Any]:
    details = {"udevRules": [f'SUBSYSTEM=="block", KERNEL=="{kernel}"'], "permissions": "r"}
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": "udev", "discoveryDetails": yaml.safe_dump(details)},
            "capacity": 1,
            # The broker reads the device it was handed, by the env the agent gave it.
            "brokerSpec": {"brokerPodSpec": broker_spec(
                'ls -l "$UDEV_DEVNODE"; echo edgeplug-read:$(head -c 32 "$UDEV_DEVNODE")')},
        },
    }


async def test_udev_broker_reads_the_loop_device_it_was_given(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    marker = f"edgeplug-loop-{uuid.uuid4().hex[:12]}".encode()
    with loop_device(tmp_path / "disk.img", marker) as device:
        kernel = Path(device).name
        inst = instance_name("loop", f"/devices/virtual/block/{kernel}", shared=False,
                             node=node.node_name)
        with deployed(plane, node, tmp_path, _configuration("loop", kernel), inst) as broker:
            await running_container(plane, broker)
            out = await broker_log(plane, broker)
            env = logged_env(out)
            assert env["UDEV_DEVNODE"] == device
            [listing] = [line for line in out.splitlines() if line.endswith(f" {device}")]
            assert listing.startswith("b"), f"a block device node in the container: {listing}"
            assert f"edgeplug-read:{marker.decode()}" in out, "the broker read the device"
            assert allocates(node, broker) == 1
