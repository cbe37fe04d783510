"""What DRA publishes, over tables: a node's pools, the controller's shared pools, attributes,
limits, health."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from agent.dra import slices
from agent.settings import AgentSettings
from cli import discover
from crds import dra, dra_slices, written_slices
from crds.instance import Instance, InstanceSpec
from discovery_handlers.contract import Device


def instance(name: str, *, nodes: tuple[str, ...] = ("n1",), shared: bool = False,
             capacity: int = 1, props: Mapping[str, str] | None = None,
             unhealthy: Mapping[str, str] | None = None, namespace: str = "ns",
             held: int = 0) -> Instance:
    usage = {f"{name}-{i}": ("n9" if i < held else "") for i in range(capacity)}
    return Instance(
        name=name, namespace=namespace,
        spec=InstanceSpec(configuration_name="cam", capacity=capacity, shared=shared,
                          nodes=nodes, broker_properties=dict(props or {}),
                          device_usage=usage),
        unhealthy=dict(unhealthy or {}),
    )


@pytest.mark.parametrize(("prop", "attr"), [
    ("ONVIF_DEVICE_IP_ADDRESS", "onvif_device_ip_address"),
    ("opcua-url.x", "opcua_url_x"),
    ("1WIRE", "_1wire"),
])
def test_attribute_names(prop: str, attr: str) -> None:
    assert dra.attribute_name(prop) == attr


def test_attributes_alias_identity_and_left_out() -> None:
    attrs = slices.attributes(instance("cam-1a2b3c", props={
        "ONVIF_DEVICE_IP_ADDRESS": "10.0.0.7",
        "A_PROPERTY_NAME_THAT_IS_FAR_TOO_LONG_FOR_DRA": "x",
        "LONG_VALUE": "v" * 65,
        "OK": "fine",
    }))
    assert attrs.values == {
        "namespace": "ns", "configuration": "cam", "instance": "cam-1a2b3c",
        "ip": "10.0.0.7", "onvif_device_ip_address": "10.0.0.7", "ok": "fine",
    }
    assert attrs.left_out == ("A_PROPERTY_NAME_THAT_IS_FAR_TOO_LONG_FOR_DRA", "LONG_VALUE")


def test_attributes_stop_at_the_api_limit_with_room_for_capacity() -> None:
    props = {f"P{i:02d}": str(i) for i in range(40)}
    attrs = slices.attributes(instance("x-000000", props=props), reserved=1)
    assert len(attrs.values) == dra.MAX_ATTRIBUTES_AND_CAPACITIES - 1
    assert len(attrs.left_out) == 40 - (dra.MAX_ATTRIBUTES_AND_CAPACITIES - 1 - 3)


def test_local_devices_one_pool_per_configuration_bound_to_the_node() -> None:
    plan = slices.plan_node("n1", [
        instance("cam-000001"), instance("cam-000002"),
        instance("cam-000003", nodes=("n2",)),  # another node's
        instance("cam-000004", unhealthy={"n1": "fault 0x80"}),
    ])
    assert list(plan.pools) == ["ns/cam/node/n1"]
    pool = plan.pools["ns/cam/node/n1"]
    assert pool.node_name == "n1"
    assert [d["name"] for d in pool.devices] == ["cam-000001", "cam-000002", "cam-000004"]
    assert "allowMultipleAllocations" not in pool.devices[0]
    assert "taints" not in pool.devices[0]
    # Present but unhealthy: still published, tainted with the reason.
    assert pool.devices[2]["taints"] == [
        {"key": "edgeplug.io/unhealthy", "value": "fault-0x80", "effect": "NoSchedule"}]
    assert plan.tainted == {"cam-000004": "fault 0x80"}


def test_shared_device_one_pool_selecting_the_nodes_known_healthy() -> None:
    shared = instance("cam-abcdef", nodes=("n2", "n1", "n3"), shared=True, capacity=2,
                      unhealthy={"n3": "not seen"})
    for node in ("n1", "n2", "n3"):  # no agent publishes it: the controller does
        assert slices.plan_node(node, [shared]).pools == {}
    pool = dra_slices.shared_plan(shared)
    assert pool is not None
    assert pool.nodes == ("n1", "n2"), "n3 unhealthy"
    (device,) = pool.devices
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"][dra.CAPACITY_SLOTS]["value"] == "2"
    assert device["capacity"][dra.CAPACITY_SLOTS]["requestPolicy"]["default"] == "1"
    assert "taints" not in device
    (body,) = dra_slices.slice_bodies(pool, generation=3,
                                      publisher=dra_slices.CONTROLLER_PUBLISHER)
    assert body["spec"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1", "n2"]}]}]}
    assert body["spec"]["pool"] == {"name": "ns/cam/shared/cam-abcdef", "generation": 3,
                                    "resourceSliceCount": 1}
    assert body["metadata"]["labels"] == {
        dra_slices.LABEL_POOL: dra_slices.pool_label("ns/cam/shared/cam-abcdef"),
        dra.LABEL_MANAGED_BY: "edgeplug-controller"}
    assert "nodeName" not in body["spec"]


def test_shared_device_held_until_a_node_is_listed() -> None:
    """No node listed (an agent marks an unhealthy device before it lists its node): no pool;
    a node listed is its verdict."""
    fresh = instance("cam-abcdef", nodes=(), shared=True)
    assert dra_slices.shared_plan(fresh) is None
    one = dra_slices.shared_plan(instance("cam-abcdef", nodes=("n2",), shared=True))
    assert one is not None
    assert one.nodes == ("n2",)


def test_shared_device_unhealthy_everywhere_is_tainted_for_every_node() -> None:
    shared = instance("cam-abcdef", nodes=("n1", "n2"), shared=True,
                      unhealthy={"n1": "not seen; kept for offlineGracePeriodSeconds",
                                 "n2": "gone"})
    pool = dra_slices.shared_plan(shared)
    assert pool is not None
    assert pool.nodes == ("n1", "n2")
    (device,) = pool.devices
    assert device["taints"][0]["value"] == "not-seen--kept-for-offlineGracePeriodSeconds"
    # Unhealthy on one node: offered on the other alone, untainted.
    half = dra_slices.shared_plan(instance("cam-abcdef", nodes=("n1", "n2"), shared=True,
                                           unhealthy={"n2": "gone"}))
    assert half is not None
    assert half.nodes == ("n1",)
    assert "taints" not in half.devices[0]


@pytest.mark.parametrize(("reason", "value"), [
    ("fault 0x80", "fault-0x80"),
    ("  ", "unhealthy"),
    ("x" * 80, "x" * 63),
    ("(bad) state.", "bad--state"),
])
def test_taint_values_are_label_values(reason: str, value: str) -> None:
    assert slices.taint_value(reason) == value


def test_pool_split_at_the_slice_limit_and_names_stable_per_publisher() -> None:
    plan = slices.plan_node("n1", [instance(f"cam-{i:06x}") for i in range(300)])
    bodies = slices.slice_bodies(plan.pools["ns/cam/node/n1"], generation=1, publisher="n1")
    assert [len(b["spec"]["devices"]) for b in bodies] == [128, 128, 44]
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {3}
    names = [b["metadata"]["name"] for b in bodies]
    assert len(set(names)) == 3
    assert names[0] == slices.slice_name("ns/cam/node/n1", 0, "n1")
    assert slices.slice_name("p", 0, "n1") != slices.slice_name("p", 0, "n2")


def test_a_pool_with_a_tainted_device_is_split_at_64() -> None:
    sick = instance("cam-sick00", unhealthy={"n1": "fault"})
    plan = slices.plan_node("n1", [*(instance(f"cam-{i:06x}") for i in range(99)), sick])
    bodies = slices.slice_bodies(plan.pools["ns/cam/node/n1"], generation=1, publisher="n1")
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 36]


def test_a_pool_is_held_until_this_node_knows_the_health_of_each_of_its_devices() -> None:
    """The Instances of a discovery pass are all written before the first status says a
    device is unhealthy; the pool must not be published in between as though every device
    were healthy (70 devices, one slice, no taint)."""
    devices = [instance(f"cam-{i:06x}") for i in range(70)]  # no status written yet
    served: dict[tuple[str, str], str | None] = {("ns", d.name): None for d in devices[1:]}
    held = slices.plan_node("n1", devices, served)
    assert held.pools == {}
    assert held.held == {"ns/cam/node/n1"}
    # Known (the sick one's verdict is this node's own, ahead of its Instance's status).
    served[("ns", "cam-000000")] = "fault"
    plan = slices.plan_node("n1", devices, served)
    assert plan.held == frozenset()
    bodies = slices.slice_bodies(plan.pools["ns/cam/node/n1"], generation=1, publisher="n1")
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 6]
    assert plan.tainted == {"cam-000000": "fault"}


def test_this_nodes_verdict_outranks_the_status_it_has_not_rewritten_yet() -> None:
    recovered = instance("cam-000001", unhealthy={"n1": "fault", "n2": "gone"})
    (pool,) = slices.plan_node("n1", [recovered], {("ns", "cam-000001"): None}).pools.values()
    assert "taints" not in pool.devices[0]
    sick = instance("cam-000002", unhealthy={"n1": "fault"})
    (pool,) = slices.plan_node("n1", [sick], {("ns", "cam-000002"): "not seen"}).pools.values()
    assert pool.devices[0]["taints"][0]["value"] == "not-seen"
    # Another node's device is not this node's to know: never held for it.
    theirs = instance("cam-000009", nodes=("n2",))
    assert slices.plan_node("n1", [theirs], {}) == slices.NodePlan(pools={})


def test_names_that_do_not_fit_become_digests() -> None:
    assert slices.device_name("cam-1a2b3c") == "cam-1a2b3c"
    assert slices.device_name("a.b-1a2b3c").startswith("d-")
    long_conf = "c" * 250
    assert len(slices.local_pool("ns", long_conf, "n1")) <= slices.MAX_POOL_NAME
    assert dra.device_class_name("ns", "cam") == "cam.ns.edgeplug.io"
    assert len(dra.device_class_name("ns", long_conf)) <= dra.DNS_SUBDOMAIN_MAX


def test_a_local_pool_too_long_for_its_name_still_ends_in_its_node() -> None:
    """The agents' slice policy ties a local pool to its node by the ``/node/<node>`` suffix,
    so the digest form keeps it (a bare digest was refused for every node)."""
    node = "n" * 63
    pool = slices.local_pool("ns", "c" * 250, node)
    assert pool.endswith(f"/node/{node}")
    assert len(pool) <= slices.MAX_POOL_NAME
    assert pool != slices.local_pool("ns", "c" * 249, node)
    assert slices.local_pool("ns", "cam", "n1") == "ns/cam/node/n1"


def test_dra_is_off_unless_asked() -> None:
    assert AgentSettings.from_env({"NODE_NAME": "n1"}).serve_dra is False
    assert AgentSettings.from_env({"NODE_NAME": "n1", "DRA": "on"}).serve_dra is True


def test_discover_prints_the_attributes_a_device_would_carry() -> None:
    example = Path(dra.__file__).parent / "examples" / "onvif.yaml"
    configuration = discover.load_configuration(example)
    device = Device(id="cam", properties={"ONVIF_DEVICE_IP_ADDRESS": "10.0.0.7",
                                          "ONVIF_DEVICE_SERVICE_URL": "http://" + "x" * 80,
                                          "TOKEN": "s3cret-token"})
    (row,) = discover.describe(configuration, [device], shared=True, node="n1",
                               secrets=[b"s3cret"])
    assert row["draAttributes"]["ip"] == "10.0.0.7"
    assert row["draAttributes"]["onvif_device_ip_address"] == "10.0.0.7"
    assert row["draAttributes"]["token"] == discover.MASK, "a Secret's value stays masked"
    assert row["draLeftOut"] == ["ONVIF_DEVICE_SERVICE_URL"]
    out = io.StringIO()
    discover.print_text(out, "#", [row])
    assert "DRA attribute ip=10.0.0.7" in out.getvalue()
    assert "DRA: property ONVIF_DEVICE_SERVICE_URL left out" in out.getvalue()


def _only_device(inst: Instance) -> dict[str, object]:
    if inst.spec.shared:
        shared = dra_slices.shared_plan(inst)
        assert shared is not None
        (device,) = shared.devices
        return dict(device)
    (pool,) = slices.plan_node("n1", [inst]).pools.values()
    (device,) = pool.devices
    return dict(device)


def test_capacity_above_one_is_consumable_less_what_device_plugins_hold() -> None:
    local = _only_device(instance("usb-000001", capacity=2))
    assert local["allowMultipleAllocations"] is True
    assert local["capacity"] == {"slots": {
        "value": "2", "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}}
    shared = _only_device(instance("cam-000001", shared=True, capacity=3, held=1))
    assert shared["capacity"]["slots"]["value"] == "2"  # type: ignore[index]
    assert "taints" not in shared


@pytest.mark.parametrize(("capacity", "shared"), [(1, False), (2, True)])
def test_a_device_whose_slots_device_plugins_all_hold_is_tainted(capacity: int,
                                                                 shared: bool) -> None:
    device = _only_device(instance("cam-000001", capacity=capacity, shared=shared,
                                   held=capacity))
    assert device["taints"] == [
        {"key": "edgeplug.io/held", "value": "device-plugins", "effect": "NoSchedule"}]
    single = _only_device(instance("cam-000002", capacity=1))
    assert "taints" not in single
    assert "allowMultipleAllocations" not in single


def test_an_agent_without_dra_imports_none_of_it() -> None:
    """docs/benchmarks.md, "Memory": the agent imports what it runs; DRA is off by default."""
    probe = ("import sys, agent.main\n"
             "from agent.settings import AgentSettings\n"
             "agent.main.settle_heap(AgentSettings(node_name='n'))\n"
             "print(sorted(m for m in sys.modules if m.startswith('agent.dra')"
             " or 'dra_v1' in m or 'pluginregistration' in m))\n")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == "[]"


def test_a_device_past_its_eviction_grace_is_tainted_no_execute() -> None:
    """NoSchedule while unhealthy; NoExecute for the devices the publisher says are
    past their Configuration's ``unhealthyDevices.evictAfterSeconds``; healthy ones never."""
    sick, fine = instance("cam-000001"), instance("cam-000002")
    served: dict[tuple[str, str], str | None] = {("ns", "cam-000001"): "fault",
                                                 ("ns", "cam-000002"): None}
    (pool,) = slices.plan_node("n1", [sick, fine], served).pools.values()
    assert [t["effect"] for t in pool.devices[0]["taints"]] == ["NoSchedule"]
    evicting = {("ns", "cam-000001"), ("ns", "cam-000002")}
    (pool,) = slices.plan_node("n1", [sick, fine], served, evicting=evicting).pools.values()
    assert pool.devices[0]["taints"] == [
        {"key": "edgeplug.io/unhealthy", "value": "fault", "effect": "NoExecute"}]
    assert "taints" not in pool.devices[1]


