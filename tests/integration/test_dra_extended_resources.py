"""Unchanged pods asking for an extended resource, served through DRA by the real scheduler
(DRAExtendedResource, beta and on by default in v1.36): the controller's DeviceClass maps the
Configuration's configuration-level resource (``--dra-extended-resources``), and every class
offers ``deviceclass.resource.kubernetes.io/<class>``. The nodes run no device plugin, so only
DRA can serve them; the scheduler makes the pod's claim itself."""

from __future__ import annotations

from lightkube import AsyncClient

from agent.dra import slices
from crds import dra
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane

SCHEDULE_DEADLINE = 60.0


async def test_extended_resource_pods_get_devices_through_dra(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient
) -> None:
    ns = pod_namespace
    node = harness.new_node(control_plane)
    pool = slices.local_pool(ns, "ext", node)
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns, extended_resources=True),
                h.dra_agents(control_plane, [node], ns)):
        harness.apply(control_plane, ns, harness.debug_echo_configuration(
            "ext", descriptions=["x0", "x1"], shared=False))

        async def published() -> bool:
            return len(h.pool_devices(await h.pool_slices(kube, pool))) == 2

        await harness.eventually(published, what=f"two devices in {pool}")
        body = await harness.eventually(lambda: h.device_class(kube, ns, "ext"), what="class")
        assert body["spec"]["extendedResourceName"] == "edgeplug.io/ext"

        implicit = f"{dra.IMPLICIT_EXTENDED_RESOURCE_PREFIX}{dra.device_class_name(ns, 'ext')}"
        h.apply(control_plane, ns, h.extended_resource_pod("by-name", "edgeplug.io/ext"))
        first = await harness.eventually(lambda: h.pod_claim(kube, ns, "by-name"),
                                         what="pod by-name bound through DRA",
                                         deadline=SCHEDULE_DEADLINE)
        h.apply(control_plane, ns, h.extended_resource_pod("by-class", implicit))
        second = await harness.eventually(lambda: h.pod_claim(kube, ns, "by-class"),
                                          what="pod by-class bound through DRA",
                                          deadline=SCHEDULE_DEADLINE)
        got = sorted(r["device"] for c in (first, second) for r in c.results)
        assert got == sorted(h.pool_devices(await h.pool_slices(kube, pool)))
        assert {r["pool"] for c in (first, second) for r in c.results} == {pool}

        h.apply(control_plane, ns, h.extended_resource_pod("one-too-many", "edgeplug.io/ext"))
        await harness.eventually(lambda: h.unschedulable(kube, ns, "one-too-many"),
                                 what="the third pod unschedulable: two devices, both taken",
                                 deadline=SCHEDULE_DEADLINE)


async def test_the_class_follows_the_configurations_resource_name(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient
) -> None:
    cfg = harness.debug_echo_configuration("npu", descriptions=["c0"], shared=False)
    async with h.device_classes(kube, namespace, extended_resources=True):
        harness.apply(control_plane, namespace, cfg)

        async def extended(name: str) -> bool:
            body = await h.device_class(kube, namespace, "npu")
            return body is not None and body["spec"].get("extendedResourceName") == name

        await harness.eventually(lambda: extended("edgeplug.io/npu"), what="edgeplug.io/npu")
        cfg["spec"]["resourceName"] = "huawei.com/Ascend910"
        harness.apply(control_plane, namespace, cfg)
        await harness.eventually(lambda: extended("huawei.com/Ascend910"),
                                 what="the class mapping huawei.com/Ascend910")
