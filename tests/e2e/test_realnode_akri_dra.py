"""On the real node (kubelet, containerd, runc) in the DRA default: Akri's example
Configurations and an Akri-style Deployment asking for ``edgeplug.io/<configuration>: 1``,
unchanged, get their devices.

The agent runs beside the kubelet with ``DRA=on`` (its device plugins on, as the chart sets
it); the controller with ``--dra`` against the harness's API server, which serves a
DeviceClass's ``extendedResourceName``. The Configurations are what Akri's Helm chart renders
for its debugEcho, OPC-UA, ONVIF and udev examples (``helm template ... --set
<handler>.configuration.enabled=true``), with ``apiVersion: edgeplug.io/v1alpha1`` and the
values a site sets (names, discovery URLs, udev rules, capacity, the broker image: busybox
printing its env, since the node has no registry): ``brokerSpec.brokerPodSpec`` asking for
``{{PLACEHOLDER}}`` in requests and limits beside memory and cpu, ``instanceServiceSpec``,
``configurationServiceSpec``, ``brokerProperties: {}``. No edgeplug field is set.

* Shared devices (debugEcho, two descriptions; one open62541 OPC-UA server, its own
  process): the scheduler allocates them. One broker per device runs and gets its own
  device's env from the claim's CDI spec (Akri's names: ``DEBUG_ECHO_DESCRIPTION``,
  ``OPCUA_DISCOVERY_URL`` and their ``_<id>`` forms); nothing is ``Allocate``d and no device
  plugin advertises them. A plain Deployment asking for ``edgeplug.io/<configuration>: 1`` is
  scheduled through the Configuration's DeviceClass; each replica's container gets the device
  its claim was allocated (``DEBUG_ECHO_DESCRIPTION_<id>`` of that device). Capacity is
  counted by the scheduler: a replica beyond it stays Pending, never refused at admission.
* A local device (udev: a loop device): the scheduler allocates it too (one allocator per
  device). The broker and an Akri-style Deployment asking for ``edgeplug.io/<configuration>:
  1`` each get a claim the scheduler makes (``extendedResourceClaimStatus``), prepared by the
  agent's DRA plugin; the containers get ``UDEV_DEVNODE`` (and ``_<id>``) and the block device
  node from the claim's CDI spec and read its bytes. No device plugin advertises it and
  nothing is ``Allocate``d.

* ONVIF (Akri's form discovers by multicast WS-Discovery only): the camera simulator and the
  agent in the node's network namespace, on a LAN interface of its own there; the broker and
  an Akri-style Deployment get the camera through the scheduler (``ONVIF_DEVICE_SERVICE_URL``,
  ``ONVIF_DEVICE_UUID``, ``ONVIF_STREAM_URI`` and the ``_<id>`` forms).
* Two real nodes seeing one shared debugEcho device of capacity 3: one slice for both, a
  broker on each (Akri's one per node), and of an Akri-style Deployment's two replicas one
  runs and one stays Pending: the scheduler counts the device's capacity once across nodes.

What each container got is read from inside it (``kubectl logs`` of its ``env``).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.dra.slices import device_name, shared_pool
from controller.naming import LABEL_CONFIGURATION
from crds import dra
from crds.naming import configuration_resource_name, instance_name, instance_resource_name
from tests.e2e.test_realnode_brokers import loop_device
from tests.harness import dra as h
from tests.harness.agent_process import eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess, broker_pods
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import until, wait_service_account
from tests.harness.onvif_netns import camera, start_cameras
from tests.harness.opcua_open62541 import Open62541Server
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    END_MARK,
    ENV_MARK,
    Broker,
    akri_style_deployment,
    app_pods,
    broker_log,
    is_running,
    is_unschedulable,
    logged_env,
    pod,
    refusal,
    running_container,
    start_agent,
)
from tests.harness.realnode_images import BUSYBOX_IMAGE

pytestmark = pytest.mark.timeout(1500)
DEPLOYMENT_WITHIN_S = 120.0
#: The node network namespace's own LAN interface, where ONVIF multicast goes (a veth).
LAN_ADDRESS = "10.79.0.1"
#: What the chart's values give each broker (Akri's debugEcho/udev defaults).
BROKER_RESOURCES = {"memoryRequest": "10Mi", "cpuRequest": "10m",
                    "memoryLimit": "30Mi", "cpuLimit": "29m"}


# --- Akri's example Configurations, as its chart renders them --------------------------------


def _printing(name: str, proof: str = "true") -> dict[str, Any]:
    """The broker container a site sets in the chart: busybox printing its env, then ``proof``."""
    script = f"echo {ENV_MARK}; env | sort; {proof}; echo {END_MARK}; exec sleep 3600"
    r = BROKER_RESOURCES
    return {
        "name": f"{name}-broker", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "resources": {
            "requests": {"{{PLACEHOLDER}}": "1", "memory": r["memoryRequest"],
                         "cpu": r["cpuRequest"]},
            "limits": {"{{PLACEHOLDER}}": "1", "memory": r["memoryLimit"],
                       "cpu": r["cpuLimit"]},
        },
    }


def _service(port: int, target: int) -> dict[str, Any]:
    return {"type": "ClusterIP",
            "ports": [{"name": "grpc", "port": port, "protocol": "TCP", "targetPort": target}]}


def _akri(name: str, handler: str, details: str, container: dict[str, Any], *,
          capacity: int, port: int) -> dict[str, Any]:
    """A Configuration of the shape Akri's chart renders (apiVersion aside)."""
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": handler, "discoveryDetails": details},
            "brokerSpec": {"brokerPodSpec": {"containers": [container]}},
            "instanceServiceSpec": _service(port, port),
            "configurationServiceSpec": _service(port, port),
            "brokerProperties": {},
            "capacity": capacity,
        },
    }