def test_a_shared_device_is_evicting_only_when_unhealthy_on_every_node() -> None:
    everywhere = instance("cam-abcdef", nodes=("n1", "n2"), shared=True,
                          unhealthy={"n1": "gone", "n2": "gone"})
    assert dra_slices.unhealthy_everywhere(everywhere)
    plan = dra_slices.shared_plan(everywhere, evict=True)
    assert plan is not None
    assert plan.devices[0]["taints"][0]["effect"] == "NoExecute"
    somewhere = instance("cam-abcdef", nodes=("n1", "n2"), shared=True,
                         unhealthy={"n2": "gone"})
    assert not dra_slices.unhealthy_everywhere(somewhere)
    plan = dra_slices.shared_plan(somewhere, evict=True)
    assert plan is not None
    assert plan.nodes == ("n1",)
    assert "taints" not in plan.devices[0]
    assert not dra_slices.unhealthy_everywhere(instance("cam-abcdef", shared=True))


def test_shared_devices_share_a_pool_fixed_by_name_each_naming_its_nodes() -> None:
    names = [f"cam-{i:06x}" for i in range(1000)]
    pools = {dra_slices.shared_pool("ns", "cam", n) for n in names}
    assert len(pools) == dra_slices.SHARED_POOL_BUCKETS, "1,000 devices fill every pool"
    assert all(dra_slices.is_shared_pool(p) for p in pools)
    assert dra_slices.shared_pool("ns", "cam", names[7]) == dra_slices.shared_pool(
        "ns", "cam", names[7]), "a device's pool never moves"
    first = instance("cam-000001", nodes=("n1", "n2"), shared=True, capacity=2)
    second = instance("cam-000002", nodes=("n2", "n3"), shared=True, capacity=2,
                      unhealthy={"n2": "gone"})
    own = [dra_slices.shared_plan(first), dra_slices.shared_plan(second)]
    assert None not in own
    plan = dra_slices.pooled_plan("ns/cam/shared/bucket-00", [p for p in own if p])
    (body,) = dra_slices.slice_bodies(plan, generation=1,
                                      publisher=dra_slices.CONTROLLER_PUBLISHER)
    assert body["spec"]["perDeviceNodeSelection"] is True
    assert "nodeSelector" not in body["spec"]
    assert "nodeName" not in body["spec"]
    selectors = {d["name"]: dra_slices.selector_nodes(d["nodeSelector"])
                 for d in body["spec"]["devices"]}
    assert selectors == {"cam-000001": ("n1", "n2"), "cam-000002": ("n3",)}
    # What a restarted controller reads back from the slice is what it would write.
    assert written_slices.key_of_slices([body])[1] == written_slices.content_key(plan)


def test_a_pool_of_devices_naming_their_nodes_is_split_at_64() -> None:
    plans = [dra_slices.PoolPlan(name=f"own-{i}", nodes=("n1",), devices=({"name": f"d{i}"},))
             for i in range(100)]
    bodies = dra_slices.slice_bodies(dra_slices.pooled_plan("ns/cam/shared/bucket-01", plans),
                                     generation=2, publisher=dra_slices.CONTROLLER_PUBLISHER)
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 36]
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {2}
