"""The agent's watches survive the API server going away and coming back.

lightkube retries a watch whose response fails, but a failure to *send* (connection refused
while the API server is down) escapes its generator and used to end the watch for good: the
agent then silently stopped seeing changes. This stops a real kube-apiserver under a running
watch, waits until the watch has hit the refused connection, and starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from agent.kube import watching
from tests.harness.agent_process import eventually
from tests.harness.controlplane import ControlPlane


@pytest.fixture
def own_control_plane() -> Iterator[ControlPlane]:
    """A control plane of this test's own: stopping the shared one would disturb others."""
    with ControlPlane(install_crds=False) as plane:
        yield plane


async def test_watch_reopens_after_the_api_server_was_down(
    own_control_plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=watching.__name__)
    client = AsyncClient(KubeConfig.from_file(str(own_control_plane.kubeconfig)))
    seen: set[str] = set()

    async def follow() -> None:
        async for _op, obj in watching.watch(
            client, ConfigMap, what="configmaps", namespace="default"
        ):
            seen.add(obj.metadata.name)

    def configmap(name: str) -> ConfigMap:
        return ConfigMap(metadata=ObjectMeta(name=name, namespace="default"))

    follower = asyncio.create_task(follow())
    try:
        await client.create(configmap("before"))

        async def saw_before() -> bool:
            return "before" in seen

        await eventually(saw_before, what="the watch to see ConfigMap 'before'")

        flags = await asyncio.to_thread(own_control_plane.stop_server, "kube-apiserver")

        async def hit_refused_connection() -> bool:
            assert not follower.done(), f"the watch ended: {follower.exception()!r}"
            return any("broke" in record.getMessage() for record in caplog.records)

        await eventually(hit_refused_connection, what="the watch to meet the stopped server")
        await asyncio.to_thread(own_control_plane.start_server, "kube-apiserver", flags)
        await client.create(configmap("after"))

        async def saw_after() -> bool:
            assert not follower.done(), f"the watch ended: {follower.exception()!r}"
            return "after" in seen

        await eventually(saw_after, what="the watch to see ConfigMap 'after' the restart")
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await client.close()