def debug_echo(name: str, descriptions: list[str], capacity: int) -> dict[str, Any]:
    """deployment/helm/templates/debug-echo-configuration.yaml's shape."""
    details = "descriptions:\n" + "".join(f"- {d}\n" for d in descriptions)
    return _akri(name, "debugEcho", details, _printing(name), capacity=capacity, port=6052)


def opcua(name: str, discovery_urls: list[str], capacity: int) -> dict[str, Any]:
    """deployment/helm/templates/opcua-configuration.yaml's shape."""
    details = ("opcuaDiscoveryMethod: \n  standard:\n    discoveryUrls: \n"
               + "".join(f"    - {u}\n" for u in discovery_urls)
               + "applicationNames:\n  action: Exclude\n  items: []\n")
    return _akri(name, "opcua", details, _printing(name), capacity=capacity, port=80)


def onvif(name: str, capacity: int) -> dict[str, Any]:
    """deployment/helm/templates/onvif-configuration.yaml's shape with the chart's default
    filters (nothing excluded) and discovery timeout."""
    details = "".join(f"{key}: \n  action: Exclude\n  items: []\n"
                      for key in ("ipAddresses", "macAddresses", "scopes"))
    details += "discoveryTimeoutSeconds: 1\n"
    return _akri(name, "onvif", details, _printing(name), capacity=capacity, port=80)


def udev(name: str, rules: list[str], capacity: int, proof: str) -> dict[str, Any]:
    """deployment/helm/templates/udev-configuration.yaml's shape (its broker container has a
    ``securityContext``: the chart's default is privileged, a site's value here says not)."""
    details = "udevRules:\n" + "".join(f"- {json.dumps(r)}\n" for r in rules)
    container = {**_printing(name, proof), "securityContext": {"privileged": False}}
    return _akri(name, "udev", details, container, capacity=capacity, port=80)


# --- what the cluster and the containers show -------------------------------------------------


def akri_id(instance: str) -> str:
    """The ``<id>`` Akri appends to a property's name: the Instance name's digest, upper case."""
    return instance.rpartition("-")[2].upper()


async def running_replicas(plane: ControlPlane, ns: str, app: str,
                           replicas: int) -> list[dict[str, Any]]:
    """The Deployment's pods once ``replicas`` of them run; none may be refused at admission."""

    async def check() -> list[dict[str, Any]] | None:
        pods = app_pods(plane, ns, app)
        refused = [(p["metadata"]["name"], refusal(p)) for p in pods if refusal(p)]
        assert not refused, f"refused at admission: {refused}"
        up = [p for p in pods if is_running(p)]
        return up if len(up) == replicas else None

    return await eventually(check, what=f"{replicas} pods of {app} Running",
                            deadline=DEPLOYMENT_WITHIN_S)


