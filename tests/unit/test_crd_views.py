"""The CRD manifests and the Python views must describe the same API.

The YAML is the source of truth for the API server; the dataclasses are what the agent and the
controller read. These tests walk the schema and fail when a field, a default, a bound or a
pattern exists on one side only.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources
from typing import Any

import pytest
import yaml

from cli.main import main as cli_main
from crds import configuration as cfg
from crds import instance as inst
from crds.api import (
    API_VERSION,
    CONFIGURATION_KIND,
    CONFIGURATION_PLURAL,
    DEFAULT_CAPACITY,
    DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS,
    GROUP,
    INSTANCE_KIND,
    INSTANCE_PLURAL,
    MAX_CAPACITY,
    PROPERTY_NAME_PATTERN,
    VERSION,
    crd_schema,
    load_manifests,
)

CONFIG_SPEC = crd_schema(CONFIGURATION_KIND)["properties"]["spec"]
INSTANCE_SCHEMA = crd_schema(INSTANCE_KIND)
INSTANCE_SPEC = INSTANCE_SCHEMA["properties"]["spec"]
EXAMPLES = sorted(
    p.name
    for p in resources.files("crds").joinpath("examples").iterdir()
    if p.name.endswith(".yaml")
)


def attrs(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def wire_paths(spec_schema: dict[str, Any]) -> set[str]:
    """Top-level spec fields, with brokerSpec's two alternatives spelt out."""
    paths = set()
    for name, sub in spec_schema["properties"].items():
        if name == "brokerSpec":
            paths |= {f"brokerSpec.{alt}" for alt in sub["properties"]}
        else:
            paths.add(name)
    return paths


