"""The agent SIGKILLed ten times, each time the moment the kubelet has admitted a pod.

Real parts: the kubelet's device manager (``DeviceNode``), the agent as ``python -m agent.main``
(killed with SIGKILL and started again, as a crashing DaemonSet pod), the controller as a
process. Each round a pod asks for a slot (the Instance's resource and the Configuration's in
turn); as soon as the kubelet has the agent's Allocate answer the agent is killed, while it is
recording the slot in ``deviceUsage`` (the Instance fast path answers first and records right
after; agent/deviceplugins/slots/rules.py). The restarted agent must record every slot a live pod
holds and give none of them to another pod; earlier rounds' pods are deleted meanwhile, so freeing
runs across restarts too. Every invariant holds throughout (tests/faults/invariants.py).

No pod is created while the agent is down: the kubelet itself fails a pod whose Allocate it
cannot make (its plugin gone: UnexpectedAdmissionError, kubernetes/kubernetes#119248), which
no plugin can prevent.
"""

from __future__ import annotations

import functools

import pytest
from lightkube import AsyncClient

from crds.naming import configuration_resource_name, instance_resource_name
from tests.faults.cluster import FaultCluster, FaultNode, delete_pod
from tests.harness.agent_nodes import pinned_pod
from tests.harness.kube_waits import WAIT_S, running, wait_pod

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

KILLS = 10
#: The broker, two live pods, and a slot or two still being freed after their pods went.
CAPACITY = 6
#: Rounds a pod lives before it is deleted (so some slots are freed across a restart).
KEEP_ROUNDS = 2
#: How long a restarted agent may take to serve every plugin again.
SERVING_S = 30.0



def admitted(node: FaultNode, namespace: str, pod: str) -> bool:
    """The kubelet has the Allocate answer for ``pod`` (its containers were created)."""
    return any(p["namespace"] == namespace and p["name"] == pod and p.get("admitted")
               for p in node.view.pods())


def serving(node: FaultNode, since: int, resources: tuple[str, ...]) -> bool:
    """Every plugin registered anew since ``since``, its stream held, its devices healthy."""
    return set(resources) <= {r.resource_name for r in node.kubelet.registrations[since:]} and all(
        node.kubelet.plugin_connected(r) and node.kubelet.healthy_device_ids(r)
        for r in resources)


async def serving_again(node: FaultNode, since: int, resources: tuple[str, ...]) -> None:
    """Wait until the restarted agent registered every plugin anew and the kubelet holds each
    one's stream, with devices it counts healthy.

    The kubelet's plugin server has a race of its own: when an old stream's end is handled
    after the restarted plugin registered, it disconnects the *new* client of that name
    (``runClient`` looks the client up by name; kubelet/cm/devicemanager/plugin/v1beta1) and
    marks the resource unhealthy. The agent registers such a plugin again by itself
    (agent/deviceplugins/kubelet/manager.py); no restart by hand is allowed here."""
    try:
        await node.kubelet.wait_for(functools.partial(serving, node, since, resources),
                                    timeout=SERVING_S, what="the restarted agent serving")
    except AssertionError as error:
        state = (f"registered anew "
                 f"{sorted({r.resource_name for r in node.kubelet.registrations[since:]})}, "
                 f"healthy {[node.kubelet.healthy_device_ids(r) for r in resources]}")
        raise AssertionError(f"{error}: {state}") from None


async def test_agent_sigkilled_ten_times_as_pods_are_admitted(
    load: str, cluster: FaultCluster, client: AsyncClient
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    node = await cluster.add_node()
    cluster.start_controller()
    expected = await cluster.one_shared_device(client, "kill", capacity=CAPACITY, brokers=True)
    [instance] = expected
    resources = (instance_resource_name(instance), configuration_resource_name("kill", None))
    await serving_again(node, 0, resources)
    ns = cluster.namespace

    async with cluster.recorder() as recorder:
        for round_ in range(KILLS):
            pod = f"pod-{round_}"
            await client.create(pinned_pod(
                ns, pod, resource=resources[round_ % 2], node=node.name, stop_at_once=True))
            await node.kubelet.wait_for(lambda pod=pod: admitted(node, ns, pod),  # type: ignore[misc]
                                        timeout=WAIT_S, what=f"{pod} admitted")
            since = len(node.kubelet.registrations)
            node.restart_agent()
            await wait_pod(client, ns, pod, running, "Running")
            if round_ >= KEEP_ROUNDS:
                await delete_pod(client, ns, f"pod-{round_ - KEEP_ROUNDS}")
            await serving_again(node, since, resources)
        await cluster.converged(client, expected, brokers=True)
    recorder.assert_clean()