async def pod_env(plane: ControlPlane, pod: dict[str, Any]) -> dict[str, str]:
    """The env the pod's container printed (``kubectl logs``: API server -> kubelet)."""
    name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]

    def logs() -> str | None:
        out = plane.kubectl("logs", "-n", ns, name, check=False).stdout
        return out if END_MARK in out else None

    return logged_env(await until(logs, what=f"{name}'s env in kubectl logs"))


def claimed_device(plane: ControlPlane, pod: dict[str, Any]) -> str:
    """The device the scheduler allocated the claim it made for the pod's extended resource."""
    claim = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    body = json.loads(plane.kubectl("get", "resourceclaim", claim, "-n",
                                    pod["metadata"]["namespace"], "-o", "json").stdout)
    (result,) = body["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == dra.DRIVER
    return str(result["device"])


def advertised(plane: ControlPlane, node: RealNode) -> set[str]:
    """The ``edgeplug.io/...`` resources the Node's allocatable shows (device plugins')."""
    body = json.loads(plane.kubectl("get", "node", node.node_name, "-o", "json").stdout)
    return {r for r in body["status"].get("allocatable", {}) if r.startswith("edgeplug.io/")}


def allocations(node: RealNode, log: str, resource: str) -> int:
    """``Allocate`` calls the agent answered for exactly ``resource`` (its log says each)."""
    pattern = re.compile(rf"Allocate answered .*resource={re.escape(resource)}(\s|$)")
    return sum(1 for line in node.log_tail(log, 100_000).splitlines() if pattern.search(line))


def allocator(plane: ControlPlane, ns: str, configuration: str) -> str | None:
    """Who allocates the Configuration's devices, as its status says (``status.allocator``)."""
    body = json.loads(plane.kubectl("get", "configuration", configuration, "-n", ns, "-o",
                                    "json").stdout)
    found = (body.get("status") or {}).get("allocator")
    return str(found) if found else None


@asynccontextmanager
async def dra_default(plane: ControlPlane, node: RealNode, tmp_path: Path, *,
                      agent_net: bool = False) -> AsyncIterator[tuple[str, str, AsyncClient]]:
    """A namespace, the agent beside the kubelet with ``DRA=on`` (``agent_net``: in the node's
    network namespace), the controller with ``--dra``; yields (namespace, the agent's log
    name, a client). All stopped after."""
    ns = f"akri-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    agent_log = f"agent-{ns}"
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, Broker(ns, "", "", agent_log), extra_env={"DRA": "on"},
                    net=agent_net)
        ctl.start()
        yield ns, agent_log, kube
    finally:
        ctl.stop()
        node.stop_process(agent_log)
        print(f"--- agent log ---\n{node.log_tail(agent_log, 40)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await h.delete_slices(kube, node.node_name)
        await h.delete_controller_slices(kube, ns)
        await kube.close()


# --- the tests --------------------------------------------------------------------------------


async def test_akri_shared_configurations_and_deployment_through_the_scheduler(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    echo_name, plc_name, capacity = "akri-debug-echo-foo", "akri-opcua", 2
    descriptions = ["foo0", "foo1"]
    server = await Open62541Server("line-1").start()  # the C stack, in its own process
    try:
        async with dra_default(plane, node, tmp_path) as (ns, agent_log, _):
            started = time.monotonic()
            h.apply(plane, ns, debug_echo(echo_name, descriptions, capacity),
                    opcua(plc_name, [server.url], capacity))
            echoes = {d: instance_name(echo_name, d, shared=True, node=node.node_name)
                      for d in descriptions}
            plc = instance_name(plc_name, server.url, shared=True, node=node.node_name)

            # One broker per device, each with its own device's env from its claim's spec.
            for description, inst in echoes.items():
                broker = Broker(ns, inst, f"{inst}-{node.node_name}-pod", agent_log)
                await running_container(plane, broker)
                env = logged_env(await broker_log(plane, broker))
                assert env["DEBUG_ECHO_DESCRIPTION"] == description
                assert env[f"DEBUG_ECHO_DESCRIPTION_{akri_id(inst)}"] == description
            plc_broker = Broker(ns, plc, f"{plc}-{node.node_name}-pod", agent_log)
            await running_container(plane, plc_broker)
            print(f"figure: Akri's debugEcho and OPC-UA Configurations applied -> their three "
                  f"brokers Running through the scheduler {time.monotonic() - started:.1f} s")
            env = logged_env(await broker_log(plane, plc_broker))
            assert env["OPCUA_DISCOVERY_URL"] == server.url
            assert env[f"OPCUA_DISCOVERY_URL_{akri_id(plc)}"] == server.url
            brokers = [p for p in broker_pods(plane, ns)
                       if p["metadata"]["labels"].get(LABEL_CONFIGURATION) == echo_name]
            assert len(brokers) == len(descriptions), "one broker per device (one node)"

            for name in (echo_name, plc_name):
                assert allocator(plane, ns, name) == "dra"
            shared = {*map(instance_resource_name, (*echoes.values(), plc)),
                      configuration_resource_name(echo_name, None),
                      configuration_resource_name(plc_name, None)}
            assert advertised(plane, node).isdisjoint(shared), \
                "no device plugin advertises a shared device"

            # An Akri-style Deployment: each device has one slot left, so its two replicas
            # are one on each device, each getting the device its claim was allocated.
            h.apply(plane, ns, akri_style_deployment("echo-users", f"edgeplug.io/{echo_name}",
                                                     len(descriptions)))
            h.apply(plane, ns, akri_style_deployment("plc-users", f"edgeplug.io/{plc_name}", 1))
            by_device = {inst: d for d, inst in echoes.items()}
            users = await running_replicas(plane, ns, "echo-users", len(descriptions))
            got = sorted(claimed_device(plane, p) for p in users)
            assert got == sorted(echoes.values()), "one replica on each device's last slot"
            for user in users:
                inst = claimed_device(plane, user)
                env = await pod_env(plane, user)
                assert env[f"DEBUG_ECHO_DESCRIPTION_{akri_id(inst)}"] == by_device[inst]
                assert env["DEBUG_ECHO_DESCRIPTION"] == by_device[inst]
            (plc_user,) = await running_replicas(plane, ns, "plc-users", 1)
            assert claimed_device(plane, plc_user) == plc
            plc_env = await pod_env(plane, plc_user)
            assert plc_env[f"OPCUA_DISCOVERY_URL_{akri_id(plc)}"] == server.url

            # Every slot is taken: one replica more waits for the scheduler, never refused.
            plane.kubectl("scale", "deployment", "echo-users", "-n", ns, "--replicas",
                          str(len(descriptions) + 1))

            async def waiting() -> dict[str, Any] | None:
                pods = app_pods(plane, ns, "echo-users")
                refused = [p["metadata"]["name"] for p in pods if refusal(p)]
                assert not refused, f"refused at admission: {refused}"
                pending = [p for p in pods if is_unschedulable(p)]
                return pending[0] if pending else None

            await eventually(waiting, what="the replica beyond capacity Unschedulable",
                             deadline=60)
            for inst in (*echoes.values(), plc):
                assert allocations(node, agent_log, f"edgeplug.io/{inst}") == 0
            for name in (echo_name, plc_name):
                assert allocations(node, agent_log, f"edgeplug.io/{name}") == 0
    finally:
        await server.close()


async def test_akri_udev_configuration_and_deployment_through_the_scheduler(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """A local device (a loop device, udev, capacity 2) in the DRA default: the scheduler
    allocates it too. The broker (``{{PLACEHOLDER}}``: ``edgeplug.io/<instance>``) and an
    Akri-style Deployment asking for ``edgeplug.io/<configuration>`` run unchanged, each
    through a claim the scheduler made; no device plugin is advertised and nothing is
    ``Allocate``d. Each container reads the block device node its claim's CDI spec gave it."""
    name = "akri-udev"
    marker = f"edgeplug-akri-{uuid.uuid4().hex[:12]}".encode()
    proof = 'ls -l "$UDEV_DEVNODE"; echo edgeplug-read:$(head -c 32 "$UDEV_DEVNODE")'

    def reads_the_device(out: str, device: str) -> None:
        [listing] = [line for line in out.splitlines() if line.endswith(f" {device}")]
        assert listing.startswith("b"), f"a block device node in the container: {listing}"
        assert f"edgeplug-read:{marker.decode()}" in out, "the container read the device"

    with loop_device(tmp_path / "disk.img", marker) as device:
        kernel = Path(device).name
        inst = instance_name(name, f"/devices/virtual/block/{kernel}", shared=False,
                             node=node.node_name)
        async with dra_default(plane, node, tmp_path) as (ns, agent_log, _):
            started = time.monotonic()
            h.apply(plane, ns, udev(name, [f'SUBSYSTEM=="block", KERNEL=="{kernel}"'], 2,
                                    proof))
            broker = Broker(ns, inst, f"{inst}-{node.node_name}-pod", agent_log)
            await running_container(plane, broker)
            print(f"figure: Akri's udev Configuration applied -> its broker Running through "
                  f"the scheduler {time.monotonic() - started:.1f} s")
            assert allocator(plane, ns, name) == "dra", "the DRA default covers local devices"
            assert claimed_device(plane, pod(plane, broker) or {}) == inst, \
                "the broker's claim, made by the scheduler, was allocated the device"
            out = await broker_log(plane, broker)
            env = logged_env(out)
            assert env["UDEV_DEVNODE"] == env[f"UDEV_DEVNODE_{akri_id(inst)}"] == device
            reads_the_device(out, device)

            h.apply(plane, ns, akri_style_deployment("udev-users", f"edgeplug.io/{name}", 1,
                                                     proof=proof))
            (user,) = await running_replicas(plane, ns, "udev-users", 1)
            assert claimed_device(plane, user) == inst, \
                "the claim the scheduler made for edgeplug.io/<configuration>, allocated the device"
            env = await pod_env(plane, user)
            assert env["UDEV_DEVNODE"] == env[f"UDEV_DEVNODE_{akri_id(inst)}"] == device
            reads_the_device(plane.kubectl("logs", "-n", ns, user["metadata"]["name"]).stdout,
                             device)
            for resource in (f"edgeplug.io/{inst}", f"edgeplug.io/{name}"):
                assert allocations(node, agent_log, resource) == 0, \
                    f"no device plugin allocated {resource}"
            assert advertised(plane, node) == set(), \
                "no device plugin advertises the local device"


async def test_a_shared_devices_capacity_is_counted_once_across_two_real_nodes(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """Two real nodes see one debugEcho device of capacity 3: Akri's one broker per node takes
    two units, so of an Akri-style Deployment's two replicas one runs (on either node) and one
    waits; counted per node, both would run."""
    name, capacity = "akri-debug-echo-foo", 3
    other = RealNode(plane, node_name=f"real-{uuid.uuid4().hex[:6]}")
    other.start()
    try:
        async with dra_default(plane, node, tmp_path) as (ns, agent_log, kube):
            start_agent(other, plane, Broker(ns, "", "", agent_log), extra_env={"DRA": "on"})
            try:
                started = time.monotonic()
                h.apply(plane, ns, debug_echo(name, ["foo0"], capacity))
                inst = instance_name(name, "foo0", shared=True, node=node.node_name)
                for each in (node, other):
                    broker = Broker(ns, inst, f"{inst}-{each.node_name}-pod", agent_log)
                    await running_container(plane, broker)
                print(f"figure: Akri's debugEcho Configuration applied -> a broker Running on "
                      f"each of two real nodes {time.monotonic() - started:.1f} s")
                for each in (node, other):
                    broker = Broker(ns, inst, f"{inst}-{each.node_name}-pod", agent_log)
                    env = logged_env(await broker_log(plane, broker))
                    assert env["DEBUG_ECHO_DESCRIPTION"] == "foo0"
                pool = shared_pool(ns, name, inst)
                both = sorted((node.node_name, other.node_name))

                async def published_for_both() -> list[dict[str, Any]] | None:
                    found = await h.pool_slices(kube, pool)
                    if len(found) != 1:
                        return None
                    return found if h.device_nodes(found, device_name(inst)) == both \
                        else None

                await eventually(published_for_both, deadline=30,
                                 what=f"pool {pool}: one slice, for both nodes")

                h.apply(plane, ns, akri_style_deployment("users", f"edgeplug.io/{name}", 2))
                (user,) = await running_replicas(plane, ns, "users", 1)
                assert claimed_device(plane, user) == inst
                print(f"the replica that got the last unit runs on {user['spec']['nodeName']}")
                env = await pod_env(plane, user)
                assert env[f"DEBUG_ECHO_DESCRIPTION_{akri_id(inst)}"] == "foo0"

                async def waiting() -> dict[str, Any] | None:
                    pods = app_pods(plane, ns, "users")
                    refused = [p["metadata"]["name"] for p in pods if refusal(p)]
                    assert not refused, f"refused at admission: {refused}"
                    assert sum(map(is_running, pods)) <= 1, "more slots used than the capacity"
                    pending = [p for p in pods if is_unschedulable(p)]
                    return pending[0] if pending else None

                await eventually(waiting, what="the second replica Unschedulable", deadline=60)
                for each in (node, other):
                    assert allocations(each, agent_log, f"edgeplug.io/{name}") == 0
            finally:
                other.stop_process(agent_log)
                print(f"--- second node's agent log ---\n{other.log_tail(agent_log, 30)}")
                await h.delete_slices(kube, other.node_name)
    finally:
        print(f"--- second node's kubelet log ---\n{other.log_tail('kubelet', 20)}")
        other.cleanup()


@contextmanager
def named_netns(node: RealNode) -> Iterator[str]:
    """The node's network namespace under a name (``ip netns attach``), with a multicast LAN
    interface of its own (one end of a veth pair, ``LAN_ADDRESS``); both removed after."""
    name = f"ep-{node.node_name}"
    subprocess.run(["ip", "netns", "attach", name, str(node.pid("containerd"))], check=True)
    inside = ["ip", "-n", name]
    try:
        subprocess.run([*inside, "link", "add", "lan0", "type", "veth", "peer", "name", "lan1"],
                       check=True)
        for end in ("lan1", "lan0"):
            subprocess.run([*inside, "link", "set", end, "up"], check=True)
        subprocess.run([*inside, "addr", "add", f"{LAN_ADDRESS}/24", "dev", "lan0"], check=True)
        yield name
    finally:
        subprocess.run([*inside, "link", "del", "lan0"], check=False)
        subprocess.run(["ip", "netns", "delete", name], check=False)


async def test_akri_onvif_configuration_finds_a_camera_by_multicast_and_is_scheduled(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """Akri's ONVIF Configuration discovers by multicast WS-Discovery only: the simulated
    camera and the agent both run in the node's network namespace (the agent reaches the API
    server through ``forward_api``), on a LAN interface of its own there."""
    name, capacity, http_port = "akri-onvif", 2, free_port()
    stream = "rtsp://127.0.0.1:8554/main"
    cam = camera(1, "127.0.0.1", port=http_port,
                 profiles=[{"token": "main", "name": "Main", "uri": stream}])
    url = f"http://127.0.0.1:{http_port}/onvif/1/device_service"
    with named_netns(node) as netns:
        node.forward_api()
        cameras = await start_cameras(None, netns, {"http_port": http_port, "cameras": [cam]},
                                      workdir=tmp_path)
        try:
            async with dra_default(plane, node, tmp_path, agent_net=True) as (ns, agent_log, _):
                started = time.monotonic()
                h.apply(plane, ns, onvif(name, capacity))
                inst = instance_name(name, f"{url}-{cam['uuid']}", shared=True,
                                     node=node.node_name)
                broker = Broker(ns, inst, f"{inst}-{node.node_name}-pod", agent_log)
                await running_container(plane, broker)
                print(f"figure: Akri's ONVIF Configuration applied -> the camera's broker "
                      f"Running through the scheduler {time.monotonic() - started:.1f} s")
                env = logged_env(await broker_log(plane, broker))
                for key, value in (("ONVIF_DEVICE_SERVICE_URL", url),
                                   ("ONVIF_DEVICE_UUID", cam["uuid"]),
                                   ("ONVIF_STREAM_URI", stream)):
                    assert env[key] == env[f"{key}_{akri_id(inst)}"] == value
                assert allocator(plane, ns, name) == "dra"

                h.apply(plane, ns, akri_style_deployment("viewers", f"edgeplug.io/{name}", 1))
                (viewer,) = await running_replicas(plane, ns, "viewers", 1)
                assert claimed_device(plane, viewer) == inst
                viewer_env = await pod_env(plane, viewer)
                assert viewer_env[f"ONVIF_DEVICE_SERVICE_URL_{akri_id(inst)}"] == url
                assert allocations(node, agent_log, f"edgeplug.io/{name}") == 0
                assert allocations(node, agent_log, f"edgeplug.io/{inst}") == 0
        finally:
            await cameras.stop()
            node.stop_process("api-forward")
            print(f"--- cameras ---\n{cameras.stderr()}")
