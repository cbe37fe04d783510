"""On a real node: a pod gets its device through DRA, end to end.

The agent runs beside the kubelet with ``DRA=on`` and default paths: it publishes the node's
ResourceSlice and registers its DRA plugin in the node's ``/var/lib/kubelet/plugins_registry``.
A pod asks for a device through a ResourceClaimTemplate selecting it by attribute: the real
kube-controller-manager makes the claim, the real kube-scheduler allocates it, the real
kubelet's DRA manager calls the agent's ``NodePrepareResources`` over the registered socket (the
agent reads the claim with the kubelet's own certificate, through the Node authorizer) and
hands the returned CDI id to containerd, which resolves it from the agent's claim spec in the
node's ``/var/run/cdi``. What the container got is read from inside it (``kubectl logs`` of a
busybox printing its env). The device goes: its slice loses it, the pod runs on and a new
claim for it waits. The kubelet restarts (the plugin registers again, the container
runs on); the agent restarts (the claim's spec stays); the pod is deleted (the kubelet
unprepares the claim through the new agent process and the spec goes). A pod asking the same
agent's device plugin for a device of a Configuration pinned to ``devicePlugin`` (a device has
one allocator) gives the figure to compare with. A Configuration
with ``brokerDeviceAccess: dra`` gets its broker the same way, through the controller's claim
template (no ``Allocate``), and its Instance shows the claim. A claimed device that fails and
comes back shows so in its pod's ``allocatedResourcesStatus`` (the kubelet's DRA health
stream, KEP-4680). The node reboots while pods hold claims: each runs again with its device.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.dra import claims as cl
from agent.dra import slices
from crds import dra
from crds.naming import instance_name
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.agent_process import eventually as harness_eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import until, wait_service_account
from tests.harness.metrics_scrape import scrape
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    END_MARK,
    ENV_MARK,
    Broker,
    allocates,
    broker_log,
    broker_spec,
    container_id,
    logged_env,
    node,
    plane,
    pod,
    running_container,
    start_agent,
)
from tests.harness.realnode_images import BUSYBOX_IMAGE

__all__ = ["node", "plane"]  # the module fixtures

#: A first start builds the node's binaries once (minutes, cached after).
pytestmark = pytest.mark.timeout(1500)
REGISTERED = "DRA plugin registered with the kubelet"


def _pod(name: str, template: str) -> dict[str, Any]:
    script = f"echo {ENV_MARK}; env | sort; echo {END_MARK}; exec sleep 3600"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "resources": {"claims": [{"name": "dev"}]}}],
        },
    }


def _plugin_pod(name: str, resource: str) -> dict[str, Any]:
    pod = _pod(name, "")
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return pod


def _phase(plane: ControlPlane, ns: str, pod: str) -> dict[str, Any] | None:
    out = plane.kubectl("get", "pod", pod, "-n", ns, "-o", "json", check=False).stdout
    return json.loads(out) if out else None


def _running(plane: ControlPlane, ns: str, pod: str) -> str | None:
    found = _phase(plane, ns, pod) or {}
    statuses = found.get("status", {}).get("containerStatuses") or []
    ready = [s for s in statuses if s.get("ready") and s.get("containerID")]
    return str(ready[0]["containerID"]) if len(ready) == 1 else None


async def test_a_pod_gets_its_device_through_dra_on_the_real_node(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    ns = f"dra-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    agent_log = f"agent-{ns}"
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    lamp = instance_name("echo", "lamp", shared=False, node=node.node_name)
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, Broker(ns, lamp, "", agent_log), extra_env={"DRA": "on"})
        async with h.device_classes(kube, ns):
            offline = tmp_path / "offline"  # debugEcho's availability file: what is gone
            cfg = debug_echo_configuration("echo", descriptions=["lamp", "fan"], shared=False,
                                           availability_file=offline)
            h.apply(plane, ns, cfg)
            await until(lambda: REGISTERED in node.log_tail(agent_log, 1000),
                        what="the agent's DRA plugin registered with the kubelet", within=60)
            cel = f'device.attributes["{dra.DRIVER}"].description == "lamp"'
            started = time.monotonic()
            h.apply(plane, ns, h.claim_template("lamp", dra.device_class_name(ns, "echo"), cel),
                    _pod("user", "lamp"))
            container = await until(lambda: _running(plane, ns, "user"),
                                    what="pod user Running with its claim", within=120)
            print(f"figure: claim template + pod applied -> Running through DRA on the real "
                  f"node {time.monotonic() - started:.1f} s")
            out = await until(lambda: _logs(plane, ns, "user"), what="user's env in its log")
            env = logged_env(out)
            assert env["DEBUG_ECHO_DESCRIPTION"] == "lamp", "from the claim's CDI spec"
            specs = list(node.host_path("/var/run/cdi").glob("edgeplug.io_claim-*.json"))
            assert len(specs) == 1, "one CDI spec for the one claim, in the node's /var/run/cdi"
            assert "claim prepared" in node.log_tail(agent_log, 1000)
            # Read with the kubelet's own certificate, from the node's kubelet directory.
            assert "claims are read as the kubelet" in node.log_tail(agent_log, 1000)

            # The lamp goes: its pool's slice loses it, the pod holding it runs on, and a new
            # claim for it waits (Unschedulable, no admission failure).
            offline.write_text("lamp\n")
            pool = slices.local_pool(ns, "echo", node.node_name)

            async def lamp_withdrawn() -> bool:
                devices = h.pool_devices(await h.pool_slices(kube, pool))
                return bool(devices) and lamp not in devices

            await harness_eventually(lamp_withdrawn, what="the lamp withdrawn from its pool")
            h.apply(plane, ns, _pod("second", "lamp"))
            await harness_eventually(lambda: h.unschedulable(kube, ns, "second"),
                                     what="pod second unschedulable", deadline=60.0)
            assert _running(plane, ns, "user") == container, "the lamp's pod ran on"

            # The same agent's device plugin, same node: the figure to compare with (the
            # plugin is registered, as the DRA plugin was above). A device has one allocator,
            # so it is another Configuration's device, pinned to device plugins.
            h.apply(plane, ns, debug_echo_configuration(
                "plug", descriptions=["fan"], shared=False, allocator="devicePlugin"))
            fan = instance_name("plug", "fan", shared=False, node=node.node_name)
            await until(lambda: node.resource_registered(f"edgeplug.io/{fan}"),
                        what=f"edgeplug.io/{fan} registered", within=60)
            started = time.monotonic()
            h.apply(plane, ns, _plugin_pod("classic", f"edgeplug.io/{fan}"))
            await until(lambda: _running(plane, ns, "classic"),
                        what="pod classic Running with its device plugin", within=120)
            print(f"figure: pod applied -> Running through the device plugin on the real node "
                  f"{time.monotonic() - started:.1f} s")

            node.restart_kubelet()
            await until(lambda: node.log_tail(agent_log, 1000).count(REGISTERED) >= 2,
                        what="the plugin registered with the restarted kubelet", within=90)
            assert _running(plane, ns, "user") == container, "the container ran on"

            # The agent restarts with the claim prepared: the new process registers, and the
            # kubelet's unprepare through it removes the claim's spec.
            node.stop_process(agent_log)
            agent_log = f"{agent_log}-again"
            start_agent(node, plane, Broker(ns, lamp, "", agent_log), extra_env={"DRA": "on"})
            await until(lambda: REGISTERED in node.log_tail(agent_log, 1000),
                        what="the restarted agent's DRA plugin registered", within=60)
            assert _running(plane, ns, "user") == container, "the container ran on"
            assert specs[0].exists(), "the claim's spec outlives the agent"

            plane.kubectl("delete", "pod", "user", "-n", ns, "--wait=false")
            await until(lambda: not any(node.host_path("/var/run/cdi").glob(
                "edgeplug.io_claim-*.json")), what="the claim's CDI spec removed", within=90)
            # The agent removes the spec first, then drops its record and says so: wait for
            # the line rather than read the log the moment the spec is gone.
            await until(lambda: "claim unprepared" in node.log_tail(agent_log, 1000),
                        what="the agent saying it unprepared the claim", within=30)
    finally:
        await _clean_up(plane, node, kube, ns, agent_log)


def _logs(plane: ControlPlane, ns: str, pod: str) -> str | None:
    out = plane.kubectl("logs", "-n", ns, pod, check=False).stdout
    return out if END_MARK in out else None


async def test_a_dra_configurations_broker_gets_its_device_through_a_claim(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """``brokerDeviceAccess: dra``: the controller's broker names the Instance's claim
    template; the controller-manager makes its claim, the scheduler allocates the lamp, the
    kubelet has the agent prepare it, and the broker's env comes from the claim's CDI spec —
    no Allocate. ``kubectl get instances`` then shows one claim, served by DRA only (one
    allocator per device: no device plugin offers it)."""
    ns = f"drb-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    lamp = instance_name("echo", "lamp", shared=False, node=node.node_name)
    broker = Broker(ns, lamp, f"{lamp}-{node.node_name}-pod", f"agent-{ns}")
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra"))
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, broker, extra_env={"DRA": "on"})
        ctl.start()
        cfg = debug_echo_configuration("echo", descriptions=["lamp"], shared=False)
        cfg["spec"]["brokerDeviceAccess"] = "dra"
        cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
        started = time.monotonic()
        h.apply(plane, ns, cfg)
        container = await running_container(plane, broker)
        print(f"figure: Configuration applied -> DRA broker Running on the real node "
              f"{time.monotonic() - started:.1f} s")
        env = logged_env(await broker_log(plane, broker))
        assert env["DEBUG_ECHO_DESCRIPTION"] == "lamp", "from the claim's CDI spec"
        assert env["EDGEPLUG_INSTANCE"] == lamp
        assert allocates(node, broker) == 0, "no device-plugin Allocate for the broker"
        found = pod(plane, broker) or {}
        (claim_status,) = found["status"]["resourceClaimStatuses"]
        claim = json.loads(plane.kubectl("get", "resourceclaim", claim_status[
            "resourceClaimName"], "-n", ns, "-o", "json").stdout)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["device"]) == (dra.DRIVER, lamp)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [broker.pod]
        spec = node.host_path("/var/run/cdi") / f"edgeplug.io_claim-{claim['metadata']['uid']}.json"
        assert spec.is_file(), "the claim's CDI spec in the node's /var/run/cdi"

        def shown() -> list[str] | None:
            out = plane.kubectl("get", "instance", lamp, "-n", ns, "-o",
                                "custom-columns=CLAIMS:.status.claims,SERVED:.status.servedBy,"
                                "NODES:.status.nodes", "--no-headers").stdout.split()
            return out if out == ["1", dra.SERVED_BY_DRA, node.node_name] else None

        await until(shown, what="the Instance showing 1 claim, served by DRA only, its node",
                    within=30)
        assert container_id(pod(plane, broker)) == container

        # The figure to compare with: a device-plugin Configuration's broker, same agent,
        # controller and node, timed the same way.
        fan = instance_name("plug", "fan", shared=False, node=node.node_name)
        classic = Broker(ns, fan, f"{fan}-{node.node_name}-pod", broker.agent_log)
        plugin_cfg = debug_echo_configuration("plug", descriptions=["fan"], shared=False,
                                              allocator="devicePlugin")
        plugin_cfg["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
        started = time.monotonic()
        h.apply(plane, ns, plugin_cfg)
        await running_container(plane, classic)
        print(f"figure: Configuration applied -> device-plugin broker Running on the real node "
              f"{time.monotonic() - started:.1f} s")
        assert allocates(node, classic) == 1
    finally:
        ctl.stop()
        node.stop_process(broker.agent_log)
        print(f"--- agent log ---\n{node.log_tail(broker.agent_log, 30)}")
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await h.delete_slices(kube, node.node_name)
        await h.delete_controller_slices(kube, ns)
        await kube.close()


def _device_health(plane: ControlPlane, ns: str, pod: str) -> dict[str, list[tuple[str, str]]]:
    """``claim:<name>`` → [(resourceID, health)] of the pod's one container, as the kubelet
    wrote its ``allocatedResourcesStatus``."""
    statuses = ((_phase(plane, ns, pod) or {}).get("status") or {}).get("containerStatuses")
    return {s["name"]: [(r["resourceID"], r["health"]) for r in s.get("resources") or []]
            for c in statuses or [] for s in c.get("allocatedResourcesStatus") or []}




async def test_a_claimed_devices_health_reaches_its_pod_through_the_real_kubelet(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    """KEP-4680 on the real kubelet (``ResourceHealthStatus``, beta and on in v1.37): it opens
    the agent's health stream because the plugin registered ``v1.DRAResourceHealth``, and
    writes the claimed device's health into the pod's ``allocatedResourcesStatus``. The
    device fails the way a user's does (debugEcho stops seeing it; a shared device stays,
    unhealthy, for its grace period): the pod shows it Unhealthy, then Healthy once it is back.
    The claim's prepare is timed on the agent's ``/metrics``. Not in the v1.35.4 run, whose
    kubelet has the gate off and never opens the stream."""
    ns = f"drh-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    agent_log = f"agent-{ns}"
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    lamp = instance_name("echo", "lamp", shared=True, node=node.node_name)
    port = free_port()
    kubelet_log = node.log_path("kubelet")
    kubelet_from = kubelet_log.stat().st_size
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, Broker(ns, lamp, "", agent_log), extra_env={
            "DRA": "on", "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"})
        async with h.device_classes(kube, ns):
            offline = tmp_path / "offline"  # debugEcho's availability file: what is gone
            cfg = debug_echo_configuration("echo", descriptions=["lamp"], shared=True,
                                           availability_file=offline, grace=600)
            h.apply(plane, ns, cfg)
            await until(lambda: REGISTERED in node.log_tail(agent_log, 1000),
                        what="the agent's DRA plugin registered with the kubelet", within=60)
            cel = f'device.attributes["{dra.DRIVER}"].description == "lamp"'
            h.apply(plane, ns, h.claim_template("lamp", dra.device_class_name(ns, "echo"), cel),
                    _pod("user", "lamp"))
            await until(lambda: _running(plane, ns, "user"),
                        what="pod user Running with its claim", within=120)
            found = _phase(plane, ns, "user") or {}
            (claim_status,) = found["status"]["resourceClaimStatuses"]
            claim = json.loads(plane.kubectl("get", "resourceclaim", claim_status[
                "resourceClaimName"], "-n", ns, "-o", "json").stdout)
            resource = cl.cdi_id(claim["metadata"]["uid"], 0)  # the kubelet's resourceID

            def shows(health: str) -> bool:
                return _device_health(plane, ns, "user") == {"claim:dev": [(resource, health)]}

            await until(lambda: shows("Healthy"), what="the pod showing its device Healthy",
                        within=60)
            assert "DRA health stream opened by the kubelet" in node.log_tail(agent_log, 1000)

            started = time.monotonic()
            offline.write_text("lamp\n")
            await until(lambda: shows("Unhealthy"), what="the pod showing its device Unhealthy",
                        within=60)
            print(f"figure: device gone -> pod status Unhealthy "
                  f"{time.monotonic() - started:.1f} s")
            statuses = (_phase(plane, ns, "user") or {})["status"]["containerStatuses"]
            (device,) = statuses[0]["allocatedResourcesStatus"][0]["resources"]
            assert device.get("message"), "the agent's reason (ResourceHealthStatusMessage)"
            print(f"the pod's device: {device}")
            started = time.monotonic()
            offline.write_text("")
            await until(lambda: shows("Healthy"), what="the pod showing its device Healthy "
                        "again", within=60)
            print(f"figure: device back -> pod status Healthy {time.monotonic() - started:.1f} s")

            seen = await asyncio.to_thread(scrape, port)
            name = "edgeplug_dra_prepare_duration_seconds"
            assert seen[f'{name}_count{{outcome="ok"}}'] == 1, "the one claim, prepared once"
            prepared = seen[f'{name}_sum{{outcome="ok"}}']
            assert 0 < prepared < 10
            print(f"figure: the claim's prepare (agent's /metrics) {prepared * 1000:.1f} ms")

            # The agent stops: its stream ends cleanly, the kubelet logs no error for it.
            node.stop_process(agent_log)

            def ended() -> str | None:
                with kubelet_log.open("rb") as log:
                    log.seek(kubelet_from)
                    text = log.read().decode(errors="replace")
                return text if "WatchResources health stream has ended" in text else None

            kubelet = await until(ended, what="the kubelet's health stream ended", within=30)
            assert "Successfully started WatchResources health stream" in kubelet
            (end,) = [line for line in kubelet.splitlines()
                      if "WatchResources health stream has ended" in line]
            assert "error=null" in end, end
            assert "Error receiving from WatchResources" not in kubelet
            assert "Unimplemented" not in kubelet
    finally:
        await _clean_up(plane, node, kube, ns, agent_log)


@pytest.mark.parametrize("agent_first", [False, True], ids=["kubelet-first", "agent-first"])
async def test_pods_holding_claims_run_again_after_the_node_reboots(
    plane: ControlPlane, node: RealNode, agent_first: bool,
) -> None:
    """The node reboots (``RealNode.reboot``: every process ends, ``/run`` emptied with the
    claims' CDI specs in ``/var/run/cdi``, the disk kept with the agent's prepared-claims
    record) while pods hold claims on a local device and on a shared one (two through claim
    templates, one Akri-style by resource name). The agent starts again, after the kubelet is
    Ready or before the kubelet starts: it writes the recorded specs again before its plugin
    registers, the kubelet has it prepare the claims again, and every pod runs again in a new
    container that got its device (its env, read from inside it). None failed, none is left
    in CreateContainerError, and the runtime never found a claim's CDI device missing. Last in
    this module: the node it leaves has rebooted."""
    ns = f"drr-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    agent_log = f"agent-{ns}"
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    lamp = instance_name("echo", "lamp", shared=False, node=node.node_name)
    devices = {"local": "lamp", "shared-1": "cam", "shared-2": "cam", "akri": "cam"}
    cdi_dir = node.host_path("/var/run/cdi")
    try:
        await wait_service_account(kube, ns)
        start_agent(node, plane, Broker(ns, lamp, "", agent_log), extra_env={"DRA": "on"})
        async with h.device_classes(kube, ns):
            cams = debug_echo_configuration("cams", descriptions=["cam"], shared=True,
                                            capacity=3)
            cams["spec"]["sharedDeviceAllocation"] = "dra"
            h.apply(plane, ns, debug_echo_configuration("echo", descriptions=["lamp"],
                                                        shared=False), cams)
            await until(lambda: REGISTERED in node.log_tail(agent_log, 1000),
                        what="the agent's DRA plugin registered with the kubelet", within=60)
            earlier = set(cdi_dir.glob("edgeplug.io_claim-*.json"))  # other tests' claims
            h.apply(plane, ns, h.claim_template("lamp", dra.device_class_name(ns, "echo")),
                    h.claim_template("cam", dra.device_class_name(ns, "cams")),
                    _pod("local", "lamp"), _pod("shared-1", "cam"), _pod("shared-2", "cam"),
                    _plugin_pod("akri", "edgeplug.io/cams"))
            first = {name: await _runs_with(plane, ns, name, device, None)
                     for name, device in devices.items()}
            specs = {p: p.read_text() for p in set(cdi_dir.glob("edgeplug.io_claim-*.json"))
                     - earlier}
            assert len(specs) == len(devices), "one CDI spec per claim"

            kubelet_log = node.log_path("kubelet")
            kubelet_from = kubelet_log.stat().st_size
            agent_log = f"{agent_log}-rebooted"

            def agent_again() -> None:
                assert not any(cdi_dir.iterdir()), "the reboot emptied /var/run/cdi"
                start_agent(node, plane, Broker(ns, lamp, "", agent_log),
                            extra_env={"DRA": "on"})

            started = time.monotonic()
            node.reboot(before_kubelet=agent_again if agent_first else None)
            ready = time.monotonic()
            if not agent_first:
                agent_again()
            for name, device in devices.items():
                await _runs_with(plane, ns, name, device, first[name])
            print(f"figure: node reboot ({'agent' if agent_first else 'kubelet'} first) -> "
                  f"{len(devices)} pods holding claims Running again "
                  f"{time.monotonic() - started:.1f} s (node start -> Ready "
                  f"{ready - started:.1f} s, Ready -> pods Running "
                  f"{time.monotonic() - ready:.1f} s)")
            assert {p: p.read_text() for p in specs} == specs, "the same specs written again"
            for name in devices:
                found = _phase(plane, ns, name) or {}
                assert found["status"]["phase"] == "Running", found["status"]
                waiting = [s["state"]["waiting"] for s in found["status"]["containerStatuses"]
                           if "waiting" in s["state"]]
                assert not waiting, f"{name}: {waiting}"
            with kubelet_log.open("rb") as log:
                log.seek(kubelet_from)
                assert b"unresolvable CDI devices" not in log.read()
            assert "claim spec written again" in node.log_tail(agent_log, 1000)
    finally:
        await _clean_up(plane, node, kube, ns, agent_log)


async def _runs_with(plane: ControlPlane, ns: str, pod: str, device: str,
                     replaced: str | None) -> str:
    """The pod's container once it runs, is not ``replaced`` and printed ``device``'s
    description in its env (what the claim's CDI spec gave it)."""

    def running() -> str | None:
        container = _running(plane, ns, pod)
        return container if container is not None and container != replaced else None

    container = await until(running, what=f"pod {pod} Running in a new container", within=180)
    out = await until(lambda: _logs(plane, ns, pod), what=f"{pod}'s env in its log")
    assert logged_env(out)["DEBUG_ECHO_DESCRIPTION"] == device, out
    return container


async def _clean_up(plane: ControlPlane, node: RealNode, kube: AsyncClient, ns: str,
                    agent_log: str) -> None:
    """The agent stopped (its log's end printed), the namespace and the slices deleted."""
    node.stop_process(agent_log)
    print(f"--- agent log ---\n{node.log_tail(agent_log, 40)}")
    plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    await h.delete_slices(kube, node.node_name)
    await h.delete_controller_slices(kube, ns)
    await kube.close()
