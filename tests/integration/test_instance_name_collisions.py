"""Two devices of one Configuration whose Akri names are alike both get an Instance.

Against the real control plane; agents' discovery sides run in-process on emulated node names.
The debugEcho devices ``d2318`` and ``d2629`` of Configuration ``cams`` share Akri's 3-byte name
``cams-6db282`` (where Akri, and edgeplug before ``spec.deviceDigest``, published one and
dropped the other without a word). Both are published, under names that survive an agent
restart and that every node agrees on, and the collision is said: a Warning Event on the
Configuration and the ``edgeplug_instance_name_collisions`` gauge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Event

from agent.discovery.instance_placement import REASON_NAME_COLLISION
from agent.kube.node_instances import LABEL_VALUE, serves_label
from crds.naming import collision_instance_name, device_digest, instance_name
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import WaitTimedOut, until, wait_until

CFG = "cams"
#: The two devices and their one Akri name; d2629's device digest is the smaller.
D2318, D2629 = "d2318", "d2629"
AKRI = "cams-6db282"
GRACE = 1  # seconds: offlineGracePeriodSeconds where a shared device must go


def _digest(device: str) -> str:
    return device_digest(device, shared=True, node="")


def _collision_name(device: str) -> str:
    return collision_instance_name(CFG, _digest(device))


async def _collision_events(client: AsyncClient, namespace: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace=namespace)
            if e.reason == REASON_NAME_COLLISION and e.involvedObject.name == CFG]


async def _published(client: AsyncClient, namespace: str,
                     expected: dict[str, tuple[str, list[str]]]) -> dict[str, dict[str, Any]]:
    """Wait until this Configuration's Instances are exactly ``expected`` (name → (device,
    sorted nodes)); return them."""
    seen: dict[str, dict[str, Any]] = {}

    def shown(found: dict[str, dict[str, Any]]) -> dict[str, tuple[str, list[str]]]:
        return {n: (i["spec"]["brokerProperties"].get("DEBUG_ECHO_DESCRIPTION"),
                    sorted(i["spec"].get("nodes") or [])) for n, i in found.items()}

    async def there() -> bool:
        try:
            found = await harness.instances(client, namespace)
        except ApiError:  # a control plane just started answers 429 for a moment
            return False
        seen.clear()
        seen.update(found)
        return shown(found) == expected

    try:
        await wait_until(there, what=f"Instances {expected}")
    except WaitTimedOut as timeout:
        raise AssertionError(f"{timeout}; the last list: {shown(seen)}") from timeout
    return dict(seen)


def _gauge(agent: harness.InProcessAgent, namespace: str, node: str) -> float | None:
    return agent.metrics.registry.get_sample_value(
        "edgeplug_instance_name_collisions",
        {"namespace": namespace, "configuration": CFG, "node": node})


async def _gauge_is_one(agent: harness.InProcessAgent, namespace: str, node: str) -> None:
    """Wait until ``node``'s agent counts one device served under another name than its Akri
    name (set at the end of each pass, so its first pass is over)."""
    await until(lambda: _gauge(agent, namespace, node) == 1,
                what=f"edgeplug_instance_name_collisions 1 on {node}")


async def test_two_devices_of_one_akri_name_both_get_instances_kept_across_a_restart(
        control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    node = harness.new_node(cp)
    assert instance_name(CFG, D2318, shared=True, node=node) == AKRI
    assert instance_name(CFG, D2629, shared=True, node=node) == AKRI
    other = _collision_name(D2318)
    expected = {AKRI: (D2629, [node]), other: (D2318, [node])}
    client = harness.api_client(cp)
    try:
        async with harness.agent_in_process(cp, node_name=node, namespace=namespace) as agent:
            harness.apply(cp, namespace, harness.debug_echo_configuration(
                CFG, descriptions=[D2318, D2629], capacity=2))
            found = await _published(client, namespace, expected)
            await _gauge_is_one(agent, namespace, node)
            events = await _collision_events(client, namespace)
        # A user's view: both Instances, each its own device, CDI name and slots.
        listed = json.loads(cp.kubectl("get", "instances", "-n", namespace, "-o", "json").stdout)
        assert sorted(i["metadata"]["name"] for i in listed["items"]) == sorted([AKRI, other])
        shown = cp.kubectl("get", "instances", "-n", namespace).stdout
        assert AKRI in shown, shown
        assert other in shown, shown
        for name, device in ((AKRI, D2629), (other, D2318)):
            spec = found[name]["spec"]
            assert spec["deviceDigest"] == _digest(device)
            assert spec["brokerProperties"] == {"DEBUG_ECHO_DESCRIPTION": device}
            assert sorted(spec["deviceUsage"]) == [f"{name}-0", f"{name}-1"]
        assert found[AKRI]["spec"]["cdiName"] == f"edgeplug.io/{CFG}=6db282"
        assert found[other]["spec"]["cdiName"] == f"edgeplug.io/{CFG}={_digest(D2318)}"
        # Said once, naming both devices (by digest, not id) and both names.
        [event] = events
        assert event.type == "Warning"
        assert event.reportingInstance == node
        for part in (_digest(D2318), _digest(D2629), AKRI, other):
            assert part in (event.message or ""), event.message
        assert D2318 not in (event.message or "")
        uids = {n: i["metadata"]["uid"] for n, i in found.items()}

        # The agent restarts: both names and uids stay, and nothing is said again.
        async with harness.agent_in_process(cp, node_name=node, namespace=namespace) as agent:
            await _gauge_is_one(agent, namespace, node)
            again = await _published(client, namespace, expected)
            assert {n: i["metadata"]["uid"] for n, i in again.items()} == uids
            assert {name for _ns, name in agent.devices.snapshot()} == {AKRI, other}
            assert len(await _collision_events(client, namespace)) == 1
    finally:
        await client.close()


async def test_nodes_with_different_views_agree_through_the_api_server(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    """Node A sees only d2318 first and its create wins the Akri name for it (alone, d2629's
    smaller digest would have taken it). Node B, seeing both, and A, once d2629 appears too,
    read that from the API server and agree: d2318 keeps the Akri name, d2629 takes its
    collision name (said by the node that placed it). Once d2318 is gone everywhere (its
    Instance too), a third node that sees d2629 joins the Instance the others publish it
    under rather than creating a second one under the free Akri name."""
    cp = control_plane
    node_a, node_b, node_c = (harness.new_node(cp) for _ in range(3))
    offline = tmp_path / "offline"
    offline.write_text(f"{D2629}\n")
    other = _collision_name(D2629)
    client = harness.api_client(cp)
    try:
        harness.apply(cp, namespace, harness.debug_echo_configuration(
            CFG, descriptions=[D2318, D2629], availability_file=offline, grace=GRACE))
        async with harness.agent_in_process(cp, node_name=node_a, namespace=namespace) as a:
            await _published(client, namespace, {AKRI: (D2318, [node_a])})
            async with harness.agent_in_process(cp, node_name=node_b,
                                                namespace=namespace) as b:
                offline.write_text("")
                both = sorted([node_a, node_b])
                found = await _published(client, namespace,
                                         {AKRI: (D2318, both), other: (D2629, both)})
                await _gauge_is_one(a, namespace, node_a)
                await _gauge_is_one(b, namespace, node_b)
                assert found[AKRI]["spec"]["deviceDigest"] == _digest(D2318)
                assert found[other]["spec"]["deviceDigest"] == _digest(D2629)
                # Said by the node that placed d2629 first (a node joining the Instance another
                # made under the collision name says nothing more).
                events = await _collision_events(client, namespace)
                assert events
                for event in events:
                    assert event.reportingInstance in both
                    for part in (_digest(D2318), _digest(D2629), AKRI, other):
                        assert part in (event.message or ""), event.message
                uid = found[other]["metadata"]["uid"]

                # d2318 goes: its Instance goes after the grace.
                offline.write_text(f"{D2318}\n")
                await _published(client, namespace, {other: (D2629, both)})
                async with harness.agent_in_process(cp, node_name=node_c,
                                                    namespace=namespace) as c:
                    everyone = sorted([node_a, node_b, node_c])
                    again = await _published(client, namespace, {other: (D2629, everyone)})
                    assert again[other]["metadata"]["uid"] == uid
                    await _gauge_is_one(c, namespace, node_c)
                    assert AKRI not in await harness.instances(client, namespace)
    finally:
        await client.close()


async def test_an_instance_written_before_records_keeps_its_device_after_an_upgrade(
        control_plane: ControlPlane, namespace: str) -> None:
    """An install older than ``spec.deviceDigest`` published d2318 under the Akri name (the
    device its agent wrote last) and dropped d2629. The upgraded agent adopts that Instance for
    d2318, whose properties it carries (by digest alone d2629 would take the name), records
    it, and publishes d2629 under its collision name: same uid, no device swapped under a
    served Instance."""
    cp = control_plane
    node = harness.new_node(cp)
    harness.apply(cp, namespace, harness.debug_echo_configuration(
        CFG, descriptions=[D2318, D2629]))
    uid = cp.kubectl("get", "configurations.edgeplug.io", CFG, "-n", namespace,
                     "-o", "jsonpath={.metadata.uid}").stdout.strip()
    harness.apply(cp, namespace, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": AKRI, "labels": {serves_label(node): LABEL_VALUE},
                     "ownerReferences": [{
                         "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
                         "name": CFG, "uid": uid, "controller": True,
                         "blockOwnerDeletion": True}]},
        "spec": {"configurationName": CFG, "cdiName": f"edgeplug.io/{CFG}=6db282",
                 "capacity": 1, "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": D2318},
                 "shared": True, "nodes": [node], "deviceUsage": {f"{AKRI}-0": ""}}})
    client = harness.api_client(cp)
    try:
        before = (await harness.instances(client, namespace))[AKRI]["metadata"]["uid"]
        other = _collision_name(D2629)
        async with harness.agent_in_process(cp, node_name=node, namespace=namespace) as agent:
            found = await _published(client, namespace,
                                     {AKRI: (D2318, [node]), other: (D2629, [node])})
            await _gauge_is_one(agent, namespace, node)
        assert found[AKRI]["metadata"]["uid"] == before
        # Recorded by the apply that kept it, before d2629 was placed.
        assert found[AKRI]["spec"]["deviceDigest"] == _digest(D2318)
        assert found[other]["spec"]["deviceDigest"] == _digest(D2629)
    finally:
        await client.close()
