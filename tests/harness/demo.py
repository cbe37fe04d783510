"""``make demo``: edgeplug end to end on one machine, the scheduler giving pods shared devices.

It starts a real control plane (etcd, kube-apiserver, scheduler, controller-manager), an
emulated node (a kubelet stand-in speaking the kubelet's real DRA and plugin-registration gRPC
APIs, ``tests.harness.kubelet_dra``), the edgeplug agent in-process (``DRA=on``) and the
edgeplug controller as its own process (``--dra``). It applies ``crds/examples/debug-echo.yaml``
(with an availability file added to its details, so the demo can unplug a simulated device),
then shows: the Instances, the ResourceSlices the scheduler allocates from, the broker pods and
what each container got from its claim's CDI device, a pod of the user's own getting a device
through a ResourceClaim (the claim's ``status.devices``); then unplugs ``foo1`` and shows its
Instance and broker going away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.kube.client import as_dict
from agent.main import configure_logging, run_agent
from agent.settings import AgentSettings
from crds import dra
from crds.naming import instance_name
from tests.harness import cdi, hermetic
from tests.harness import dra as h
from tests.harness.agent_process import eventually, instances
from tests.harness.controller_process import FAST_ARGS, ControllerProcess, install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import NodeEmulator, PythonNodeEmulator

NODE_NAME = "demo-node"
NAMESPACE = "default"
CONFIGURATION = "debug-echo"
EXAMPLE = Path(__file__).resolve().parents[2] / "crds" / "examples" / "debug-echo.yaml"
DEVICES = ("foo0", "foo1")  # the example's descriptions
UNPLUGGED = "foo1"
USER_POD = "my-app"
DEMO_GRACE_S = 2  # offlineGracePeriodSeconds for the demo, so unplugging shows at once
READY_DEADLINE = 60.0  # seconds for each stage to show


def _configuration(availability_file: Path) -> dict[str, Any]:
    """The example, with an availability file (to unplug devices) and a short grace."""
    cfg: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    details = yaml.safe_load(cfg["spec"]["discoveryHandler"]["discoveryDetails"])
    details["availabilityFile"] = str(availability_file)
    cfg["spec"]["discoveryHandler"]["discoveryDetails"] = yaml.safe_dump(details)
    cfg["spec"]["offlineGracePeriodSeconds"] = DEMO_GRACE_S
    return cfg


def _user_objects() -> list[dict[str, Any]]:
    """A pod of the user's own asking the scheduler for foo0 through a ResourceClaimTemplate
    (its claim shares the device with foo0's broker: capacity 2)."""
    cel = f'device.attributes["{dra.DRIVER}"].description == "foo0"'
    template = h.claim_template("a-debug-echo", dra.device_class_name(NAMESPACE, CONFIGURATION),
                                cel)
    pod = h.claim_pod(USER_POD, "a-debug-echo")
    pod["spec"]["containers"][0].update(name="app", command=["sh", "-c", "env; sleep 3600"])
    return [template, pod]


def _show(plane: ControlPlane, *args: str) -> None:
    print(f"\n$ kubectl {' '.join(args)}")
    print(plane.kubectl(*args).stdout, end="")


async def _crds_served(client: AsyncClient) -> bool:
    """Whether the API server serves Instances yet (a new CRD's storage answers 429 while it
    initializes, which the agent would log as a warning)."""
    try:
        await instances(client, NAMESPACE)
    except ApiError as error:
        if error.status.code == 429:
            return False
        raise
    return True


async def _running(client: AsyncClient) -> dict[str, Pod]:
    pods = [p async for p in client.list(Pod, namespace=NAMESPACE)]
    return {p.metadata.name: p for p in pods if p.metadata is not None and p.metadata.name
            and p.status is not None and p.status.phase == "Running"}


async def _claim(client: AsyncClient, pod: str) -> dict[str, Any]:
    body = as_dict(await client.get(Pod, pod, namespace=NAMESPACE))
    status = body.get("status") or {}
    statuses = status.get("resourceClaimStatuses") or []
    name = (statuses[0]["resourceClaimName"] if statuses
            else status["extendedResourceClaimStatus"]["resourceClaimName"])
    return as_dict(await client.get(h.ResourceClaimResource, name, namespace=NAMESPACE))


def _show_env(emulator: NodeEmulator, pod: Pod) -> None:
    assert pod.metadata is not None
    assert pod.metadata.name
    assert pod.spec is not None
    for container in pod.spec.containers:
        env = emulator.claim_env(NAMESPACE, pod.metadata.name, container.name)
        shown = {k: v for k, v in sorted(env.items()) if k.startswith("DEBUG_ECHO")}
        print(f"  {pod.metadata.name}/{container.name}: {shown}")


async def _demo(plane: ControlPlane, workdir: Path) -> None:
    availability = workdir / "offline-devices"
    availability.write_text("")
    cdi_dir = workdir / "cdi"
    registry = workdir / "plugins_registry"
    emulator = PythonNodeEmulator(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                            plugin_dir=workdir / "device-plugins", cdi_spec_dirs=[cdi_dir],
                            dra_registry_dir=registry)
    emulator.plugin_dir.mkdir()
    client = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    settings = AgentSettings(node_name=NODE_NAME, kubeconfig=plane.kubeconfig,
                             plugin_dir=emulator.plugin_dir, pod_resources_socket=None,
                             serve_device_plugins=False, serve_dra=True, cdi_spec_dir=cdi_dir,
                             dra_plugins_dir=workdir / "plugins", dra_registry_dir=registry)
    await eventually(lambda: _crds_served(client), what="the edgeplug CRDs served",
                     deadline=READY_DEADLINE)
    controller = ControllerProcess(plane, namespaces=[NAMESPACE], extra_args=(*FAST_ARGS, "--dra"),
                                   log_path=workdir / "controller.log").start()
    await emulator.start()
    hermetic.refuse_host_paths(settings, what="the demo's agent")
    agent = asyncio.create_task(run_agent(settings))
    try:
        print(f"$ kubectl apply -f {EXAMPLE.relative_to(EXAMPLE.parents[2])}"
              f"   # plus availabilityFile and offlineGracePeriodSeconds: {DEMO_GRACE_S}")
        print(plane.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                            stdin=yaml.safe_dump(_configuration(availability))).stdout, end="")

        async def brokers_running() -> dict[str, Pod] | None:
            running = await _running(client)
            return running if len(running) == len(DEVICES) else None

        brokers = await eventually(brokers_running, what="a Running broker pod per device",
                                   deadline=READY_DEADLINE)

        async def status_counts_them() -> bool:
            cfg = plane.get_json(f"/apis/edgeplug.io/v1alpha1/namespaces/{NAMESPACE}"
                                 f"/configurations/{CONFIGURATION}") or {}
            status: dict[str, Any] = cfg.get("status") or {}  # type: ignore[assignment]
            return (status.get("brokers") or {}).get("ready") == len(DEVICES)

        await eventually(status_counts_them, what="the Configuration's status to count them",
                         deadline=READY_DEADLINE)
        _show(plane, "get", "configurations", "-n", NAMESPACE, "-o", "wide")
        _show(plane, "get", "instances", "-n", NAMESPACE, "-o", "wide")
        _show(plane, "get", "resourceslices")
        _show(plane, "get", "pods", "-n", NAMESPACE, "-o", "wide")
        print("\nwhat each broker's container got from its claim's CDI device "
              "(DEBUG_ECHO_* variables):")
        for pod in brokers.values():
            _show_env(emulator, pod)

        print("\n# a pod of your own asking the scheduler for foo0 through a ResourceClaimTemplate")
        manifest = yaml.safe_dump_all(_user_objects(), sort_keys=False)
        print(f"$ kubectl apply -f - <<EOF\n{manifest}EOF")
        print(plane.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest).stdout, end="")

        async def user_running() -> Pod | None:
            return (await _running(client)).get(USER_POD)

        mine = await eventually(user_running, what=f"pod {USER_POD} Running",
                                deadline=READY_DEADLINE)

        async def claim_shows_devices() -> dict[str, Any] | None:
            claim = await _claim(client, USER_POD)
            return claim if (claim.get("status") or {}).get("devices") else None

        claim = await eventually(claim_shows_devices, what="the claim's status.devices",
                                 deadline=READY_DEADLINE)
        _show(plane, "get", "resourceclaims", "-n", NAMESPACE)
        name = claim["metadata"]["name"]
        print(f"\n$ kubectl get resourceclaim {name} -n {NAMESPACE} -o yaml   # status.devices")
        print(yaml.safe_dump({"devices": claim["status"]["devices"]}, sort_keys=False), end="")
        print(f"\nwhat {USER_POD}'s container got from its claim's CDI device:")
        _show_env(emulator, mine)

        print(f"\n# unplugging {UNPLUGGED} (shared device: its Instance goes after the "
              f"{DEMO_GRACE_S} s grace, and the controller removes its broker)")
        availability.write_text(f"{UNPLUGGED}\n")
        gone = instance_name(CONFIGURATION, UNPLUGGED, shared=True, node=NODE_NAME)

        async def unplugged() -> bool:
            if gone in await instances(client, NAMESPACE):
                return False
            return len(await _running(client)) == len(DEVICES)  # foo0's broker and my-app

        await eventually(unplugged, what=f"{gone} and its broker gone",
                         deadline=READY_DEADLINE)
        _show(plane, "get", "instances", "-n", NAMESPACE)
        _show(plane, "get", "pods", "-n", NAMESPACE)
    finally:
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        controller.stop()
        await emulator.stop(delete_node=True)
        await client.close()


def main() -> int:
    configure_logging(logging.WARNING)
    # The emulated kubelet warns when plugins go away, which they do at the end of the demo.
    logging.getLogger("tests.harness").setLevel(logging.ERROR)
    # An unplugged device is reported unhealthy for its grace: what the demo shows next.
    logging.getLogger("agent.discovery.device_health").setLevel(logging.ERROR)
    started = time.monotonic()
    cdi.tool()  # built once (tests.harness.cdi); `make demo` builds it before this starts
    workdir = Path(tempfile.mkdtemp(prefix="ep-demo-", dir="/tmp"))
    try:
        print("starting a control plane (etcd, kube-apiserver, scheduler, controller-manager)")
        with ControlPlane() as plane:
            install_peering_crds(plane)
            asyncio.run(_demo(plane, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ndemo done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
