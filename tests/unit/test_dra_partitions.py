"""Partitionable devices over tables: an Ascend chip's partitions, their counters in a node's
pool, the slices that carry them, and a cluster that drops the counters."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from agent.dra import slices
from crds import dra_features, dra_slices, written_slices
from crds.instance import Instance, InstanceSpec
from discovery_handlers.ascend.chips import Chip
from discovery_handlers.ascend.vnpu_partitions import partition_devices, quantity_mib
from discovery_handlers.contract import HEALTHY

CHIP_310P = Chip(phy_id=3, card_id=1, device_index=0, chip_type="Ascend", chip_name="310P3",
                 aicore_count=8, memory_mb=24576)


def instance(name: str, props: Mapping[str, str]) -> Instance:
    return Instance(name=name, namespace="ns", spec=InstanceSpec(
        configuration_name="npu", capacity=1, shared=False, nodes=("n1",),
        broker_properties=dict(props), device_usage={f"{name}-0": ""}))


def partitions() -> list[Instance]:
    devices = partition_devices(CHIP_310P, ("Ascend310P-4c", "Ascend310P-2c"), health=HEALTHY,
                                problems=[])
    return [instance(f"npu-{d.id}", d.properties) for d in devices]


@pytest.mark.parametrize(("mib", "text"), [
    (4096, "4Gi"), (12288, "12Gi"), (3000, "3000Mi"), (1048576, "1Ti"), (0, "0Mi")])
def test_memory_is_written_as_the_api_server_writes_it_back(mib: int, text: str) -> None:
    assert quantity_mib(mib) == text


def test_a_chip_is_offered_as_every_partition_of_each_type_it_can_hold() -> None:
    devices = partition_devices(CHIP_310P, ("Ascend310P-4c", "Ascend310P-2c"), health=HEALTHY,
                                problems=[])
    assert [d.id for d in devices] == [
        "davinci3-vir02-0", "davinci3-vir02-1", "davinci3-vir02-2", "davinci3-vir02-3",
        "davinci3-vir04-0", "davinci3-vir04-1"]
    four = devices[-1].properties
    assert (four["DRA_COUNTER_SET"], four["DRA_CONSUMES_COUNTERS"],
            four["DRA_SHARED_COUNTERS"]) == ("davinci3", "aicore=4,memory=12Gi",
                                             "aicore=8,memory=24Gi")
    assert four["ASCEND_VNPU_TYPE"] == "Ascend310P-4c"
    assert devices[-1].device_specs == (), "no vNPU exists until one is created"
    problems: list[str] = []
    unknown = Chip(phy_id=0, chip_type="Ascend", chip_name="310P3", memory_mb=24576)
    assert partition_devices(unknown, ("Ascend310P-4c",), health=HEALTHY,
                             problems=problems) == []
    assert problems == ["davinci0: AI cores or memory unknown (DCMI gives them): no partitions "
                        "offered"]


def test_a_pool_of_partitions_carries_their_counter_set_in_a_slice_of_its_own() -> None:
    plan = slices.plan_node("n1", partitions())
    (pool,) = plan.pools.values()
    assert pool.counter_sets == ({"name": "davinci3", "counters": {
        "aicore": {"value": "8"}, "memory": {"value": "24Gi"}}},)
    assert all(d["consumesCounters"][0]["counterSet"] == "davinci3" for d in pool.devices)
    bodies = dra_slices.slice_bodies(pool, generation=1, publisher="n1")
    assert [sorted(set(b["spec"]) & {"devices", "sharedCounters"}) for b in bodies] == [
        ["devices"], ["sharedCounters"]]
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {2}
    assert all(b["spec"]["nodeName"] == "n1" for b in bodies)
    name, key, generation = written_slices.key_of_slices(bodies)
    assert (name, key, generation) == (pool.name, written_slices.content_key(pool), 1), \
        "read back, the pool is unchanged: no rewrite"


def test_partitions_consuming_counters_are_at_most_64_to_a_slice() -> None:
    chip = Chip(phy_id=0, chip_type="Ascend", chip_name="910ProB", aicore_count=64,
                memory_mb=65536)
    devices = partition_devices(chip, ("Ascend910-2c",), health=HEALTHY, problems=[])
    plan = slices.plan_node("n1", [instance(f"npu-{d.id}", d.properties) for d in devices])
    (pool,) = plan.pools.values()
    bodies = dra_slices.slice_bodies(pool, generation=1, publisher="n1")
    assert [len(b["spec"].get("devices", [])) for b in bodies] == [32, 0]
    many = dra_slices.PoolPlan(name=pool.name, node_name="n1", devices=pool.devices * 3,
                               counter_sets=pool.counter_sets)
    assert [len(b["spec"].get("devices", [])) for b in dra_slices.slice_bodies(
        many, generation=1, publisher="n1")] == [64, 32, 0]


def test_without_partitions_a_node_publishes_none_of_them() -> None:
    whole = instance("npu-davinci4", {"ASCEND_VISIBLE_DEVICES": "4"})
    plan = slices.plan_node("n1", [*partitions(), whole], partitions=False)
    (pool,) = plan.pools.values()
    assert [d["name"] for d in pool.devices] == ["npu-davinci4"]
    assert pool.counter_sets == ()


def test_a_cluster_that_drops_the_counters_is_named_once(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    plan = slices.plan_node("n1", partitions())
    (pool,) = plan.pools.values()
    devices, counters = dra_slices.slice_bodies(pool, generation=1, publisher="n1")
    stripped = {"spec": {"devices": [{k: v for k, v in d.items() if k != "consumesCounters"}
                                     for d in devices["spec"]["devices"]]}}
    assert dra_features.dropped_by_slice(devices, devices) == []
    assert dra_features.dropped_by_slice(devices, stripped) == [
        dra_features.PARTITIONABLE_DEVICES]
    assert dra_features.dropped_by_slice(counters, {"spec": {}}) == [
        dra_features.PARTITIONABLE_DEVICES]
    report = dra_features.FeatureReport(logging.getLogger("test.partitions"))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            report.note([dra_features.PARTITIONABLE_DEVICES], what="ResourceSlice s")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "does not serve DRAPartitionableDevices" in line
    assert "withdrawn rather than published without the counters" in line
