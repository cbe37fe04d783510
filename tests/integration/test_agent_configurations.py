"""How the agent reacts to Configurations: bad details, properties from Secrets, node selectors.

Against the real control plane, with the agent's discovery side in-process.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from agent.discovery.events import (
    REASON_INVALID_DETAILS,
    REASON_PROPERTY_UNAVAILABLE,
    condition_type_for,
)
from crds.naming import instance_name
from discovery_handlers.contract import Secret
from tests.harness import agent_process as harness
from tests.harness.controlplane import ControlPlane


def _configuration(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    out = cp.kubectl("get", "configuration", name, "-n", namespace, "-o", "json").stdout
    obj: dict[str, Any] = json.loads(out)
    return obj


def _condition(cp: ControlPlane, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    status = _configuration(cp, namespace, name).get("status") or {}
    for condition in status.get("conditions") or []:
        if condition["type"] == kind:
            found: dict[str, Any] = condition
            return found
    return None


def _events(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cp.kubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector", f"involvedObject.name={name},involvedObject.kind=Configuration",
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _secret(name: str, **values: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


async def test_bad_details_reported_naming_the_field_while_others_work(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = harness.new_node(control_plane)
    bad = harness.debug_echo_configuration(
        "bad", descriptions=[], raw_details="descriptions: [a, a]\n"
    )
    good = harness.debug_echo_configuration("good", descriptions=["fine0"])
    # Every node finds the same fault, so it is reported in the one shared condition.
    details_condition = condition_type_for(REASON_INVALID_DETAILS, node)
    client = harness.api_client(control_plane)
    async with harness.agent_in_process(control_plane, node_name=node, namespace=namespace):
        harness.apply(control_plane, namespace, bad, good)

        async def reported() -> dict[str, Any] | None:
            condition = _condition(control_plane, namespace, "bad", details_condition)
            if condition is not None and condition["reason"] == REASON_INVALID_DETAILS:
                return condition
            return None

        condition = await harness.eventually(
            reported, what=f"condition {details_condition} InvalidDiscoveryDetails on bad"
        )
        assert condition["status"] == "False"
        assert "descriptions[1]" in condition["message"]

        async def warned() -> list[dict[str, Any]] | None:
            events = [e for e in _events(control_plane, namespace, "bad")
                      if e["reason"] == REASON_INVALID_DETAILS]
            return events or None

        events = await harness.eventually(warned, what="an InvalidDiscoveryDetails Event on bad")
        assert events[0]["type"] == "Warning"
        assert "descriptions[1]" in events[0]["message"]

        good_name = instance_name("good", "fine0", shared=True, node=node)

        async def good_published() -> bool:
            return good_name in await harness.instances(client, namespace)

        await harness.eventually(
            good_published, what=f"Instance {good_name} of the good Configuration"
        )

        # Fixing the details (a spec change) restarts the run, which publishes and clears it.
        fixed = harness.debug_echo_configuration("bad", descriptions=["a"])
        harness.apply(control_plane, namespace, fixed)

        async def cleared() -> bool:
            condition = _condition(control_plane, namespace, "bad", details_condition)
            return condition is not None and condition["status"] == "True"

        await harness.eventually(cleared, what="condition True after fixing the details")
        assert instance_name("bad", "a", shared=True, node=node) in await harness.instances(
            client, namespace
        )
    await client.close()


async def test_secret_backed_property_resolved_and_re_resolved(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = harness.new_node(control_plane)
    cfg = harness.debug_echo_configuration(
        "creds", descriptions=["dev0"],
        discovery_properties=[
            {"name": "USERNAME", "value": "admin"},
            {"name": "PASSWORD",
             "valueFrom": {"secretKeyRef": {"name": "cam-secret", "key": "password"}}},
            {"name": "EXTRA", "valueFrom": {"configMapKeyRef": {
                "name": "absent", "key": "x", "optional": True}}},
        ],
    )
    key = (namespace, "creds")
    async with harness.agent_in_process(
        control_plane, node_name=node, namespace=namespace
    ) as agent:
        harness.apply(control_plane, namespace, cfg)

        # The Secret does not exist yet: the run says which property it cannot resolve.
        async def unavailable() -> dict[str, Any] | None:
            condition = _condition(
                control_plane, namespace, "creds",
                condition_type_for(REASON_PROPERTY_UNAVAILABLE, node),
            )
            if condition is not None and condition["reason"] == REASON_PROPERTY_UNAVAILABLE:
                return condition
            return None

        condition = await harness.eventually(
            unavailable, what="DiscoveryPropertyUnavailable condition"
        )
        assert "PASSWORD" in condition["message"]
        assert "cam-secret does not exist" in condition["message"]

        harness.apply(control_plane, namespace, _secret("cam-secret", password="first-pw"))

        async def resolved(expected: str) -> bool:
            run = agent.watch.runs.get(key)
            # Secret-backed values reach the handler as bytes behind a redacting type.
            return run is not None and run.properties == {
                "USERNAME": "admin", "PASSWORD": Secret(expected.encode()),
            }

        await harness.eventually(
            lambda: resolved("first-pw"), what="PASSWORD resolved from the Secret"
        )
        harness.apply(control_plane, namespace, _secret("cam-secret", password="second-pw"))
        await harness.eventually(
            lambda: resolved("second-pw"), what="PASSWORD re-resolved on change"
        )

        # Secret values never reach the Configuration's status or Events.
        text = json.dumps(_configuration(control_plane, namespace, "creds"))
        text += json.dumps(_events(control_plane, namespace, "creds"))
        assert "first-pw" not in text
        assert "second-pw" not in text


async def test_node_selector_decides_where_discovery_runs(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = harness.new_node(control_plane, labels={"zone": "north"})
    north = harness.debug_echo_configuration(
        "north", descriptions=["n0"], shared=False,
        node_selector={"matchLabels": {"zone": "north"}},
    )
    south = harness.debug_echo_configuration(
        "south", descriptions=["s0"], shared=False,
        node_selector={"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["south"]}]},
    )
    client = harness.api_client(control_plane)
    north_name = instance_name("north", "n0", shared=False, node=node)
    south_name = instance_name("south", "s0", shared=False, node=node)
    async with harness.agent_in_process(
        control_plane, node_name=node, namespace=namespace
    ) as agent:
        harness.apply(control_plane, namespace, north, south)

        async def north_only() -> bool:
            return set(await harness.instances(client, namespace)) == {north_name}

        await harness.eventually(
            north_only, what=f"only {north_name} (south does not select the node)"
        )
        assert (namespace, "south") not in agent.watch.runs

        # Relabel the node: discovery moves from north to south.
        control_plane.kubectl("label", "node", node, "zone=south", "--overwrite")

        async def south_only() -> bool:
            return set(await harness.instances(client, namespace)) == {south_name}

        await harness.eventually(south_only, what=f"only {south_name} after relabelling the node")
    await client.close()
