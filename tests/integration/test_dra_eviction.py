"""A device that stays unhealthy moves its pods, on the real control plane: the
agent taints it ``NoExecute`` after its Configuration's ``spec.unhealthyDevices`` grace, the
kube-controller-manager's device taint eviction controller deletes the pod holding it, the
Deployment's ReplicaSet makes another and the scheduler gives that one the healthy device.
A pod whose claim tolerates the taint stays; a Configuration without the field keeps its pod
(``NoSchedule`` only).

The nodes have no kubelet (``tests.harness.dra``): a pod is judged by its claim's allocation,
which is the device its container would get.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.dra import slices
from agent.kube.client import as_dict
from crds import dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness import echo_handlers
from tests.harness.controlplane import ControlPlane

SCHEDULE_DEADLINE = 60.0
GRACE_S = 2


def _deployment(name: str, template: str) -> dict[str, Any]:
    pod = h.claim_pod(name, template)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}},
    }


async def _the_pod(kube: AsyncClient, ns: str, app: str) -> tuple[str, str, str] | None:
    """(pod name, uid, device its claim was allocated) of the app's one live pod, once bound."""
    live = [as_dict(p) async for p in kube.list(Pod, namespace=ns, labels={"app": app})]
    live = [p for p in live if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 1:
        return None
    name = live[0]["metadata"]["name"]
    got = await h.pod_claim(kube, ns, name)
    if got is None:
        return None
    return name, live[0]["metadata"]["uid"], str(got.results[0]["device"])


async def _taints(kube: AsyncClient, pool: str, device: str) -> list[tuple[str, str]] | None:
    devices = h.pool_devices(await h.pool_slices(kube, pool))
    if device not in devices:
        return None
    return [(t["key"], t["effect"]) for t in devices[device].get("taints") or []]


async def _tainted(kube: AsyncClient, pool: str, device: str, effect: str) -> bool:
    return await _taints(kube, pool, device) == [("edgeplug.io/unhealthy", effect)]


async def _plain_pod_bound_s(cp: ControlPlane, kube: AsyncClient, ns: str) -> float:
    """The floor: a pod without a claim, created → bound."""
    pod = h.claim_pod("plain", "")
    del pod["spec"]["resourceClaims"]
    del pod["spec"]["containers"][0]["resources"]
    started = time.monotonic()
    h.apply(cp, ns, pod)

    async def bound() -> bool:
        return bool(as_dict(await kube.get(Pod, "plain", namespace=ns))["spec"].get("nodeName"))

    await harness.eventually(bound, what="plain pod bound", deadline=SCHEDULE_DEADLINE)
    return time.monotonic() - started


async def test_a_device_unhealthy_past_its_grace_moves_its_pod_and_without_the_field_it_stays(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    ns = pod_namespace
    node = harness.new_node(control_plane)
    move_state, keep_state = tmp_path / "move.json", tmp_path / "keep.json"
    echo_handlers.write_state(move_state, {})
    echo_handlers.write_state(keep_state, {})
    handler = echo_handlers.install()
    move = h.extended_echo_configuration("move", ["m1", "m2", "m3"], move_state)
    move["spec"]["unhealthyDevices"] = {"evictAfterSeconds": GRACE_S}
    keep = h.extended_echo_configuration("keep", ["k1", "k2"], keep_state)
    move_pool = slices.local_pool(ns, "move", node)
    keep_pool = slices.local_pool(ns, "keep", node)
    names = {instance_name(cfg, d, shared=False, node=node): d
             for cfg, ds in (("move", ("m1", "m2", "m3")), ("keep", ("k1", "k2"))) for d in ds}
    try:
        async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                    h.dra_agents(control_plane, [node], ns)):
            harness.apply(control_plane, ns, move, keep)
            await harness.eventually(lambda: _published(kube, move_pool, keep_pool),
                                     what="both pools published")
            # A pod that must stay tolerates the taint in its claim.
            stay = h.claim_template("stay", dra.device_class_name(ns, "move"))
            stay["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
                {"key": "edgeplug.io/unhealthy", "operator": "Exists", "effect": "NoExecute"}]
            h.apply(control_plane, ns,
                    h.claim_template("move", dra.device_class_name(ns, "move")), stay,
                    h.claim_template("keep", dra.device_class_name(ns, "keep")),
                    _deployment("mover", "move"), _deployment("stayer", "stay"),
                    _deployment("keeper", "keep"))
            mover = await harness.eventually(lambda: _the_pod(kube, ns, "mover"),
                                             what="mover bound", deadline=SCHEDULE_DEADLINE)
            stayer = await harness.eventually(lambda: _the_pod(kube, ns, "stayer"),
                                              what="stayer bound", deadline=SCHEDULE_DEADLINE)
            keeper = await harness.eventually(lambda: _the_pod(kube, ns, "keeper"),
                                              what="keeper bound", deadline=SCHEDULE_DEADLINE)

            # The three pods' devices fail at once.
            failed_at = time.monotonic()
            echo_handlers.write_state(move_state, {names[d]: {
                "healthy": False, "reason": "fault 0x80"} for d in (mover[2], stayer[2])})
            echo_handlers.write_state(keep_state, {names[keeper[2]]: {
                "healthy": False, "reason": "fault 0x80"}})
            await harness.eventually(
                lambda: _tainted(kube, keep_pool, keeper[2], "NoSchedule"),
                what="keeper's device tainted NoSchedule")

            async def replaced() -> tuple[str, str, str] | None:
                now = await _the_pod(kube, ns, "mover")
                return now if now is not None and now[1] != mover[1] else None

            moved = await harness.eventually(replaced, what="mover replaced on the other device",
                                             deadline=SCHEDULE_DEADLINE)
            replaced_s = time.monotonic() - failed_at
            assert moved[2] != mover[2], "the replacement got the failed device again"
            assert await _taints(kube, move_pool, mover[2]) == [
                ("edgeplug.io/unhealthy", "NoExecute")]
            assert replaced_s >= GRACE_S, "evicted before the Configuration's grace"
            # The pod tolerating the taint stayed, on its tainted device (the same slice write
            # tainted both); so did the Configuration's without the field.
            assert await _tainted(kube, move_pool, stayer[2], "NoExecute")
            assert await _the_pod(kube, ns, "stayer") == stayer
            assert await _the_pod(kube, ns, "keeper") == keeper
            assert await _taints(kube, keep_pool, keeper[2]) == [
                ("edgeplug.io/unhealthy", "NoSchedule")]

            # Recovery takes the taint away.
            echo_handlers.write_state(move_state, {})

            async def untainted() -> bool:
                return await _taints(kube, move_pool, mover[2]) == []

            await harness.eventually(untainted, what="the recovered device untainted")
            floor_s = await _plain_pod_bound_s(control_plane, kube, ns)
            print(f"\ndevice unhealthy → replacement bound: {replaced_s:.2f} s "
                  f"(grace {GRACE_S} s, so {replaced_s - GRACE_S:.2f} s after it); "
                  f"a plain pod created → bound: {floor_s:.2f} s")
    finally:
        handler.release()


async def _published(kube: AsyncClient, move_pool: str, keep_pool: str) -> bool:
    counts = [len(h.pool_devices(await h.pool_slices(kube, p))) for p in (move_pool, keep_pool)]
    return counts == [3, 2]


async def test_a_shared_camera_that_goes_moves_its_pod_to_the_other_camera(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """The issue's camera: a shared device that vanishes is kept, unhealthy, for its
    ``offlineGracePeriodSeconds``; unhealthy on every node past the eviction grace, the
    controller taints its pool ``NoExecute`` and the pod moves to the other camera."""
    ns = pod_namespace
    node = harness.new_node(control_plane)
    offline = tmp_path / "offline"  # debugEcho's availability file: what is gone
    cfg = harness.debug_echo_configuration("cams", descriptions=["c1", "c2"], shared=True,
                                           availability_file=offline, grace=300,
                                           allocator="dra")
    cfg["spec"]["unhealthyDevices"] = {"evictAfterSeconds": 1}
    cams = {instance_name("cams", d, shared=True, node=node): d for d in ("c1", "c2")}
    by_device = {slices.device_name(i): i for i in cams}
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, cfg)

        async def both_offered() -> bool:
            pools = [h.pool_devices(await h.pool_slices(
                kube, slices.shared_pool(ns, "cams", i))) for i in cams]
            return all(len(p) == 1 for p in pools)

        await harness.eventually(both_offered, what="both cameras' pools published")
        h.apply(control_plane, ns, h.claim_template("cam", dra.device_class_name(ns, "cams")),
                _deployment("viewer", "cam"))
        viewer = await harness.eventually(lambda: _the_pod(kube, ns, "viewer"),
                                          what="viewer bound", deadline=SCHEDULE_DEADLINE)
        held = by_device[viewer[2]]
        gone_at = time.monotonic()
        offline.write_text(f"{cams[held]}\n")

        async def replaced() -> tuple[str, str, str] | None:
            now = await _the_pod(kube, ns, "viewer")
            return now if now is not None and now[1] != viewer[1] else None

        moved = await harness.eventually(replaced, what="viewer replaced on the other camera",
                                         deadline=SCHEDULE_DEADLINE)
        print(f"\nshared camera gone → replacement bound: {time.monotonic() - gone_at:.2f} s "
              "(grace 1 s)")
        assert moved[2] != viewer[2]
        assert await _tainted(kube, slices.shared_pool(ns, "cams", held), viewer[2],
                              "NoExecute")
        # Back: the taint goes.
        offline.write_text("")

        async def untainted() -> bool:
            return await _taints(kube, slices.shared_pool(ns, "cams", held), viewer[2]) == []

        await harness.eventually(untainted, what="the camera back, untainted")
