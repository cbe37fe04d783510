"""What a gone agent's node loses: its place in shared pools' selectors, and its local pools
(the rules the controller writes), and the names both sides agree on."""

from __future__ import annotations

from controller.dra.agent_gone_taints import local_pools, rule_body, rule_name
from controller.dra.agent_liveness import decode_lease, without_gone
from crds import agent_liveness, dra_slices, written_slices

DEVICE = {"name": "cams-0a0b0c", "attributes": {}}


def _plan(*nodes: str) -> dra_slices.PoolPlan:
    return dra_slices.PoolPlan(name="ns/cams/shared/cams-0a0b0c", nodes=nodes, devices=(DEVICE,))


def test_a_gone_node_leaves_the_selector_and_the_others_stay() -> None:
    assert without_gone(_plan("a", "b", "c"), frozenset({"b", "z"})).nodes == ("a", "c")
    same = _plan("a", "b")
    assert without_gone(same, frozenset({"z"})) is same
    assert without_gone(same, frozenset()) is same


def test_every_node_gone_keeps_the_selector_and_taints_the_device_noschedule() -> None:
    plan = without_gone(_plan("a", "b"), frozenset({"a", "b"}))
    assert plan.nodes == ("a", "b")
    assert plan.devices[0]["taints"] == [{"key": "edgeplug.io/agent-gone",
                                          "value": "every-node", "effect": "NoSchedule"}]
    unhealthy = {**DEVICE, "taints": [{"key": "edgeplug.io/unhealthy", "value": "x",
                                       "effect": "NoExecute"}]}
    both = without_gone(dra_slices.PoolPlan(name="p", nodes=("a",), devices=(unhealthy,)),
                        frozenset({"a"}))
    assert [t["key"] for t in both.devices[0]["taints"]] == [
        "edgeplug.io/unhealthy", "edgeplug.io/agent-gone"]
    assert "taints" not in DEVICE  # the plan kept is not changed
    assert written_slices.content_key(plan) != written_slices.content_key(_plan("a", "b"))


def test_lease_names_and_the_node_they_stand_for() -> None:
    assert agent_liveness.lease_name("node-1") == "edgeplug-agent-node-1"
    assert agent_liveness.node_of("edgeplug-agent-node-1") == "node-1"
    assert agent_liveness.node_of("edgeplug-agent-") is None
    assert agent_liveness.node_of("kopf-peering") is None
    assert agent_liveness.lease_name("n" * 239) is None
    record, version = decode_lease(
        b'{"metadata":{"name":"edgeplug-agent-n1","resourceVersion":"7"},'
        b'"spec":{"renewTime":"2026-01-01T00:00:00.000000Z","leaseDurationSeconds":6}}')
    assert version == "7"
    assert record is not None
    assert (record.node, record.duration_s) == ("n1", 6)
    assert decode_lease(b'{"metadata":{"name":"other"}}')[0] is None


def _slice(pool: str, node: str | None, driver: str = "edgeplug.io") -> dict[str, object]:
    spec: dict[str, object] = {"driver": driver, "pool": {"name": pool}}
    if node:
        spec["nodeName"] = node
    return {"spec": spec}


def test_only_the_nodes_own_local_pools_of_the_driver_are_tainted() -> None:
    found = local_pools("a", [
        _slice("ns/usb/node/a", "a"), _slice("ns/serial/node/a", "a"),
        _slice("ns/usb/node/b", "b"), _slice("ns/cams/shared/cams-1", None),
        _slice("gpu/node/a", "a", driver="gpu.example.com")])
    assert found == {"ns/usb/node/a", "ns/serial/node/a"}
    body = rule_body("v1", "a", "ns/usb/node/a")
    assert body["metadata"]["name"] == rule_name("ns/usb/node/a")
    assert body["metadata"]["labels"]["edgeplug.io/node"] == "a"
    assert body["spec"] == {
        "deviceSelector": {"driver": "edgeplug.io", "pool": "ns/usb/node/a"},
        "taint": {"key": "edgeplug.io/agent-gone", "value": "a", "effect": "NoSchedule"}}
    long_node = "n" * 100
    assert len(rule_body("v1", long_node, "p")["spec"]["taint"]["value"]) <= 63
