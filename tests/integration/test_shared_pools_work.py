"""The controller's shared pools work only where a pool's input changed: on the real API server,
the controller's own status writes (``servedBy``, ``claims``) and an unrelated change of an
Instance (an annotation) rewrite no slice and run no pass; a health verdict does both, for its
own pool only. The Instances are written as the agent writes them (spec by apply, verdicts on
the status subresource); the controller's class keeper and pools run in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from lightkube import AsyncClient

from controller.dra.device_classes import DeviceClasses
from crds import dra_slices
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane

DEADLINE_S = 30.0


def _instance(namespace: str, name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"configurationName": "cam", "cdiName": f"edgeplug.io/cam={name[-6:]}",
                     "capacity": 2, "brokerProperties": {}, "shared": True, "nodes": [node]}}


def _patch_status(cp: ControlPlane, namespace: str, name: str, status: dict[str, Any]) -> None:
    cp.kubectl("patch", "instances.edgeplug.io", name, "-n", namespace, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": status}))


@contextlib.asynccontextmanager
async def _controller(kube: AsyncClient, namespace: str) -> AsyncIterator[DeviceClasses]:
    classes = DeviceClasses(kube, namespaces=[namespace])
    task = asyncio.create_task(classes.run())
    try:
        yield classes
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await h.delete_controller_slices(kube, namespace)


async def test_writes_no_pool_is_built_from_cost_no_pass_and_no_slice_write(
    control_plane: ControlPlane, namespace: str, kube: AsyncClient
) -> None:
    node = harness.new_node(control_plane)
    harness.apply(control_plane, namespace, harness.debug_echo_configuration(
        "cam", descriptions=["unused"], capacity=2, allocator="dra"))
    quiet, moving = "cam-00000a", "cam-00000b"
    for name in (quiet, moving):
        harness.apply(control_plane, namespace, _instance(namespace, name, node))
        _patch_status(control_plane, namespace, name, {"reported": {node: True}})
    pool_of = {n: dra_slices.shared_pool(namespace, "cam", n) for n in (quiet, moving)}
    async with _controller(kube, namespace) as classes:
        pools = classes.pools

        async def published() -> dict[str, dict[str, Any]] | None:
            found = {n: await h.pool_slices(kube, p) for n, p in pool_of.items()}
            if not all(len(s) == 1 for s in found.values()) or not pools.idle:
                return None
            return {n: s[0] for n, s in found.items()}

        first = await harness.eventually(published, what="both pools published, no pass due",
                                         deadline=DEADLINE_S)
        examined, writes = pools.examined, pools.writes
        # What the controller's own status writer writes, and a change no pool is built from.
        _patch_status(control_plane, namespace, quiet, {"servedBy": "dra", "claims": 1})
        control_plane.kubectl("annotate", "instances.edgeplug.io", quiet, "-n", namespace,
                              "example.com/note=unrelated")
        # A verdict after them on the same watch: once its pool is rewritten, they were seen.
        _patch_status(control_plane, namespace, moving, {"unhealthy": {node: "no answer"}})

        async def tainted() -> dict[str, dict[str, Any]] | None:
            found = await published()
            if found is None or "taints" not in found[moving]["spec"]["devices"][0]:
                return None
            return found

        after = await harness.eventually(tainted, what=f"{moving}'s pool tainted",
                                         deadline=DEADLINE_S)
        assert after[quiet]["metadata"]["resourceVersion"] == \
            first[quiet]["metadata"]["resourceVersion"]
        assert after[moving]["spec"]["pool"]["generation"] == \
            first[moving]["spec"]["pool"]["generation"] + 1
        assert pools.writes == writes + 1  # the tainted pool's apply, nothing else
        assert pools.examined == examined + 1  # the verdict's pool alone, in one pass or more