def full_configuration_spec() -> dict[str, Any]:
    """A spec that sets every field the schema has."""
    return {
        "discoveryHandler": {
            "name": "onvif",
            "discoveryDetails": "discoveryTimeoutSeconds: 2\n",
            "discoveryProperties": [
                {"name": "inline", "value": "x"},
                {"name": "username", "valueFrom": {"secretKeyRef": {
                    "name": "s", "key": "username", "namespace": "ns", "optional": False}}},
                {"name": "mode", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
            ],
        },
        "capacity": 3,
        "brokerSpec": {"brokerPodSpec": {"containers": [{"name": "b", "image": "busybox"}]}},
        "instanceServiceSpec": {"type": "ClusterIP", "ports": [{"port": 80}]},
        "configurationServiceSpec": {"type": "ClusterIP", "ports": [{"port": 81}]},
        "brokerProperties": {"RESOLUTION_WIDTH": "1280"},
        "offlineGracePeriodSeconds": 10,
        "resourceName": "huawei.com/Ascend910",
        "brokerDeviceAccess": "dra",
        "allocator": "devicePlugin",
        "unhealthyDevices": {"evictAfterSeconds": 30},
        "nodeSelector": {
            "matchLabels": {"zone": "dock"},
            "matchExpressions": [
                {"key": "arch", "operator": "In", "values": ["arm64", "amd64"]},
                {"key": "gpu", "operator": "DoesNotExist"},
            ],
        },
    }


def test_manifests_are_the_two_crds_in_edgeplug_io() -> None:
    docs = load_manifests()
    assert [d["metadata"]["name"] for d in docs] == [
        f"{CONFIGURATION_PLURAL}.{GROUP}", f"{INSTANCE_PLURAL}.{GROUP}"]
    for doc in docs:
        assert doc["spec"]["group"] == GROUP
        assert doc["spec"]["scope"] == "Namespaced"
        assert "all" in doc["spec"]["names"]["categories"]
        (version,) = doc["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
        assert version["subresources"] == {"status": {}}
    assert API_VERSION == "edgeplug.io/v1alpha1"


def test_configuration_spec_fields_match_schema() -> None:
    assert wire_paths(CONFIG_SPEC) == set(cfg.SPEC_FIELDS)
    assert set(cfg.SPEC_FIELDS.values()) == attrs(cfg.ConfigurationSpec)
    handler = CONFIG_SPEC["properties"]["discoveryHandler"]
    assert set(handler["properties"]) == {"name", "discoveryDetails", "discoveryProperties"}
    assert attrs(cfg.DiscoveryHandlerInfo) == {
        "name", "discovery_details", "discovery_properties"}
    prop = handler["properties"]["discoveryProperties"]["items"]
    assert set(prop["properties"]) == {"name", "value", "valueFrom"}
    assert attrs(cfg.DiscoveryProperty) == {"name", "value", "value_from"}
    value_from = prop["properties"]["valueFrom"]["properties"]
    assert set(value_from) == {k.value for k in cfg.ValueSourceKind}
    for ref in value_from.values():
        assert set(ref["properties"]) == attrs(cfg.ValueSource) - {"kind"}
    selector = CONFIG_SPEC["properties"]["nodeSelector"]["properties"]
    assert set(selector) == {"matchLabels", "matchExpressions"}
    assert attrs(cfg.LabelSelector) == {"match_labels", "match_expressions"}
    requirement = selector["matchExpressions"]["items"]
    assert set(requirement["properties"]) == {"key", "operator", "values"}
    assert requirement["properties"]["operator"]["enum"] == [o.value for o in cfg.SelectorOperator]


def test_instance_spec_and_status_fields_match_schema() -> None:
    assert set(INSTANCE_SPEC["properties"]) == set(inst.SPEC_FIELDS)
    assert set(inst.SPEC_FIELDS.values()) == attrs(inst.InstanceSpec)
    assert INSTANCE_SPEC["properties"]["nodes"]["x-kubernetes-list-type"] == "set"
    assert INSTANCE_SPEC["properties"]["deviceUsage"]["x-kubernetes-map-type"] == "granular"
    status = INSTANCE_SCHEMA["properties"]["status"]["properties"]
    example = inst.Instance(name="i", namespace="n", spec=inst.InstanceSpec("c"))
    assert set(example.status_to_object()) | set(inst.CONTROLLER_STATUS_FIELDS) | set(
        inst.PREVIOUS_RELEASE_STATUS_FIELDS) == set(status)


def test_defaults_agree() -> None:
    props = CONFIG_SPEC["properties"]
    assert props["capacity"]["default"] == DEFAULT_CAPACITY == cfg.ConfigurationSpec(
        cfg.DiscoveryHandlerInfo("x")).capacity
    assert props["offlineGracePeriodSeconds"]["default"] == DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS
    assert cfg.ConfigurationSpec(cfg.DiscoveryHandlerInfo("x")).offline_grace_period_seconds == (
        DEFAULT_OFFLINE_GRACE_PERIOD_SECONDS)
    details = props["discoveryHandler"]["properties"]["discoveryDetails"]
    assert details["default"] == cfg.DiscoveryHandlerInfo("x").discovery_details == ""
    assert props["brokerDeviceAccess"]["default"] == cfg.ConfigurationSpec(
        cfg.DiscoveryHandlerInfo("x")).broker_device_access
    assert props["brokerDeviceAccess"]["enum"] == [a.value for a in cfg.BrokerDeviceAccess]
    assert INSTANCE_SPEC["properties"]["capacity"]["default"] == inst.InstanceSpec("c").capacity
    assert INSTANCE_SPEC["properties"]["shared"]["default"] is inst.InstanceSpec("c").shared
    assert props["capacity"]["maximum"] == INSTANCE_SPEC["properties"]["capacity"]["maximum"]
    assert props["capacity"]["maximum"] == MAX_CAPACITY
    # A spec with only the handler parses to the same defaults the server would fill in.
    parsed = cfg.ConfigurationSpec.from_object({"discoveryHandler": {"name": "udev"}})
    assert parsed == cfg.ConfigurationSpec(cfg.DiscoveryHandlerInfo("udev"))


def test_property_name_rule_is_the_same_everywhere() -> None:
    prop_name = CONFIG_SPEC["properties"]["discoveryHandler"]["properties"][
        "discoveryProperties"]["items"]["properties"]["name"]
    assert prop_name["pattern"] == PROPERTY_NAME_PATTERN
    for spec in (CONFIG_SPEC, INSTANCE_SPEC):
        (rule,) = spec["properties"]["brokerProperties"]["x-kubernetes-validations"]
        assert PROPERTY_NAME_PATTERN in rule["rule"]


def test_configuration_round_trips_every_field() -> None:
    spec = full_configuration_spec()
    earlier_names = {"sharedDeviceAllocation"}  # read as the field it was renamed to
    assert wire_paths(CONFIG_SPEC) - earlier_names <= {
        *spec, *(f"brokerSpec.{k}" for k in ("brokerPodSpec", "brokerJobSpec"))}
    obj = {"apiVersion": API_VERSION, "kind": CONFIGURATION_KIND,
           "metadata": {"name": "cam", "namespace": "ns", "uid": "u-1", "generation": 4,
                        "resourceVersion": "77"},
           "spec": spec}
    view = cfg.Configuration.from_object(obj)
    assert (view.name, view.namespace, view.uid, view.generation, view.resource_version) == (
        "cam", "ns", "u-1", 4, "77")
    assert view.spec.discovery_handler.discovery_properties[1].value_from == cfg.ValueSource(
        cfg.ValueSourceKind.SECRET, "s", "username", namespace="ns", optional=False)
    assert view.spec.node_selector is not None
    assert view.spec.to_object() == spec
    job = {**spec, "brokerSpec": {"brokerJobSpec": {"template": {"spec": {}}}}}
    job_view = cfg.ConfigurationSpec.from_object(job)
    assert job_view.broker_pod_spec is None
    assert job_view.broker_job_spec == {"template": {"spec": {}}}
    assert job_view.to_object() == job
    assert view.owner_reference()["uid"] == "u-1"
    earlier = {k: v for k, v in spec.items() if k != "allocator"}
    earlier["sharedDeviceAllocation"] = "devicePlugin"
    assert cfg.ConfigurationSpec.from_object(earlier).to_object() == spec


def test_instance_round_trips_every_field() -> None:
    spec = {"configurationName": "cam", "cdiName": "edgeplug.io/cam=bb0879", "capacity": 2,
            "brokerProperties": {"ONVIF_DEVICE_IP_ADDRESS": "10.0.0.5"}, "shared": True,
            "nodes": ["b", "a"], "deviceUsage": {"cam-bb0879-0": "a", "cam-bb0879-1": ""},
            "deviceDigest": "0123456789abcdef"}
    assert set(spec) == set(INSTANCE_SPEC["properties"])
    status: dict[str, Any] = {
        "reservations": {"cam-bb0879-1": "b"}, "demand": {"a": 1},
        "unhealthy": {"b": "no answer to SOAP"}, "used": 1, "nodes": "a,b"}
    obj = {"apiVersion": API_VERSION, "kind": INSTANCE_KIND,
           "metadata": {"name": "cam-bb0879", "namespace": "ns", "uid": "u",
                        "resourceVersion": "9"},
           "spec": spec,
           "status": {**status, "reported": {"a": True, "b": True}}}
    view = inst.Instance.from_object(obj)
    assert view.spec.nodes == ("b", "a")
    assert view.spec.device_digest == "0123456789abcdef"
    # An Instance written before devices were recorded has none, and writes none back.
    unrecorded = inst.InstanceSpec.from_object({k: v for k, v in spec.items()
                                                if k != "deviceDigest"})
    assert unrecorded.device_digest == ""
    assert "deviceDigest" not in unrecorded.to_object()
    assert view.reservations == {"cam-bb0879-1": "b"}
    assert view.demand == {"a": 1}
    assert view.unhealthy == {"b": "no answer to SOAP"}
    assert view.spec.used == 1
    out = view.spec_to_object()
    assert out == {k: v for k, v in obj.items() if k != "status"} | {
        "metadata": {"name": "cam-bb0879", "namespace": "ns"}}
    assert view.status_to_object() == status, "the previous release's reported marks dropped"


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_parse(example: str) -> None:
    text = resources.files("crds").joinpath("examples", example).read_text(encoding="utf-8")
    (doc,) = [d for d in yaml.safe_load_all(text) if d]
    if doc["kind"] != CONFIGURATION_KIND:
        assert doc["kind"] == "Secret"
        return
    view = cfg.Configuration.from_object(doc)
    assert view.spec.broker_pod_spec is not None
    limits = view.spec.broker_pod_spec["containers"][0]["resources"]["limits"]
    assert limits["{{PLACEHOLDER}}"] == "1"
    assert cfg.ConfigurationSpec.from_object(view.spec.to_object()) == view.spec


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"zone": "dock", "arch": "arm64"}, True),
        ({"zone": "dock", "arch": "amd64"}, True),
        ({"zone": "dock", "arch": "riscv"}, False),
        ({"zone": "yard", "arch": "arm64"}, False),
        ({"arch": "arm64"}, False),
        ({"zone": "dock", "arch": "arm64", "gpu": "yes"}, False),
    ],
)
def test_label_selector_matches_like_the_api_server(labels: dict[str, str], expected: bool) -> None:
    selector = cfg.LabelSelector.from_object(full_configuration_spec()["nodeSelector"])
    assert selector.matches(labels) is expected


