"""On a real node: one Ascend broker per NPU chip, each with its chip's device nodes and env.

Stands in for real parts: the NPUs. The node's DCMI library is tests/harness/ascend_dcmi's
stand-in (Huawei's C signatures) and its host tree holds ``npu-smi`` and the driver directory
(tests/harness/ascend_node.py); the device nodes ``/dev/davinci<N>``, ``/dev/davinci_manager``,
``/dev/devmm_svm`` and ``/dev/hisi_hdc`` are character devices the test makes with ``mknod`` in
the node's own ``/dev`` (an overlay of the host's, which stays unchanged). Everything else is
real: the agent beside the kubelet loads the library through ctypes, serves one plugin per
chip and writes their CDI specs; the kubelet admits each broker; containerd creates the nodes
in the container and mounts the driver directory read-only. Each broker's ``kubectl logs``
shows ``ASCEND_VISIBLE_DEVICES``, its chip's node (and not the other chip's), the shared nodes
and the driver's version file.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from crds.naming import instance_name
from tests.harness.ascend_node import (
    DRIVER_IN_TREE,
    SHARED_NODES,
    AscendNode,
    SimChip,
    dcmi_library,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    broker_log,
    broker_spec,
    deployed,
    logged_env,
    plane,
    running_container,
)

__all__ = ["dcmi_library", "plane"]  # the fixtures

pytestmark = pytest.mark.timeout(1500)
CHIPS = 2
ZERO, NULL = (1, 5), (1, 3)  # the chips read as /dev/zero, the shared nodes as /dev/null
DRIVER_MARK = "edgeplug-test-driver 24.1.rc2"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, dcmi_library: Path) -> AscendNode:
    chips = [SimChip(card=0, dev=i, logic=i, phy=i) for i in range(CHIPS)]
    tree = AscendNode(tmp_path_factory.mktemp("ascend") / "host", chips, library=dcmi_library)
    (tree.root / DRIVER_IN_TREE.lstrip("/") / "version.info").write_text(DRIVER_MARK + "\n")
    return tree


@pytest.fixture(scope="module")
def npu_node(plane: ControlPlane, host: AscendNode) -> Iterator[RealNode]:
    nodes = {f"davinci{i}": ZERO for i in range(CHIPS)} | dict.fromkeys(SHARED_NODES, NULL)
    real = RealNode(plane, node_name=f"npu-{uuid.uuid4().hex[:6]}", dev_nodes=nodes,
                    host_dirs={DRIVER_IN_TREE: host.root / DRIVER_IN_TREE.lstrip("/")})
    real.start()
    try:
        yield real
    finally:
        real.cleanup()


async def test_a_broker_per_chip_gets_its_device_nodes_and_the_driver(
    plane: ControlPlane, npu_node: RealNode, host: AscendNode, tmp_path: Path,
) -> None:
    proof = (f"ls -l /dev/davinci* /dev/{' /dev/'.join(SHARED_NODES)}; "
             f"echo edgeplug-read:$(head -c 4 /dev/davinci$ASCEND_VISIBLE_DEVICES | od -An -tx1);"
             f" cat {DRIVER_IN_TREE}/version.info")
    cfg = {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "npu"},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": host.details()},
                 "capacity": 1, "brokerSpec": {"brokerPodSpec": broker_spec(proof)}},
    }
    first = instance_name("npu", "davinci0", shared=False, node=npu_node.node_name)
    started = time.monotonic()
    with deployed(plane, npu_node, tmp_path, cfg, first, agent_env=host.env) as broker:
        await running_container(plane, broker)
        print(f"figure: Ascend Configuration applied -> first broker Running "
              f"{time.monotonic() - started:.1f} s")
        for phy in range(CHIPS):
            inst = instance_name("npu", f"davinci{phy}", shared=False, node=npu_node.node_name)
            chip = type(broker)(broker.namespace, inst, f"{inst}-{npu_node.node_name}-pod",
                                broker.agent_log)
            await running_container(plane, chip)
            out = await broker_log(plane, chip)
            env = logged_env(out)
            assert env["ASCEND_VISIBLE_DEVICES"] == str(phy)
            listed = {line.split()[-1]: line for line in out.splitlines()
                      if line.startswith("c") and "/dev/" in line}
            assert set(listed) == {f"/dev/davinci{phy}", *(f"/dev/{n}" for n in SHARED_NODES)}, \
                "its own chip's node and the shared ones, not the other chip's"
            assert all(" 1,   " in line for line in listed.values()), listed
            assert "edgeplug-read: 00 00 00 00" in out, "the chip's node opened and read"
            assert DRIVER_MARK in out, "the driver directory mounted"
