"""Waits on the real API server: poll a condition with a deadline, fail saying what was expected.

The device-plugin, slot-demand and node-emulator tests all wait for the same
things (a node's allocatable count, a pod's state, the namespace's default ServiceAccount);
one implementation of each keeps their deadlines and failure messages alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount

#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
WAIT_S = 60.0
#: Pause between two looks at the condition.
POLL_S = 0.1
#: Pause between two looks in a node stand-in's ``wait_for`` (it reads local state only).
NODE_POLL_S = 0.05

T = TypeVar("T")


class WaitTimedOut(AssertionError, TimeoutError):
    """A wait ran past its deadline: a test failure (AssertionError) that harness code waiting
    on a node (``DeviceNode.wait_for``) may also catch as the TimeoutError it promises."""


async def _poll(
    look: Callable[[], Awaitable[T | None]], *, what: str, within: float, poll: float
) -> T:
    """The one poll every wait here runs: ``look`` until it returns something truthy, and
    return that; WaitTimedOut naming ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = await look()
        if result:
            return result
        if loop.time() > deadline:
            raise WaitTimedOut(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(poll)


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, what: str, within: float = WAIT_S
) -> None:
    """Return once ``check`` is true; fail naming ``what`` after ``within`` seconds."""
    await _poll(check, what=what, within=within, poll=POLL_S)


async def wait_service_account(kube: AsyncClient, namespace: str) -> None:
    """Wait until the controller-manager gave ``namespace`` its default ServiceAccount."""

    async def has_account() -> bool:
        try:
            await kube.get(ServiceAccount, "default", namespace=namespace)
        except ApiError:
            return False
        return True

    await wait_until(has_account, what=f"ServiceAccount default in {namespace}")


async def allocatable(kube: AsyncClient, node: str, resource: str) -> str | None:
    """The node's allocatable count of ``resource`` as the API server reports it.

    None while the Node has no status yet (its kubelet has not posted one).
    """
    obj = await kube.get(Node, node)
    if obj.status is None:
        return None
    return (obj.status.allocatable or {}).get(resource)


async def wait_allocatable(kube: AsyncClient, node: str, resource: str, value: str) -> None:
    """Wait until the node reports ``value`` allocatable ``resource``."""

    async def check() -> bool:
        return await allocatable(kube, node, resource) == value

    await wait_until(check, what=f"node {node} allocatable {resource}={value}")


async def wait_pod(
    kube: AsyncClient,
    namespace: str,
    name: str,
    check: Callable[[Pod], bool],
    what: str,
    *,
    within: float = WAIT_S,
) -> Pod:
    """The pod once ``check`` holds for it; the failure shows its last status."""
    seen: list[Pod] = []

    async def probe() -> bool:
        pod = await kube.get(Pod, name, namespace=namespace)
        seen[:] = [pod]
        return check(pod)

    try:
        await wait_until(probe, what=f"pod {namespace}/{name} {what}", within=within)
    except AssertionError:
        raise AssertionError(
            f"pod {namespace}/{name} never {what}; last status {seen[0].status if seen else None}"
        ) from None
    return seen[0]


def running(pod: Pod) -> bool:
    """The pod's phase is Running."""
    return in_phase(pod, "Running")


def in_phase(pod: Pod, phase: str) -> bool:
    """The pod's phase is ``phase``."""
    return pod.status is not None and pod.status.phase == phase


def unschedulable(pod: Pod) -> bool:
    """The scheduler marked the pod Unschedulable."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in conditions
    )


async def until(
    check: Callable[[], T | None], *, what: str, within: float = WAIT_S, poll: float = POLL_S
) -> T:
    """Poll a synchronous ``check`` until it returns something truthy, and return that; fail
    naming ``what`` after ``within`` seconds."""

    async def look() -> T | None:
        return check()

    return await _poll(look, what=what, within=within, poll=poll)


class NodeWaits:
    """``wait_for`` of both kubelet stand-ins (``NodeEmulator`` and ``DeviceNode``), so a test
    waits on either the same way and the failure names the node."""

    node_name: str

    async def wait_for(
        self, predicate: Callable[[], bool], *,
        timeout: float,  # noqa: ASYNC109 - the harness API every test shares
        what: str,
    ) -> None:
        """Wait until ``predicate()`` is true; TimeoutError naming ``what`` after ``timeout``."""
        await until(predicate, what=f"node {self.node_name}: {what}", within=timeout,
                    poll=NODE_POLL_S)
