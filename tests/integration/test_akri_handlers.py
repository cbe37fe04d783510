"""Akri's discovery handlers plug in unchanged: a Go handler speaking Akri's ``v0`` protocol.

The handler (tests/harness/akri_handler, compiled from its own copy of Akri's ``.proto``) stands
for an Akri user's custom handler or Akri's own debugEcho DaemonSet: it registers over the
agent's real ``agent-registration.sock`` and serves ``Discover`` on its own Unix socket (or a TCP
port, as a handler in a pod does). The agent runs as ``agent.main.run_agent`` wires it, in
process, against the real control plane; the handler is a real process the tests kill and
start again.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Event

from agent.discovery.events import REASON_DISCOVERY_WARNING, condition_type
from agent.discovery.runs import REASON_HANDLER_UNAVAILABLE
from crds.naming import instance_name, instance_resource_name
from discovery_handlers.contract import DeviceSpec, Mount
from tests.harness import agent_process as harness
from tests.harness.akri_agents import (
    INSTANCE_GRACE,
    AkriAgent,
    agent_with_handler,
    akri_agent,
    akri_configuration,
    all_offline,
    all_online,
    condition_with,
    go_handler,
    instances_become,
    is_registered,
    logged,
    properties_matching,
    served_device,
)
from tests.harness.akri_go_handler import GoHandler
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_allocatable
from tests.harness.node_emulator import NodeEmulator

#: The agent's grace for a lost handler before its registration is dropped.
LONG_HANDLER_GRACE = 120.0
SHORT_HANDLER_GRACE = 2.0
SECRET_VALUE = b"s3cr3t-\x00\xffbytes"  # binary on purpose: Secrets travel as bytes


@pytest.fixture
def handlers_dir() -> Iterator[Path]:
    """A discovery-handlers directory of the test's own (short: socket paths fit 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="akri-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sha(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()[:16]


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "password"
    path.write_bytes(SECRET_VALUE)
    return path


def _with_akri_echo(control_plane: ControlPlane, node: str, namespace: str, handlers_dir: Path,
                    tmp_path: Path, cfg: dict[str, Any]
                    ) -> AbstractAsyncContextManager[tuple[AkriAgent, GoHandler]]:
    """The agent, ``cfg`` and the akriEcho handler, with the long offline grace."""
    return agent_with_handler(control_plane, node=node, namespace=namespace,
                              directory=handlers_dir, tmp_path=tmp_path, configuration=cfg,
                              handler="akriEcho", grace=LONG_HANDLER_GRACE)


async def test_go_handler_registers_goes_away_and_comes_back(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="discovery_handlers.external")
    node = harness.new_node(control_plane)
    control_plane.kubectl("create", "secret", "generic", "cam-secret", "-n", namespace,
                          f"--from-file=password={_secret_file(tmp_path)}")
    cfg = akri_configuration(
        "akri-cams", handler="akriEcho",
        details={"descriptions": ["cam0", "cam1"], "deviceNodes": True, "malformed": True},
        properties=[{"name": "site", "value": "lab"},
                    {"name": "password",
                     "valueFrom": {"secretKeyRef": {"name": "cam-secret", "key": "password"}}}],
    )
    expected = {instance_name("akri-cams", d, shared=True, node=node) for d in ("cam0", "cam1")}
    cam0 = instance_name("akri-cams", "cam0", shared=True, node=node)
    client = harness.api_client(control_plane)
    async with _with_akri_echo(control_plane, node, namespace, handlers_dir, tmp_path,
                               cfg) as (agent, handler):
        found = await instances_become(client, namespace, expected)
        assert agent.registered("akriEcho") == 1
        spec = found[cam0]["spec"]
        assert spec["shared"] is True
        props = spec["brokerProperties"]
        assert props["DEBUG_ECHO_DESCRIPTION"] == "cam0"
        # The resolved properties reached the handler, the Secret as its bytes.
        assert props["PROPERTY_NAMES"] == "password,site"
        assert props["PROPERTY_SHA256_SITE"] == _sha(b"lab")
        assert props["PROPERTY_SHA256_PASSWORD"] == _sha(SECRET_VALUE)
        served = await served_device(agent, namespace, cam0)
        assert served.device_specs == (
            DeviceSpec(container_path="/dev/akri/cam0", host_path="/dev/null",
                       permissions="rw"),)
        assert served.mounts == (
            Mount(container_path="/etc/akri/cam0", host_path="/etc/hostname",
                  read_only=True),)
        # The two malformed devices were refused, each with a line naming why.
        refusals = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
        assert any("id ''" in m and "empty id" in m for m in refusals), refusals
        assert any("'no-host-path'" in m and "no host_path" in m for m in refusals), refusals

        handler.kill()
        # Gone: the devices are offline but their Instances stay for the grace...
        await harness.eventually(
            lambda: all_offline(agent, namespace, expected), what="devices marked offline")
        assert set(await harness.instances(client, namespace)) == expected
        # ... and are removed after it.
        await instances_become(client, namespace, set(), deadline=INSTANCE_GRACE + 20)

        handler.start()  # the same handler again: it registers again, same device ids
        await instances_become(client, namespace, expected)
        assert agent.registered("akriEcho") == 1
    await client.close()