def test_label_selector_edge_semantics() -> None:
    assert cfg.LabelSelector().matches({})
    not_in = cfg.LabelSelectorRequirement("k", cfg.SelectorOperator.NOT_IN, ("x",))
    assert not_in.matches({})  # a missing key is "not in" any set
    assert not not_in.matches({"k": "x"})
    exists = cfg.LabelSelectorRequirement("k", cfg.SelectorOperator.EXISTS)
    assert exists.matches({"k": ""})
    assert not exists.matches({})


USAGE_PATTERN = re.compile(
    INSTANCE_SPEC["properties"]["deviceUsage"]["additionalProperties"]["pattern"])


@pytest.mark.parametrize(
    ("value", "usage"),
    [
        ("", inst.SlotUsage.free()),
        ("node-a", inst.SlotUsage.by_node("node-a")),
        ("C:debug-echo-0:node-a", inst.SlotUsage.by_configuration("debug-echo-0", "node-a")),
        ("C:vdev:with:colon:node.b", inst.SlotUsage.by_configuration("vdev:with:colon", "node.b")),
    ],
)
def test_slot_usage_parses_formats_and_the_schema_accepts_it(
    value: str, usage: inst.SlotUsage
) -> None:
    assert inst.SlotUsage.parse(value) == usage
    assert usage.format() == value == str(usage)
    assert USAGE_PATTERN.match(value)
    assert usage.is_free is (value == "")


@pytest.mark.parametrize("value", ["C:", "C::node", "C:vid:", "a:b"])
def test_slot_usage_rejects_malformed(value: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        inst.SlotUsage.parse(value)
    assert not USAGE_PATTERN.match(value)


def test_cli_prints_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["crds"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert docs == load_manifests()


def test_eviction_grace_is_the_field_or_none() -> None:
    assert cfg.eviction_grace({"unhealthyDevices": {"evictAfterSeconds": 0}}) == 0
    assert cfg.eviction_grace({"unhealthyDevices": {"evictAfterSeconds": 45}}) == 45
    spec: dict[str, Any]
    for spec in ({}, {"unhealthyDevices": None}, {"unhealthyDevices": {}},
                 {"unhealthyDevices": {"evictAfterSeconds": -3}},
                 {"unhealthyDevices": {"evictAfterSeconds": "30"}}):
        assert cfg.eviction_grace(spec) is None, spec
    view = cfg.ConfigurationSpec.from_object({"discoveryHandler": {"name": "debugEcho"}})
    assert view.unhealthy_devices is None
    assert "unhealthyDevices" not in view.to_object()
