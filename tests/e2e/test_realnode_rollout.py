"""On a real node: an upgrade from the previous release, one component at a time, while pods
hold a local and a shared device, disturbs nothing that runs.

The previous release's agent and controller (tests/harness/previous_release.py) serve a node
of the real kubelet, containerd and runc with DRA on: a shared debugEcho camera (capacity 3,
the controller's pool) with a broker, and a Configuration of two local debugEcho lamps
(capacity 2). Plain pods ask ``edgeplug.io/lamps: 1`` and ``edgeplug.io/cams: 1``: the camera
through DRA, the lamps through the previous agent's device plugin, which offered them in its
pool as well. Then each component is replaced by this tree's, in the two orders
docs/operations.md discusses: controller first, or agents first. The agent is replaced as a
DaemonSet rollout with ``maxSurge: 0`` does it: the old process gets SIGTERM and ends before
the new one starts. After each step, with the two versions side by side and again at the end,
the test checks what docs/slots.md promises across versions:

* every running pod keeps its uid, container, restart count and the device env its container
  printed;
* every claim keeps its uid, allocation, reservation and CDI spec on the node;
* every Instance keeps its uid, and no broker is recreated;
* a new pod asking a local or a shared device is served;
* a claim prepared by the other version is unprepared when its pod goes (its spec removed, its
  slot serving a new pod);
* no device is in two pools, in more claims than its capacity or in more containers than its
  capacity;
* once this release's agent runs, no device is offered both by a device plugin and by a pool,
  and none by a device plugin under this release's controller.

A last test shows why the DaemonSet never surges: a second agent started beside the first
takes its DRA plugin sockets, and the first one's exit removes them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.dra.plugin import registration_socket
from agent.settings import DEFAULT_DRA_REGISTRY_DIR
from crds import dra
from crds.naming import instance_name
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.kube_waits import until
from tests.harness.previous_release import Release, previous_release
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    END_MARK,
    ENV_MARK,
    Broker,
    broker_spec,
    logged_env,
    node,
    plane,
    start_agent,
)
from tests.harness.realnode_images import BUSYBOX_IMAGE

__all__ = ["node", "plane"]  # the module fixtures

pytestmark = pytest.mark.timeout(1500)
REGISTERED = "DRA plugin registered with the kubelet"
CAMERA_CAPACITY, LAMP_CAPACITY = 3, 2


@pytest.fixture(scope="module")
def previous() -> Release:
    return previous_release()


def _pod(name: str, resource: str) -> dict[str, Any]:
    script = f"echo {ENV_MARK}; env | sort; echo {END_MARK}; exec sleep 3600"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "resources": {"limits": {resource: "1"}}}],
        },
    }


class Site:
    """One namespace on the node: the agent and controller of either release, and what runs."""

    def __init__(self, plane: ControlPlane, node: RealNode, tmp_path: Path,
                 previous: Release) -> None:
        self.plane, self.node, self.tmp_path, self.previous = plane, node, tmp_path, previous
        self.ns = f"roll-{uuid.uuid4().hex[:6]}"
        self.camera = instance_name("cams", "cam", shared=True, node=node.node_name)
        self.broker = f"{self.camera}-{node.node_name}-pod"
        self.agent_log = ""
        self.agent_source = previous.root
        self.agents = 0
        self.controller: ControllerProcess | None = None
        self.controller_source = previous.root
        self.controllers = 0

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.plane.kubectl(*args, "-o", "json").stdout)

    def start_agent(self, source: Path) -> None:
        self.agent_source = source
        self.agents += 1
        self.agent_log = f"agent-{self.ns}-{self.agents}"
        start_agent(self.node, self.plane, Broker(self.ns, self.camera, self.broker,
                                                  self.agent_log),
                    extra_env={"DRA": "on"}, source=source)

    def stop_agent(self) -> None:
        self.node.stop_process(self.agent_log)

    def agent_alive(self) -> bool:
        """The agent process runs (a zombie, ended but not reaped, does not)."""
        stat = Path(f"/proc/{self.node.pid(self.agent_log)}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def registered(self) -> bool:
        return REGISTERED in self.node.log_tail(self.agent_log, 100_000)

    def start_controller(self, source: Path) -> None:
        self.controller_source = source
        self.controllers += 1
        self.controller = ControllerProcess(
            self.plane, namespaces=[self.ns], source=source,
            log_path=self.tmp_path / f"ctl-{self.controllers}.log",
            extra_args=(*FAST_ARGS, "--dra")).start()

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.controller.stop()

    def allocators(self) -> dict[str, str | None]:
        """Configuration -> the allocator its status names (``sharedDeviceAllocation`` in the
        previous release, ``allocator`` beside it since)."""
        found = {}
        for c in self.kubectl_json("get", "configurations", "-n", self.ns)["items"]:
            status = c.get("status") or {}
            found[c["metadata"]["name"]] = (status.get("allocator")
                                            or status.get("sharedDeviceAllocation"))
        return found

    # -- what runs ------------------------------------------------------------------------

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p
                for p in self.kubectl_json("get", "pods", "-n", self.ns)["items"]}

    def running(self, name: str) -> dict[str, Any] | None:
        found = self.pods().get(name) or {}
        status = found.get("status") or {}
        assert status.get("phase") != "Failed", f"{name} refused: {status.get('reason')}"
        containers = status.get("containerStatuses") or []
        return found if containers and all(c.get("ready") for c in containers) else None

    def env(self, name: str) -> dict[str, str] | None:
        out = self.plane.kubectl("logs", "-n", self.ns, name, check=False).stdout
        return logged_env(out) if END_MARK in out else None

    async def serve(self, name: str, resource: str) -> None:
        """A new pod asking ``resource`` runs with a device of it."""
        h.apply(self.plane, self.ns, _pod(name, resource))
        await until(lambda: self.running(name), what=f"pod {name} Running", within=120)
        env = await until(lambda: self.env(name), what=f"{name}'s env in its log")
        assert "DEBUG_ECHO_DESCRIPTION" in env, f"{name} got no device: {env}"

    def claims(self) -> dict[str, dict[str, Any]]:
        return {c["metadata"]["name"]: c
                for c in self.kubectl_json("get", "resourceclaims", "-n", self.ns)["items"]}

    def claim_specs(self) -> set[str]:
        return {p.name for p in self.node.host_path("/var/run/cdi").glob("edgeplug.io_claim-*")}

    def snapshot(self) -> dict[str, Any]:
        """What a user would check did not change: per running pod its uid, container, restart
        count and logged env; per claim of a running pod its uid, allocation and reservation;
        per Instance its uid. Pods still waiting for a device are left out."""
        pods, held = {}, set()
        for name, found in self.pods().items():
            status = found["status"]
            if not status.get("containerStatuses"):
                continue
            (container,) = status["containerStatuses"]
            pods[name] = (found["metadata"]["uid"], container["containerID"],
                          container["restartCount"], self.env(name))
            held.add((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
        # Per claim: its uid, allocation, reservation, and whether its CDI spec (which the
        # runtime read when the container was made, and reads again at a restart) is there.
        specs = self.claim_specs()
        claims = {name: (c["metadata"]["uid"], c["status"]["allocation"]["devices"],
                         c["status"].get("reservedFor"),
                         f"{dra.DRIVER}_claim-{c['metadata']['uid']}.json" in specs)
                  for name, c in self.claims().items() if name in held}
        instances = {i["metadata"]["name"]: i["metadata"]["uid"]
                     for i in self.kubectl_json("get", "instances", "-n", self.ns)["items"]}
        return {"pods": pods, "claims": claims, "instances": instances}

    def no_slot_twice(self, snapshot: dict[str, Any]) -> None:
        """No device in more containers than its capacity, judged by the device env each
        running container printed, and none in two pools or in more claims than its
        capacity."""
        capacity = {"cam": CAMERA_CAPACITY, "lamp": LAMP_CAPACITY, "fan": LAMP_CAPACITY}
        held: dict[str, list[str]] = {}
        for name, (_, _, _, env) in snapshot["pods"].items():
            held.setdefault((env or {}).get("DEBUG_ECHO_DESCRIPTION", ""), []).append(name)
        over = {d: pods for d, pods in held.items() if len(pods) > capacity.get(d, 0)}
        assert not over, f"devices in more containers than their capacity: {over}"
        pools: dict[str, set[str]] = {}
        for found in self.kubectl_json("get", "resourceslices")["items"]:
            spec = found["spec"]
            if spec["driver"] == dra.DRIVER and spec["pool"]["name"].startswith(f"{self.ns}/"):
                for device in spec.get("devices") or []:
                    pools.setdefault(device["name"], set()).add(spec["pool"]["name"])
        twice = {d: p for d, p in pools.items() if len(p) > 1}
        assert not twice, f"devices in two pools: {twice}"
        claims: dict[str, int] = {}
        for claim in self.claims().values():
            for result in claim["status"]["allocation"]["devices"]["results"]:
                claims[result["device"]] = claims.get(result["device"], 0) + 1
        limit = {d: CAMERA_CAPACITY if d == self.camera else LAMP_CAPACITY for d in claims}
        assert all(claims[d] <= limit[d] for d in claims), f"claims per device: {claims}"

    def offered_twice(self) -> set[str]:
        """Devices in a pool of this namespace that a device plugin also advertises (by the
        Instance's resource or its Configuration's)."""
        advertised = self.plugins_advertised()
        twice = set()
        for found in self.kubectl_json("get", "resourceslices")["items"]:
            spec = found["spec"]
            pool = spec["pool"]["name"]
            if spec["driver"] != dra.DRIVER or not pool.startswith(f"{self.ns}/"):
                continue
            configuration = pool.split("/")[1]
            for device in spec.get("devices") or []:
                if {f"edgeplug.io/{device['name']}", f"edgeplug.io/{configuration}"} & set(
                        advertised):
                    twice.add(device["name"])
        return twice

    def plugins_advertised(self) -> dict[str, str]:
        """The node's allocatable ``edgeplug.io/`` resources a device plugin offers now (a
        withdrawn plugin's resource stays listed at 0 for a while)."""
        allocatable = self.kubectl_json("get", "node", self.node.node_name)["status"].get(
            "allocatable", {})
        return {r: n for r, n in allocatable.items() if r.startswith("edgeplug.io/") and n != "0"}


