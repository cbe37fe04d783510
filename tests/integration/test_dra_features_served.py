"""The DRA features a cluster serves are read from what its API server keeps, on every version.

Runs in the suite (the newest minor, where DRAExtendedResource and DRAConsumableCapacity are on)
and in the compatibility run (the oldest supported minor, where both gates are off and the API
server drops their fields on write). Each test first asks the API server itself, with a dry-run
create, whether it keeps the field; then checks that the product's report says the same: where
the field is kept, the written object carries it and nothing is reported; where it is dropped,
one WARNING names the feature gate and what the cluster loses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from agent.dra import slices
from agent.dra.publisher import ResourceSliceResource
from agent.kube.client import as_dict
from controller.dra.instance_classes import DeviceClassResource
from controller.dra.shared_pools import SharedPools
from crds import dra, dra_features, dra_slices
from crds.configuration import Allocator
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane


async def _kept_on_dry_run(kube: AsyncClient, resource: Any, body: dict[str, Any]
                           ) -> dict[str, Any]:
    """What the API server would store of ``body`` (a server-side apply, dry run)."""
    stored = await kube.patch(resource, body["metadata"]["name"], body,
                              patch_type=PatchType.APPLY, field_manager="test-probe",
                              dry_run=True)
    return as_dict(stored)


def _probe_slice(name: str, placement: dict[str, Any], device: dict[str, Any]
                 ) -> dict[str, Any]:
    """A slice of one device ``d0`` with ``device``'s fields, placed by ``placement``."""
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": dra.DRIVER, **placement,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "d0", **device}]}}


def _reports(caplog: pytest.LogCaptureFixture, feature: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and f"does not serve {feature}" in r.getMessage()]


async def test_the_controller_reports_extended_resource_mapping_as_the_api_server_serves_it(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = dra.device_class(namespace, "probe", extended_resource="edgeplug.io/probe")
    probe["metadata"]["name"] = f"probe-{namespace}.edgeplug.io"
    served = bool((await _kept_on_dry_run(kube, DeviceClassResource, probe))
                  ["spec"].get("extendedResourceName"))

    async with h.device_classes(kube, namespace, extended_resources=True):
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "cam", descriptions=["c0"], shared=False))
        body = await harness.eventually(lambda: h.device_class(kube, namespace, "cam"),
                                        what="the Configuration's DeviceClass")
        reported = _reports(caplog, dra_features.EXTENDED_RESOURCE)
        if served:
            assert body["spec"]["extendedResourceName"] == "edgeplug.io/cam"
            assert reported == []
        else:
            assert "extendedResourceName" not in body["spec"]
            assert len(reported) == 1
            assert "served by device plugins only" in reported[0]


async def test_the_agent_reports_consumable_capacity_as_the_api_server_serves_it(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = harness.new_node(control_plane)
    probe = _probe_slice(f"probe-{namespace}", {"allNodes": True}, {
        "allowMultipleAllocations": True, "capacity": {dra.CAPACITY_SLOTS: {"value": "2"}}})
    served = bool((await _kept_on_dry_run(kube, ResourceSliceResource, probe))
                  ["spec"]["devices"][0].get("allowMultipleAllocations"))

    pool = slices.local_pool(namespace, "pair", node)
    async with (h.ready_nodes(kube, [node]),
                h.dra_agents(control_plane, [node], namespace) as agents):
        harness.apply(control_plane, namespace, harness.debug_echo_configuration(
            "pair", descriptions=["p0"], shared=False, capacity=2, allocator="dra"))

        async def published() -> dict[str, Any] | None:
            devices = h.pool_devices(await h.pool_slices(kube, pool))
            return next(iter(devices.values()), None)

        device = await harness.eventually(published, what=f"the device of pool {pool}")
        publisher = agents[node].publisher

        async def answered() -> int | None:
            # The slice is visible once the API server stored it, a moment before the
            # agent's apply returns and it notes what the server dropped: wait for the answer.
            return publisher.writes or None

        await harness.eventually(answered, what="the agent's slice apply answered")
        reported = _reports(caplog, dra_features.CONSUMABLE_CAPACITY)
        missing = publisher.features.missing
        if served:
            assert device.get("allowMultipleAllocations") is True
            assert reported == []
            assert dra_features.CONSUMABLE_CAPACITY not in missing
        else:
            assert not device.get("allowMultipleAllocations")
            assert len(reported) == 1
            assert dra_features.CONSUMABLE_CAPACITY in missing


async def test_the_controller_pools_shared_devices_as_the_api_server_serves_it(
    namespace: str, kube: AsyncClient, caplog: pytest.LogCaptureFixture,
) -> None:
    """Where the API server keeps per-device node selection, shared devices share pools, each
    naming its own nodes; where it does not, each has a pool of its own, named in one WARNING."""
    probe = _probe_slice(f"probe-nodes-{namespace}", {"perDeviceNodeSelection": True},
                         {"nodeSelector": dra_slices.hostname_selector(["n1"])})
    try:
        served = bool((await _kept_on_dry_run(kube, ResourceSliceResource, probe))
                      ["spec"].get("perDeviceNodeSelection"))
    except ApiError as error:  # dropped, then refused: a slice must say where it is
        if error.status.code != 422:
            raise
        served = False
    cams = [f"cam-{i:06x}" for i in range(3)]
    pools = SharedPools(kube, namespaces=[namespace])
    pools.listed([{"metadata": {"name": cam, "namespace": namespace},
                   "spec": {"configurationName": "cam", "shared": True, "nodes": ["n1", "n2"],
                            "capacity": 2},
                   "status": {"unhealthy": {"n2": "gone"}}} for cam in cams])
    pools.set_mode((namespace, "cam"), Allocator.DRA)
    pools.modes_listed()
    pool_of = {cam: (slices.shared_pool if served else slices.single_device_pool)(
        namespace, "cam", cam) for cam in cams}
    task = asyncio.create_task(pools.run())
    try:
        async def published() -> bool:
            for cam, pool in pool_of.items():
                found = await h.pool_slices(kube, pool)
                if h.device_nodes(found, slices.device_name(cam)) != ["n1"]:
                    return False
            return True

        await harness.eventually(published, what=f"the shared devices in {set(pool_of.values())}")
        assert pools.per_device_nodes is served
        reported = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                    and dra_features.PARTITIONABLE_DEVICES in r.getMessage()]
        assert len(reported) == (0 if served else 1), reported
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await h.delete_controller_slices(kube, namespace)
