"""The seam: an agent in the DRA default never loads the device-plugin allocator (its slot
service, its servers, the cross-node protocol), and loads it once a Configuration pins its
devices to device plugins.

Real parts: the agent as its own process (``python -m tests.harness.modules_at_exit``, which
runs ``agent.main`` unchanged and writes the names of every module it loaded at its exit), with
``DRA=on`` and its device plugins registered with the kubelet's own device manager
(``DeviceNode``), the controller process with ``--dra`` choosing the allocator on the real API
server. The import-linter contract "the default path never imports the compatibility mode"
checks the imports themselves; this checks the one lazy import is not run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient

from agent.dra import slices
from agent.kube.client import as_dict
from crds.naming import instance_name, instance_resource_name
from crds.resources import ConfigurationResource
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controller_process import FAST_ARGS
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import wait_allocatable
from tests.harness.stand_ins import node_dirs, running_node

pytestmark = [pytest.mark.timeout(150)]

COMPAT = "agent.deviceplugins.crossnode"
#: The device-plugin allocator's modules (the kubelet's gRPC stubs for it included).
DEVICE_PLUGIN_ALLOCATOR = ("agent.deviceplugins", "agent.kubeletapi.deviceplugin")


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    return (*FAST_ARGS, "--dra")


async def _allocator(kube: AsyncClient, ns: str, name: str) -> str | None:
    body = as_dict(await kube.get(ConfigurationResource, name, namespace=ns))
    return (body.get("status") or {}).get("allocator") or None


async def _in_slice(kube: AsyncClient, ns: str, configuration: str, instance: str,
                    node: str | None = None) -> dict[str, Any] | None:
    """The Instance's device in its shared pool, or in ``node``'s pool of its Configuration."""
    pool = (slices.shared_pool(ns, configuration, instance) if node is None
            else slices.local_pool(ns, configuration, node))
    return h.pool_devices(await h.pool_slices(kube, pool)).get(slices.device_name(instance))


def _loaded(path: Path) -> set[str]:
    return set(path.read_text().split())


@pytest.mark.usefixtures("controller")
async def test_a_dra_default_agent_never_loads_the_cross_node_protocol(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path,
) -> None:
    ns = pod_namespace
    with node_dirs() as dirs:
        async with running_node(DeviceNode, control_plane.kubeconfig, dirs) as node:
            local = instance_name("loc", "dev0", shared=False, node=node.node_name)
            shared = instance_name("cam", "cam0", shared=True, node=node.node_name)
            harness.apply(control_plane, ns,
                          harness.debug_echo_configuration("loc", descriptions=["dev0"],
                                                           shared=False, capacity=2),
                          harness.debug_echo_configuration("cam", descriptions=["cam0"],
                                                           capacity=2))
            await harness.eventually(lambda: _allocator(kube, ns, "cam"),
                                     what="the controller's choice for cam")
            assert await _allocator(kube, ns, "cam") == "dra"

            async def run_agent(run: str, *waits: Callable[[], Awaitable[Any]]) -> set[str]:
                modules, log = tmp_path / f"modules-{run}", tmp_path / f"agent-{run}.log"
                agent = harness.AgentSubprocess(
                    control_plane, node_name=node.node_name, namespace=ns,
                    serve_device_plugins=True, plugin_dir=dirs.plugin_dir, log_path=log,
                    extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",  # slices, no kubelet plugin
                               "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket)},
                    python_args=("-m", "tests.harness.modules_at_exit", str(modules)))
                agent.start()
                try:
                    for wait in waits:
                        await wait()
                finally:
                    agent.stop()
                assert modules.exists(), log.read_text()[-3000:]
                return _loaded(modules)

            # The DRA default: the local device in its node's pool, the shared one in its own.
            loaded = await run_agent(
                "dra",
                lambda: harness.eventually(
                    lambda: _in_slice(kube, ns, "loc", local, node.node_name),
                    what=f"{local} in its node's ResourceSlice"),
                lambda: harness.eventually(lambda: _in_slice(kube, ns, "cam", shared),
                                           what=f"{shared} in its ResourceSlice"))
            assert not {m for m in loaded if m.startswith(DEVICE_PLUGIN_ALLOCATOR)}, sorted(loaded)

            # A Configuration pinned to device plugins: its shared device is served the
            # compatible way, and only then is the protocol loaded.
            pinned = harness.debug_echo_configuration("old", descriptions=["old0"], capacity=1)
            pinned["spec"]["allocator"] = "devicePlugin"
            harness.apply(control_plane, ns, pinned)
            old = instance_name("old", "old0", shared=True, node=node.node_name)
            loaded = await run_agent(
                "devicePlugin",
                lambda: wait_allocatable(kube, node.node_name, instance_resource_name(old), "1"))
            assert f"{COMPAT}.coordinator" in loaded
            assert "agent.deviceplugins.slots.service" in loaded
