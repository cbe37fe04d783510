"""The node emulator behaves as a kubelet towards device plugins, the scheduler and the API.

Why this exists: every agent test trusts the emulator to stand in for the real kubelet, so the
emulator is itself tested against real parts: the real control plane (API server, scheduler,
controller-manager), a real gRPC device plugin over Unix sockets (tests/harness/testplugin.py),
and the real pod-resources API. Waits poll the API or the emulator with a deadline.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount

from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator
from tests.harness.testplugin import CDI_KIND, TestPlugin, env_name, expected_response

pytestmark = pytest.mark.timeout(180)

#: Generous deadlines for a shared 2-core machine; none of them is a pass/fail timing.
API_WAIT_S = 60.0
SCHEDULE_WAIT_S = 60.0
POLL_S = 0.1
HEALTHY = "Healthy"


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short paths: a Unix socket path must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="ep-kl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(str(control_plane.kubeconfig)))
    yield client
    await client.close()


@pytest.fixture
async def pod_namespace(namespace: str, kube: AsyncClient) -> str:
    """The test's namespace once the controller-manager gave it its default ServiceAccount."""

    async def has_account() -> bool:
        try:
            await kube.get(ServiceAccount, "default", namespace=namespace)
        except ApiError:
            return False
        return True

    await wait_until(has_account, what=f"ServiceAccount default in {namespace}")
    return namespace


def new_node_name() -> str:
    return f"emu-{uuid.uuid4().hex[:8]}"


def new_resource() -> str:
    return f"test.edgeplug.io/dev-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def emulator(control_plane: ControlPlane, plugin_dir: Path) -> AsyncIterator[NodeEmulator]:
    node = NodeEmulator(node_name=new_node_name(), kubeconfig=control_plane.kubeconfig,
                        plugin_dir=plugin_dir, pod_resources_socket=plugin_dir / "pr.sock",
                        labels={"edgeplug.test/role": "emulated"})
    await node.start()
    yield node
    await node.stop(delete_node=True)


@pytest.fixture
async def plugin(emulator: NodeEmulator) -> AsyncIterator[TestPlugin]:
    test_plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                             devices={"d0": HEALTHY, "d1": HEALTHY, "d2": HEALTHY},
                             preferred=["d2", "d0", "d1"])
    await test_plugin.start()
    yield test_plugin
    await test_plugin.stop()


# -- helpers -------------------------------------------------------------------------------


async def wait_until(check: Callable[[], Awaitable[bool]], *, what: str,
                     within: float = API_WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"waited {within:.0f}s for {what}")
        await asyncio.sleep(POLL_S)


async def allocatable(kube: AsyncClient, node: str, resource: str) -> str | None:
    obj = await kube.get(Node, node)
    assert obj.status is not None
    return (obj.status.allocatable or {}).get(resource)


async def wait_allocatable(kube: AsyncClient, node: str, resource: str, value: str) -> None:
    async def check() -> bool:
        return await allocatable(kube, node, resource) == value

    await wait_until(check, what=f"node {node} allocatable {resource}={value}")


def pod_manifest(name: str, *, resources: Mapping[str, str] | None = None,
                 node_selector: Mapping[str, str] | None = None,
                 init_resources: Mapping[str, str] | None = None) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/pause:1"}
    if resources:
        container["resources"] = {"limits": dict(resources)}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 30}
    if init_resources:
        spec["initContainers"] = [{"name": "init", "image": "registry.invalid/pause:1",
                                   "resources": {"limits": dict(init_resources)}}]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return cast(Pod, Pod.from_dict({"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": name}, "spec": spec}))


async def create_pod(kube: AsyncClient, namespace: str, pod: Pod) -> None:
    assert pod.metadata is not None
    pod.metadata.namespace = namespace
    await kube.create(pod)


async def wait_phase(kube: AsyncClient, namespace: str, name: str, phase: str,
                     *, within: float = SCHEDULE_WAIT_S) -> Pod:
    found: list[Pod] = []

    async def check() -> bool:
        pod = await kube.get(Pod, name, namespace=namespace)
        found[:] = [pod]
        return pod.status is not None and pod.status.phase == phase

    try:
        await wait_until(check, what=f"pod {namespace}/{name} {phase}", within=within)
    except AssertionError:
        status = found[0].status if found else None
        raise AssertionError(
            f"pod {namespace}/{name} never {phase}; last status: {status}") from None
    return found[0]


# -- registration and capacity -------------------------------------------------------------


async def test_plugin_registers_and_its_devices_become_allocatable(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    node = await kube.get(Node, emulator.node_name)
    assert node.status is not None
    assert node.status.capacity is not None
    assert node.status.capacity[plugin.resource_name] == "3"
    assert [r.resource_name for r in emulator.registrations] == [plugin.resource_name]
    assert emulator.registrations[0].endpoint == plugin.socket_name
    assert emulator.registrations[0].get_preferred_allocation_available
    assert plugin.calls.options == 1
    assert plugin.calls.list_and_watch == 1


# -- pods ----------------------------------------------------------------------------------


async def test_scheduled_pod_gets_the_plugins_allocation_and_runs(
    emulator: NodeEmulator, plugin: TestPlugin, kube: AsyncClient, pod_namespace: str,
) -> None:
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "3")
    await create_pod(kube, pod_namespace,
                     pod_manifest("user", resources={plugin.resource_name: "2"}))

    pod = await wait_phase(kube, pod_namespace, "user", "Running")

    assert pod.spec is not None
    assert pod.spec.nodeName == emulator.node_name  # bound by the real scheduler
    assert pod.status is not None
    assert pod.status.containerStatuses is not None
    assert [c.ready for c in pod.status.containerStatuses] == [True]
    assert {c.type: c.status for c in pod.status.conditions or []}["Ready"] == "True"
    [allocation] = emulator.allocations(pod_namespace, "user")
    # The plugin prefers d2 then d0: the emulator asked it and used its answer.
    assert plugin.calls.preferred == [(("d0", "d1", "d2"), 2)]
    assert allocation.device_ids == ("d2", "d0")
    assert plugin.calls.allocate == [("d2", "d0")]
    want = expected_response(["d2", "d0"])
    assert allocation.resource_name == plugin.resource_name
    assert allocation.container == "main"
    assert allocation.envs == dict(want.envs)
    assert allocation.envs[env_name("d2")] == "d2"
    assert allocation.mounts == (("/var/test/d2", "/srv/test/d2", True),
                                 ("/var/test/d0", "/srv/test/d0", True))
    assert allocation.devices == (("/dev/test-d2", "/dev/null", "rw"),
                                  ("/dev/test-d0", "/dev/null", "rw"))
    assert allocation.cdi_devices == (f"{CDI_KIND}=d2", f"{CDI_KIND}=d0")
    assert allocation.annotations == {"test.edgeplug.io/devices": "d2,d0"}
    assert emulator.allocated_device_ids(plugin.resource_name) == {"d0", "d2"}