@pytest.fixture
def site(plane: ControlPlane, node: RealNode, tmp_path: Path, previous: Release
         ) -> Iterator[Site]:
    here = Site(plane, node, tmp_path, previous)
    plane.kubectl("create", "namespace", here.ns)
    try:
        yield here
    finally:
        # Pods go while an agent runs, so the kubelet unprepares their claims through it.
        plane.kubectl("delete", "namespace", here.ns, "--timeout=90s", check=False)
        here.stop_controller()
        here.stop_agent()
        print(f"--- agent log ---\n{node.log_tail(here.agent_log, 30)}")
        if here.controller is not None:
            print(f"--- controller log ---\n{here.controller.log_tail(20)}")


async def _deploy(site: Site) -> None:
    """The previous release running with a broker and two pods holding devices."""
    site.start_agent(site.previous.root)
    site.start_controller(site.previous.root)
    cams = debug_echo_configuration("cams", descriptions=["cam"], shared=True,
                                    capacity=CAMERA_CAPACITY)
    cams["spec"]["brokerSpec"] = {"brokerPodSpec": broker_spec("true")}
    lamps = debug_echo_configuration("lamps", descriptions=["lamp", "fan"], shared=False,
                                     capacity=LAMP_CAPACITY)
    h.apply(site.plane, site.ns, cams, lamps)
    await until(lambda: site.allocators() == {"cams": "dra", "lamps": "dra"},
                what="both Configurations given to the scheduler", within=60)
    await until(lambda: site.running(site.broker), what="the broker Running", within=120)
    await site.serve("local-1", "edgeplug.io/lamps")
    await site.serve("shared-1", "edgeplug.io/cams")
    site.no_slot_twice(site.snapshot())


