"""The handler contract's hooks, end to end: health, composed env, ranking, blocking, secrets, CDI.

Real control plane and scheduler, the node emulator as the kubelet (real device-plugin gRPC over
Unix sockets), the whole agent in-process with a CDI spec directory of the test's own, and
``debugEchoExtended`` (tests/harness/echo_handlers.py) standing in for any handler that uses the
hooks. CDI specs are checked with the CDI project's own Go module, as containerd resolves them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc import aio
from lightkube import AsyncClient

from agent.deviceplugins.slots.service import socket_name
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import configuration_resource_name, instance_name, instance_resource_name
from discovery_handlers.contract import Secret
from tests.harness import cdi, echo_handlers
from tests.harness.agent_process import api_client, apply, eventually, instances
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import (
    allocatable,
    running,
    unschedulable,
    wait_allocatable,
    wait_pod,
    wait_service_account,
)
from tests.harness.node_emulator import NodeEmulator

GRPC_TIMEOUT_S = 10.0
WAIT_S = 20.0


@dataclass
class Platform:
    cp: ControlPlane
    namespace: str
    node: str
    emulator: NodeEmulator
    kube: AsyncClient
    handler: echo_handlers.ExtendedEcho
    cdi_dir: Path
    state: Path

    def configure(self, name: str, *, capacity: int = 1, **details: Any) -> None:
        details.setdefault("stateFile", str(self.state))
        properties = details.pop("_properties", [])
        apply(self.cp, self.namespace, {
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
            "metadata": {"name": name},
            "spec": {
                "discoveryHandler": {
                    "name": echo_handlers.NAME,
                    "discoveryDetails": yaml.safe_dump(details),
                    "discoveryProperties": properties,
                },
                "capacity": capacity,
                "brokerSpec": {"brokerPodSpec": {"containers": [{"name": "c", "image": "x"}]}},
            },
        })

    def set_state(self, state: dict[str, dict[str, Any]]) -> None:
        echo_handlers.write_state(self.state, state)

    def instance(self, configuration: str, device: str) -> str:
        return instance_name(configuration, device, shared=False, node=self.node)

    def pod(self, name: str, resource: str, count: int = 1) -> None:
        apply(self.cp, self.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{
                "name": "c", "image": "busybox:1.36",
                "resources": {"limits": {resource: str(count)}},
            }]},
        })

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.cp.kubectl(*args, "-n", self.namespace, "-o", "json").stdout)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))  # Unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def platform(
    control_plane: ControlPlane, namespace: str, short_dir: Path
) -> AsyncIterator[Platform]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    plugin_dir, cdi_dir = short_dir / "p", short_dir / "cdi"
    plugin_dir.mkdir()
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir)
    kube = api_client(control_plane)
    handler = echo_handlers.install()
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=namespace, cdi_spec_dir=cdi_dir)
    await wait_service_account(kube, namespace)
    await emulator.start()
    agent = asyncio.create_task(run_agent(settings))
    try:
        yield Platform(cp=control_plane, namespace=namespace, node=node, emulator=emulator,
                       kube=kube, handler=handler, cdi_dir=cdi_dir, state=short_dir / "s.json")
    finally:
        handler.release()
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        await emulator.stop(delete_node=True)
        await kube.close()


async def test_unhealthy_device_keeps_its_instance_and_admits_no_pod_until_it_recovers(
    platform: Platform,
) -> None:
    p = platform
    p.set_state({})
    p.configure("npu", descriptions=["chip0"])
    name = p.instance("npu", "chip0")
    resource = instance_resource_name(name)
    await wait_allocatable(p.kube, p.node, resource, "1")

    p.set_state({"chip0": {"healthy": False, "reason": "error code 0x80E18401"}})
    await p.emulator.wait_for(lambda: p.emulator.healthy_device_ids(resource) == [],
                              timeout=WAIT_S, what=f"{resource} advertised Unhealthy")
    await wait_allocatable(p.kube, p.node, resource, "0")

    async def status_says_why() -> bool:
        got = (await instances(p.kube, p.namespace)).get(name) or {}
        reason = (got.get("status") or {}).get("unhealthy", {}).get(p.node, "")
        return "0x80E18401" in reason

    await eventually(status_says_why, what="status.unhealthy names the fault")
    assert name in await instances(p.kube, p.namespace)  # health never goes through deletion
    events = p.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={name}")
    assert [e["reason"] for e in events["items"]] == ["DeviceUnhealthy"]
    assert "0x80E18401" in events["items"][0]["message"]

    p.pod("waits", resource)
    await wait_pod(p.kube, p.namespace, "waits", unschedulable, "marked Unschedulable")
    assert not p.emulator.allocations(p.namespace, "waits")

    p.set_state({})
    await wait_pod(p.kube, p.namespace, "waits", running, "Running once the chip recovered")
    [allocation] = p.emulator.allocations(p.namespace, "waits")
    assert allocation.envs["DEBUG_ECHO_DESCRIPTION"] == "chip0"

    async def status_cleared() -> bool:
        got = (await instances(p.kube, p.namespace)).get(name) or {}
        return not (got.get("status") or {}).get("unhealthy")

    await eventually(status_cleared, what="status.unhealthy cleared")
    events = p.kubectl_json("get", "events", "--field-selector", f"involvedObject.name={name}")
    assert sorted(e["reason"] for e in events["items"]) == ["DeviceHealthy", "DeviceUnhealthy"]


async def test_two_devices_in_one_container_get_a_composed_env_ranked_devices_and_cdi(
    platform: Platform,
) -> None:
    p = platform
    p.set_state({})
    groups = {"a": "card0", "b": "card1", "c": "card1", "d": "card2", "e": "card3"}
    p.configure("npus", descriptions=list(groups), groups=groups, compose=True,
                deviceNode="/dev/null")
    resource = configuration_resource_name("npus", None)
    await wait_allocatable(p.kube, p.node, resource, "5")

    p.pod("pair", resource, count=2)
    await wait_pod(p.kube, p.namespace, "pair", running, "Running")
    [allocation] = p.emulator.allocations(p.namespace, "pair")
    # The handler ranked card1's two chips together and composed one variable for both.
    assert sorted(allocation.envs["ECHO_ALL"].split(",")) == ["b", "c"]
    assert "DEBUG_ECHO_DESCRIPTION" not in allocation.envs
    assert sorted(d[0] for d in allocation.devices) == [
        "/dev/echo/b", "/dev/echo/c"]

    # Every CDI name Allocate returned resolves, through the CDI project's own parser, to the
    # devices' nodes, as a CDI-enabled containerd would.
    names = sorted(allocation.cdi_devices)
    assert names == sorted(f"edgeplug.io/npus={p.instance('npus', d).rpartition('-')[2]}"
                           for d in ("b", "c"))
    edits = cdi.resolve([p.cdi_dir], names)
    assert sorted(n.path for n in edits.device_nodes) == ["/dev/echo/b", "/dev/echo/c"]
    assert all((n.type, n.major, n.minor) == ("c", 1, 3) for n in edits.device_nodes)
    assert "ECHO_ALL" not in edits.env  # composed env stays Allocate's, never a per-device CDI one
    defined, errors = cdi.validate([p.cdi_dir])
    assert errors == {}
    assert len(defined) == 5

    # A device that goes leaves the spec.
    p.set_state({"e": {"present": False}})

    async def spec_shrank() -> bool:
        return len(cdi.validate([p.cdi_dir])[0]) == 4

    await eventually(spec_shrank, what="device e gone from the CDI spec")


async def test_handler_blocked_in_discovery_delays_neither_allocate_nor_registration(
    platform: Platform,
) -> None:
    p = platform
    p.set_state({})
    p.configure("slow", descriptions=["d0"], block=True)
    resource = instance_resource_name(p.instance("slow", "d0"))
    await wait_allocatable(p.kube, p.node, resource, "1")

    p.set_state({"d0": {"properties": {"X": "1"}}})  # the next pass blocks in a thread
    await p.emulator.wait_for(p.handler.blocked.is_set, timeout=WAIT_S,
                              what="the handler inside its blocking call")

    # While the handler is still blocked: a kubelet restart is answered with a registration,
    # and Allocate is answered.
    before = len(p.emulator.registrations)
    await p.emulator.restart_kubelet()
    await p.emulator.wait_for(
        lambda: len([r for r in p.emulator.registrations[before:]
                     if r.resource_name == resource]) == 1,
        timeout=WAIT_S, what="re-registration while the handler blocks",
    )
    sock = p.emulator.plugin_dir / socket_name(resource)
    async with aio.insecure_channel(f"unix://{sock}") as channel:
        reply = await pb_grpc.DevicePluginStub(channel).Allocate(
            pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[f"{p.instance('slow', 'd0')}-0"])]),
            timeout=GRPC_TIMEOUT_S,
        )
    assert reply.container_responses[0].envs["DEBUG_ECHO_DESCRIPTION"] == "d0"
    assert p.handler.blocked.is_set(), "the blocking call ended before the checks"
    p.handler.release()


async def test_secret_values_reach_the_handler_but_no_instance_event_or_log(
    platform: Platform, caplog: pytest.LogCaptureFixture,
) -> None:
    p = platform
    secret_value = f"pw-{uuid.uuid4().hex}"
    apply(p.cp, p.namespace, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cam-creds"},
        "data": {"password": base64.b64encode(secret_value.encode()).decode()},
    })
    p.set_state({})
    caplog.set_level(logging.DEBUG)
    p.configure("cams", descriptions=["cam0"], leakProperty="PASSWORD", _properties=[
        {"name": "PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": "cam-creds", "key": "password"}}},
    ])
    name = p.instance("cams", "cam0")
    await wait_allocatable(p.kube, p.node, instance_resource_name(name), "1")

    seen = [props["PASSWORD"] for props in p.handler.seen_properties if "PASSWORD" in props]
    assert seen
    assert all(v == Secret(secret_value.encode()) for v in seen)
    assert secret_value not in repr(seen)
    instance = (await instances(p.kube, p.namespace))[name]
    assert "LEAKED" not in instance["spec"]["brokerProperties"]
    for kind in ("instances", "configurations", "events"):
        assert secret_value not in p.cp.kubectl("get", kind, "-n", p.namespace, "-o",
                                                "yaml").stdout
    assert secret_value not in caplog.text
    assert "LEAKED" in caplog.text  # the agent said which property it dropped
    spec_files = list(p.cdi_dir.glob("*.json"))
    assert spec_files
    assert all(secret_value not in f.read_text() for f in spec_files)
    assert await allocatable(p.kube, p.node, instance_resource_name(name)) == "1"