async def test_handler_away_within_the_grace_keeps_its_instances(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """A handler restarted within the offline grace: the Instances never went (same uids)."""
    node = harness.new_node(control_plane)
    cfg = akri_configuration("akri-restart", handler="akriEcho",
                             details={"descriptions": ["usb0"]})
    expected = {instance_name("akri-restart", "usb0", shared=True, node=node)}
    client = harness.api_client(control_plane)
    async with _with_akri_echo(control_plane, node, namespace, handlers_dir, tmp_path,
                               cfg) as (agent, handler):
        before = await instances_become(client, namespace, expected)
        handler.kill()
        await harness.eventually(
            lambda: all_offline(agent, namespace, expected), what="device marked offline")
        handler.start()
        await harness.eventually(lambda: all_online(agent, namespace, expected),
                                 what="device online again")
        after = await harness.instances(client, namespace)
        assert {n: i["metadata"]["uid"] for n, i in after.items()} == {
            n: i["metadata"]["uid"] for n, i in before.items()}
    await client.close()


async def test_handler_registered_under_debug_echo_takes_over_then_hands_back(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Akri's debugEcho DaemonSet on a node: its handler serves the name while registered; once
    it is gone for longer than the agent's grace, the built-in serves again."""
    caplog.set_level(logging.WARNING, logger="discovery_handlers.external")
    node = harness.new_node(control_plane)
    cfg = harness.debug_echo_configuration("echo", descriptions=["foo0"], grace=INSTANCE_GRACE)
    foo0 = instance_name("echo", "foo0", shared=True, node=node)
    client = harness.api_client(control_plane)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=SHORT_HANDLER_GRACE) as agent:
        harness.apply(control_plane, namespace, cfg)
        await instances_become(client, namespace, {foo0})
        builtin = await properties_matching(agent, namespace, foo0,
                                            lambda p: "PROPERTY_NAMES" not in p)
        assert builtin == {"DEBUG_ECHO_DESCRIPTION": "foo0"}
        with go_handler(handlers_dir, tmp_path, name="debugEcho") as handler:
            # The Go handler's devices carry PROPERTY_NAMES: it serves the name now.
            await properties_matching(agent, namespace, foo0, lambda p: "PROPERTY_NAMES" in p)
            assert agent.registered("debugEcho") == 1

            # ... and the Configuration says so (a Warning Event from this node).
            async def noted() -> list[Event] | None:
                events = [e async for e in client.list(
                    Event, namespace=namespace,
                    fields={"involvedObject.name": "echo", "reason": REASON_DISCOVERY_WARNING})]
                return [e for e in events
                        if "in place of the built-in 'debugEcho'" in (e.message or "")] or None

            [event] = await harness.eventually(noted, what="the takeover's Warning Event")
            assert event.source is not None
            assert event.source.host == node
            handler.kill()
            await properties_matching(agent, namespace, foo0, lambda p: "PROPERTY_NAMES" not in p)
            assert agent.registered("debugEcho") is None
        assert set(await harness.instances(client, namespace)) == {foo0}
        messages = [r.getMessage() for r in caplog.records]
        assert sum("takes over the built-in 'debugEcho'" in m for m in messages) == 1, messages
        assert sum("built-in discovery handler 'debugEcho' serves again" in m
                   for m in messages) == 1, messages
    await client.close()


async def test_configuration_waiting_for_its_handler_says_so_on_its_node_condition(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """A Configuration naming a handler nobody registered: this node's ``DiscoveryReady``
    condition names the handler and the socket it waits on; once the handler registers the
    condition goes and the Instances come; when the handler is lost, the condition says so."""
    node = harness.new_node(control_plane)
    cfg = akri_configuration("akri-later", handler="akriLater", details={"descriptions": ["x"]})
    expected = {instance_name("akri-later", "x", shared=True, node=node)}
    client = harness.api_client(control_plane)
    kind = condition_type(node)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=LONG_HANDLER_GRACE):
        harness.apply(control_plane, namespace, cfg)
        waiting = await condition_with(client, namespace, "akri-later", kind, "not registered")
        assert waiting["reason"] == REASON_HANDLER_UNAVAILABLE
        assert "'akriLater'" in waiting["message"]
        assert str(handlers_dir / "agent-registration.sock") in waiting["message"]
        with go_handler(handlers_dir, tmp_path, name="akriLater") as handler:
            await instances_become(client, namespace, expected)
            await condition_with(client, namespace, "akri-later", kind, None)
            handler.kill()
            lost = await condition_with(client, namespace, "akri-later", kind, "unreachable")
            assert lost["reason"] == REASON_HANDLER_UNAVAILABLE
    await client.close()


async def test_a_pod_gets_the_external_devices_env_device_nodes_and_mounts(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
    plugin_dir: Path,
) -> None:
    """The path a broker takes: the Go handler's device → allocatable on the Node (the kubelet's
    own device manager) → a pod requesting it gets the device's properties as env, its device
    node and its mount."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    kubelet = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                           plugin_dir=plugin_dir)
    cfg = akri_configuration("akri-pod", handler="akriEcho",
                             details={"descriptions": ["cam0"], "deviceNodes": True})
    cfg["spec"]["brokerProperties"] = {"MODE": "test"}
    resource = instance_resource_name(instance_name("akri-pod", "cam0", shared=True, node=node))
    client = harness.api_client(control_plane)
    await kubelet.start()
    try:
        async with akri_agent(control_plane, node=node, namespace=namespace,
                              directory=handlers_dir, grace=LONG_HANDLER_GRACE,
                              plugin_dir=plugin_dir):
            harness.apply(control_plane, namespace, cfg)
            with go_handler(handlers_dir, tmp_path, name="akriEcho"):
                await wait_allocatable(client, node, resource, "1")
                harness.apply(control_plane, namespace, {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "broker"},
                    "spec": {"containers": [{
                        "name": "c", "image": "busybox:1.36",
                        "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
                    }]},
                })

                async def allocated() -> list[Any] | None:
                    return kubelet.allocations(namespace, "broker") or None

                [got] = await harness.eventually(allocated, what="the broker pod allocated")
                assert got.envs["DEBUG_ECHO_DESCRIPTION"] == "cam0"
                assert got.envs["MODE"] == "test"
                assert ("/dev/akri/cam0", "/dev/null", "rw") in got.devices
                assert ("/etc/akri/cam0", "/etc/hostname", True) in got.mounts
    finally:
        await kubelet.stop(delete_node=True)
        await client.close()


async def test_other_streams_go_on_when_the_handler_registers_again(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """Akri's handlers register again whenever the agent closes one of their streams (here:
    a Configuration deleted). The registration is the same, so the other Configurations'
    streams go on: restarting them would close streams, bring registrations, and so on."""
    node = harness.new_node(control_plane)
    names = {d: instance_name(f"akri-{d}", d, shared=True, node=node) for d in "abc"}
    client = harness.api_client(control_plane)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=LONG_HANDLER_GRACE):
        with go_handler(handlers_dir, tmp_path, name="akriEcho") as handler:
            harness.apply(control_plane, namespace, *(
                akri_configuration(f"akri-{d}", handler="akriEcho",
                                   details={"descriptions": [d]}) for d in "ab"))
            await instances_become(client, namespace, {names["a"], names["b"]})
            control_plane.kubectl("delete", "configuration", "akri-b", "-n", namespace)
            await instances_become(client, namespace, {names["a"]})
            await harness.eventually(lambda: logged(handler, "registered", 2),
                                     what="the handler registering again")
            harness.apply(control_plane, namespace, akri_configuration(
                "akri-c", handler="akriEcho", details={"descriptions": ["c"]}))
            await instances_become(client, namespace, {names["a"], names["c"]})
            calls = [line for line in handler.log_tail(100).splitlines()
                     if "discover called" in line]
            assert len(calls) == 3, calls  # a, b, c: a's stream was never restarted
    await client.close()


async def test_a_handler_refusing_the_details_is_reported_and_kept(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """The handler answers Discover with an error: the node's condition carries its message;
    the handler is there, so its registration stays."""
    node = harness.new_node(control_plane)
    client = harness.api_client(control_plane)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=SHORT_HANDLER_GRACE) as agent:
        with go_handler(handlers_dir, tmp_path, name="akriEcho") as handler:
            harness.apply(control_plane, namespace, akri_configuration(
                "akri-bad", handler="akriEcho", details={"descriptions": ["x"], "fail": True}))
            failed = await condition_with(client, namespace, "akri-bad", condition_type(node),
                                      "asks this handler to fail")
            assert failed["reason"] == REASON_HANDLER_UNAVAILABLE
            assert "INVALID_ARGUMENT" in failed["message"]
            # Retried past the agent's grace for lost handlers, yet still registered.
            await harness.eventually(
                lambda: logged(handler, "discover called", 4), what="four Discover calls",
                deadline=SHORT_HANDLER_GRACE + 20)
            assert agent.registered("akriEcho") == 1
    await client.close()


async def test_a_restarted_agent_knows_the_handlers_registered_with_its_predecessor(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """A handler serving no Configuration never sees the agent restart (no stream of its closes),
    so it does not register again; the new agent serves it from the registration record."""
    node = harness.new_node(control_plane)
    expected = {instance_name("akri-after", "z", shared=True, node=node)}
    client = harness.api_client(control_plane)
    with go_handler(handlers_dir, tmp_path, name="akriEcho") as handler:
        async with akri_agent(control_plane, node=node, namespace=namespace,
                              directory=handlers_dir, grace=LONG_HANDLER_GRACE) as before:
            await harness.eventually(lambda: is_registered(before, "akriEcho"),
                                     what="the handler registered")
        async with akri_agent(control_plane, node=node, namespace=namespace,
                              directory=handlers_dir, grace=LONG_HANDLER_GRACE) as after:
            # The new agent reads its predecessor's record as it starts (the handler does
            # not register again: checked below).
            await harness.eventually(lambda: is_registered(after, "akriEcho"),
                                     what="the handler known from the record")
            assert after.registered("akriEcho") == 1
            harness.apply(control_plane, namespace, akri_configuration(
                "akri-after", handler="akriEcho", details={"descriptions": ["z"]}))
            await instances_become(client, namespace, expected)
        assert await logged(handler, "registered", 1)
        assert not await logged(handler, "again", 1), "it registered only once"
    await client.close()


async def test_network_endpoint(
    control_plane: ControlPlane, namespace: str, handlers_dir: Path, tmp_path: Path,
) -> None:
    """A handler in a pod registers ``http://<pod IP>:<port>`` (NETWORK); here on loopback."""
    node = harness.new_node(control_plane)
    cfg = akri_configuration("akri-net", handler="akriNet", details={"descriptions": ["n0"]})
    expected = {instance_name("akri-net", "n0", shared=False, node=node)}
    client = harness.api_client(control_plane)
    async with akri_agent(control_plane, node=node, namespace=namespace,
                          directory=handlers_dir, grace=LONG_HANDLER_GRACE):
        harness.apply(control_plane, namespace, cfg)
        with go_handler(handlers_dir, tmp_path, name="akriNet", network=True, shared=False):
            found = await instances_become(client, namespace, expected)
            assert found[next(iter(expected))]["spec"]["shared"] is False
    await client.close()