async def _roll_agent(site: Site, source: Path) -> float:
    """Replace the agent as a ``maxSurge: 0`` DaemonSet rollout does; the seconds the node had
    no DRA plugin (old process told to stop -> new one registered)."""
    stopped = time.monotonic()
    site.stop_agent()
    site.start_agent(source)
    await until(site.registered, what="the new agent's DRA plugin registered", within=60)
    return time.monotonic() - stopped


def _roll_controller(site: Site, source: Path) -> None:
    site.stop_controller()
    site.start_controller(source)


async def _holds(site: Site, before: dict[str, Any], step: str, serial: int) -> dict[str, Any]:
    """After ``step``: nothing that ran changed, a new pod is served, a claim the other
    version prepared is unprepared; the next snapshot."""
    after = site.snapshot()
    disturbed = [name for name, seen in before["pods"].items() if after["pods"].get(name) != seen]
    print(f"figure: {step}: pods disturbed {len(disturbed)} of {len(before['pods'])}")
    ran = {part: {k: v for k, v in after[part].items() if k in before[part]}
           for part in ("pods", "claims")}
    assert (ran["pods"], ran["claims"], after["instances"]) == (
        before["pods"], before["claims"], before["instances"]), (
        f"{step} changed what runs: {before} -> {after}")
    missing = [name for name, claim in after["claims"].items() if not claim[-1]]
    assert not missing, f"claims of running pods without their CDI spec: {missing}"
    site.no_slot_twice(after)
    new_agent, new_controller = (site.agent_source == REPO_ROOT,
                                 site.controller_source == REPO_ROOT)
    if new_agent:
        # This release's agent offers a device one way only: the previous one offered its
        # local devices through device plugins and its pool. Under the previous controller
        # they stay on the device plugins (it maps their resources to no DeviceClass), under
        # this one they go to the scheduler; the kubelet reports the Node's allocatable on its
        # own period.
        await until(lambda: not site.offered_twice(), within=60,
                    what="no device offered by a device plugin and by a pool")
        if new_controller:
            await until(lambda: not site.plugins_advertised(), within=60,
                        what="no device offered by a device plugin under this controller")
    await site.serve(f"local-{serial}", "edgeplug.io/lamps")
    # The oldest shared pod's claim was prepared by the agent before this step: its pod goes,
    # the claim's spec goes, and its slot serves a new pod.
    oldest = min(n for n in site.pods() if n.startswith("shared-"))
    claim = site.pods()[oldest]["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    specs = site.claim_specs()
    site.plane.kubectl("delete", "pod", oldest, "-n", site.ns)
    await until(lambda: claim not in site.claims() and len(site.claim_specs()) < len(specs),
                what=f"{oldest}'s claim unprepared and deleted", within=90)
    await site.serve(f"shared-{serial}", "edgeplug.io/cams")
    snapshot = site.snapshot()
    site.no_slot_twice(snapshot)
    return snapshot


STEPS: dict[str, tuple[str, str]] = {
    "agents-first": ("agent", "controller"),
    "controller-first": ("controller", "agent"),
}


@pytest.mark.parametrize("order", list(STEPS))
async def test_an_upgrade_from_the_previous_release_disturbs_nothing_that_runs(
    site: Site, order: str,
) -> None:
    started = time.monotonic()
    await _deploy(site)
    print(f"figure: previous release deployed, 3 pods Running {time.monotonic() - started:.1f} s"
          f" ({site.previous.commit[:12]})")
    before = site.snapshot()
    steps: dict[str, Callable[[], Any]] = {
        "agent": lambda: _roll_agent(site, REPO_ROOT),
        "controller": lambda: _roll_controller(site, REPO_ROOT),
    }
    for serial, component in enumerate(STEPS[order], start=2):
        outcome = steps[component]()
        if component == "agent":
            away = await outcome
            print(f"figure: {order}: agent away {away:.1f} s (SIGTERM -> new DRA plugin "
                  "registered)")
        before = await _holds(site, before, f"{order}, {component} replaced", serial)
    print(f"figure: {order}: whole upgrade test {time.monotonic() - started:.1f} s")


async def test_a_surge_would_leave_the_node_without_its_dra_plugin(site: Site) -> None:
    """Why the DaemonSet never surges: a second agent on the node takes the first one's DRA
    plugin sockets (their names are fixed), and the first one's exit then removes them while
    the second runs, so the kubelet can prepare no claim there until that agent restarts."""
    registration = site.node.host_path(str(registration_socket(DEFAULT_DRA_REGISTRY_DIR)))
    site.start_agent(REPO_ROOT)
    await until(site.registered, what="the first agent's DRA plugin registered", within=60)
    first = site.agent_log
    site.start_agent(REPO_ROOT)  # the surge: a new pod beside the old one
    await until(site.registered, what="the second agent's DRA plugin registered", within=60)
    second = site.agent_log
    site.agent_log = first
    site.stop_agent()  # the old pod ends
    site.agent_log = second
    assert site.agent_alive(), "the second agent runs on"
    assert not registration.exists(), "the first agent's exit removed the second's socket"
