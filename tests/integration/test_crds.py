"""The CRDs on a real kube-apiserver: examples apply, mistakes are refused naming the field,
defaults are filled in, printer columns print, and agents' server-side applies merge.

Everything goes through the real ``kubectl`` against the session's control plane, as a user
would type it; nothing here fakes the API server.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
import yaml

from crds.api import API_VERSION, CONFIGURATION_KIND, INSTANCE_KIND
from crds.configuration import Configuration
from crds.instance import Instance, SlotUsage
from crds.naming import cdi_name, instance_digest, instance_name, slot_id
from tests.harness.controlplane import ControlPlane

EXAMPLES_DIR = resources.files("crds").joinpath("examples")
EXAMPLE_FILES = sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.name.endswith(".yaml"))


def minimal_configuration(name: str = "cfg") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIGURATION_KIND,
        "metadata": {"name": name},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": "descriptions: [a]\n"},
            "brokerSpec": {"brokerPodSpec": {"containers": [{"name": "b", "image": "busybox"}]}},
        },
    }


def apply(cp: ControlPlane, namespace: str, obj: dict[str, Any], *extra: str,
          check: bool = True) -> Any:
    return cp.kubectl("apply", "--validate=strict", "-n", namespace, "-f", "-", *extra,
                      stdin=json.dumps(obj), check=check)


def get_json(cp: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any]:
    out = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def table(cp: ControlPlane, namespace: str, resource: str, *extra: str) -> list[list[str]]:
    out = cp.kubectl("get", resource, "-n", namespace, *extra).stdout
    return [line.split() for line in out.strip().splitlines()]


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_applies(control_plane: ControlPlane, namespace: str, example: str) -> None:
    path = str(EXAMPLES_DIR.joinpath(example))
    result = control_plane.kubectl("apply", "--validate=strict", "-n", namespace, "-f", path)
    assert " created" in result.stdout, result.stdout
    assert result.stderr.strip() == "", f"apply of {example} warned: {result.stderr}"


def test_get_configurations_prints_columns(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES_DIR))
    control_plane.kubectl(
        "patch", "configuration", "debug-echo", "-n", namespace, "--subresource=status",
        "--type=merge", "-p",
        json.dumps({"status": {"instanceCount": 2, "brokers": {"desired": 2, "ready": 1}}}),
    )
    control_plane.kubectl(
        "patch", "configuration", "debug-echo", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"conditions": [{
            "type": "DiscoveryDetailsValid", "status": "False",
            "reason": "InvalidDiscoveryDetails", "message": "descriptions: required",
            "lastTransitionTime": "2026-11-30T00:00:00Z"}]}}),
    )
    out = control_plane.kubectl("get", "configurations", "-n", namespace).stdout
    rows = [line.split() for line in out.strip().splitlines()]
    assert rows[0] == ["NAME", "HANDLER", "CAPACITY", "INSTANCES", "BROKERS", "READY", "AGE"]
    # The default view fits an 80-column terminal with every example listed.
    widest = max(out.splitlines(), key=len)
    assert len(widest) <= 80, f"{len(widest)} columns: {widest!r}"
    by_name = {row[0]: row for row in rows[1:]}
    examples = {
        doc["metadata"]["name"]
        for path in EXAMPLES_DIR.iterdir()
        if path.name.endswith(".yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Configuration"
    }
    assert set(by_name) == examples
    assert by_name["debug-echo"][1:6] == ["debugEcho", "2", "2", "2", "1"]
    # A Configuration that cannot run says why in the wide view.
    wide = table(control_plane, namespace, "configurations", "-o", "wide")
    assert wide[0][6] == "DETAILS"
    assert {row[0]: row for row in wide[1:]}["debug-echo"][6] == "InvalidDiscoveryDetails"
    # The short name and the "all" category reach the same objects.
    assert len(table(control_plane, namespace, "epc")) == len(rows)
    all_out = control_plane.kubectl("get", "all", "-n", namespace).stdout
    assert "configuration.edgeplug.io/debug-echo" in all_out


def test_get_instances_prints_columns(control_plane: ControlPlane, namespace: str) -> None:
    digest = instance_digest("foo0", shared=True, node="")
    name = instance_name("debug-echo", "foo0", shared=True, node="")
    slots = {slot_id(name, i): "" for i in range(3)}
    slots[slot_id(name, 0)] = SlotUsage.by_node("node-a").format()
    slots[slot_id(name, 2)] = SlotUsage.by_configuration("debug-echo-vd1", "node-b").format()
    obj = {
        "apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {"name": name},
        "spec": {"configurationName": "debug-echo", "cdiName": cdi_name("debug-echo", digest),
                 "capacity": 3, "shared": True, "nodes": ["node-b", "node-a"],
                 "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "foo0"}, "deviceUsage": slots},
    }
    apply(control_plane, namespace, obj)
    view = Instance.from_object(get_json(control_plane, namespace, "instance", name))
    control_plane.kubectl(
        "patch", "instance", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": view.status_to_object()}),
    )
    rows = table(control_plane, namespace, "instances")
    assert rows[0] == ["NAME", "SHARED", "CAPACITY", "USED", "AGE"]
    (row,) = rows[1:]
    assert row[:4] == [name, "true", "3", "2"]
    wide = table(control_plane, namespace, "instances", "-o", "wide")
    assert wide[0] == ["NAME", "CONFIG", "SHARED", "NODES", "CAPACITY", "USED", "CLAIMS",
                       "SERVED", "UNHEALTHY", "AGE"]
    assert wide[1][1] == "debug-echo"
    # spec.nodes keeps the order nodes joined in; status.nodes (what the column prints, as an
    # agent writes it from status_to_object) is sorted.
    assert wide[1][3] == "node-a,node-b"
    assert len(table(control_plane, namespace, "epi")) == 2


#: The longest AGE kubectl prints for anything younger than 8 years (HumanDuration: 7y364d).
WIDEST_AGE = 6


def test_get_instances_fits_80_columns_with_realistic_names(
        control_plane: ControlPlane, namespace: str) -> None:
    # One Instance per example Configuration, and the issue's usb-camera-front, each with every
    # column filled as the agents and the controller (--dra) fill it.
    configurations = {
        doc["metadata"]["name"]: doc["spec"]["discoveryHandler"]["name"]
        for path in EXAMPLES_DIR.iterdir()
        if path.name.endswith(".yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "Configuration"
    }
    configurations["usb-camera-front"] = "udev"
    device_ids = {"udev": "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-2/video4linux/video0",
                  "onvif": "uuid:3fa1fe68-b915-4053-a3e1-ac15a21f5f91",
                  "opcua": "opc.tcp://10.20.30.40:4840/", "ascend": "npu-0", "debugEcho": "foo0"}
    names: dict[str, str] = {}
    for configuration, handler in sorted(configurations.items()):
        shared = handler in ("onvif", "opcua", "debugEcho")
        node = "edge-node-01"
        name = instance_name(configuration, device_ids[handler], shared=shared, node=node)
        digest = instance_digest(device_ids[handler], shared=shared, node=node)
        names[name] = configuration
        usage = {slot_id(name, i): "" for i in range(10)}
        usage[slot_id(name, 0)] = SlotUsage.by_node(node).format()
        apply(control_plane, namespace, {
            "apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {"name": name},
            "spec": {"configurationName": configuration,
                     "cdiName": cdi_name(configuration, digest), "capacity": 10,
                     "shared": shared, "nodes": [node], "deviceUsage": usage},
        })
        view = Instance.from_object(get_json(control_plane, namespace, "instance", name))
        status = {**view.status_to_object(), "claims": 3, "servedBy": "both",
                  "unhealthy": {node: "unplugged"}}
        control_plane.kubectl(
            "patch", "instance", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )
    # The issue's example: 84 columns wide with CONFIG and CLAIMS in the default view.
    assert "usb-camera-front-da0e1b" in names

    def widest(lines: list[str]) -> int:
        """The widest line once every AGE is as wide as kubectl ever prints one."""
        return max(len(line) - len(line.split()[-1]) + max(len("AGE"), WIDEST_AGE)
                   for line in lines)

    default_view = control_plane.kubectl("get", "instances", "-n", namespace).stdout
    lines = default_view.strip().splitlines()
    assert widest(lines) <= 80, default_view
    assert {line.split()[0] for line in lines[1:]} == set(names)
    # The columns moved out of the default view are all in -o wide, filled.
    wide = table(control_plane, namespace, "instances", "-o", "wide")
    header = wide[0]
    for row in wide[1:]:
        cells = dict(zip(header, row, strict=True))
        assert cells["CONFIG"] == names[cells["NAME"]]
        assert (cells["NODES"], cells["CLAIMS"], cells["SERVED"]) == ("edge-node-01", "3",
                                                                      "both")
        assert cells["USED"] == "1"
        assert cells["UNHEALTHY"] == "unplugged", "the reason, not the raw map"


def test_defaults_filled_in(control_plane: ControlPlane, namespace: str) -> None:
    obj = minimal_configuration("minimal")
    apply(control_plane, namespace, obj)
    stored = get_json(control_plane, namespace, "configuration", "minimal")
    assert stored["spec"]["capacity"] == 1
    assert stored["spec"]["offlineGracePeriodSeconds"] == 300
    view = Configuration.from_object(stored)
    assert view.spec.capacity == 1
    assert view.spec.offline_grace_period_seconds == 300
    assert view.spec.discovery_handler.name == "debugEcho"
    assert view.uid
    assert view.generation == 1
    assert view.owner_reference()["uid"] == stored["metadata"]["uid"]
    instance = {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {"name": "i"},
                "spec": {"configurationName": "minimal"}}
    apply(control_plane, namespace, instance)
    stored_instance = get_json(control_plane, namespace, "instance", "i")
    assert stored_instance["spec"]["capacity"] == 1
    assert stored_instance["spec"]["shared"] is False


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return mutate


def _delete(path: str) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        del node[leaf]
    return mutate


JOB = {"template": {"spec": {"containers": [{"name": "j", "image": "busybox"}]}}}
POD = {"containers": [{"name": "b", "image": "busybox"}]}
SECRET_REF = {"secretKeyRef": {"name": "s", "key": "k"}}

MALFORMED: list[tuple[str, Mutation, str]] = [
    ("both-broker-specs", _set("brokerSpec", {"brokerPodSpec": POD, "brokerJobSpec": JOB}),
     "spec.brokerSpec"),
    ("neither-broker-spec", _set("brokerSpec", {}), "spec.brokerSpec"),
    ("pod-spec-without-containers", _set("brokerSpec", {"brokerPodSpec": {"hostNetwork": True}}),
     "spec.brokerSpec.brokerPodSpec.containers"),
    ("capacity-zero", _set("capacity", 0), "spec.capacity"),
    ("capacity-huge", _set("capacity", 100000), "spec.capacity"),
    ("capacity-wrong-type", _set("capacity", "two"), "spec.capacity"),
    ("bad-discovery-property-name",
     _set("discoveryHandler.discoveryProperties", [{"name": "1-bad", "value": "x"}]),
     "spec.discoveryHandler.discoveryProperties[0].name"),
    ("property-value-and-valueFrom",
     _set("discoveryHandler.discoveryProperties",
          [{"name": "user", "value": "x", "valueFrom": SECRET_REF}]),
     "spec.discoveryHandler.discoveryProperties[0]"),
    ("property-neither-value-nor-valueFrom",
     _set("discoveryHandler.discoveryProperties", [{"name": "user"}]),
     "spec.discoveryHandler.discoveryProperties[0]"),
    ("valueFrom-secret-and-configmap",
     _set("discoveryHandler.discoveryProperties", [{"name": "user", "valueFrom": {
         **SECRET_REF, "configMapKeyRef": {"name": "c", "key": "k"}}}]),
     "spec.discoveryHandler.discoveryProperties[0].valueFrom"),
    ("bad-broker-property-name", _set("brokerProperties", {"BAD-NAME": "x"}),
     "spec.brokerProperties"),
    ("broker-property-not-a-string", _set("brokerProperties", {"NAMESPACE_INDEX": 2}),
     "spec.brokerProperties.NAMESPACE_INDEX"),
    ("unknown-field", _set("brokerSpecs", {"brokerPodSpec": POD}), "spec.brokerSpecs"),
    ("discovery-details-not-a-string",
     _set("discoveryHandler.discoveryDetails", {"descriptions": ["a"]}),
     "spec.discoveryHandler.discoveryDetails"),
    ("missing-handler-name", _delete("discoveryHandler.name"), "spec.discoveryHandler.name"),
    ("missing-discovery-handler", _delete("discoveryHandler"), "spec.discoveryHandler"),
    ("resource-name-without-domain", _set("resourceName", "Ascend910"), "spec.resourceName"),
    ("resource-name-kubernetes-io", _set("resourceName", "kubernetes.io/npu"),
     "spec.resourceName"),
    ("negative-grace-period", _set("offlineGracePeriodSeconds", -1),
     "spec.offlineGracePeriodSeconds"),
    ("evict-after-negative", _set("unhealthyDevices", {"evictAfterSeconds": -1}),
     "spec.unhealthyDevices.evictAfterSeconds must be between 0 and 86400"),
    ("evict-after-a-week", _set("unhealthyDevices", {"evictAfterSeconds": 604800}),
     "spec.unhealthyDevices.evictAfterSeconds must be between 0 and 86400"),
    ("evict-after-not-a-number", _set("unhealthyDevices", {"evictAfterSeconds": "30s"}),
     "spec.unhealthyDevices.evictAfterSeconds"),
    ("unhealthy-devices-without-grace", _set("unhealthyDevices", {}),
     "spec.unhealthyDevices.evictAfterSeconds"),
    ("selector-bad-operator",
     _set("nodeSelector", {"matchExpressions": [{"key": "k", "operator": "Equals"}]}),
     "spec.nodeSelector.matchExpressions[0].operator"),
    ("selector-in-without-values",
     _set("nodeSelector", {"matchExpressions": [{"key": "k", "operator": "In"}]}),
     "spec.nodeSelector.matchExpressions[0]"),
    ("selector-exists-with-values",
     _set("nodeSelector", {"matchExpressions": [
         {"key": "k", "operator": "Exists", "values": ["v"]}]}),
     "spec.nodeSelector.matchExpressions[0]"),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [pytest.param(m, f, id=i) for i, m, f in MALFORMED]
)
def test_malformed_configuration_refused(
    control_plane: ControlPlane, namespace: str, mutate: Mutation, field: str
) -> None:
    obj = minimal_configuration("bad")
    mutate(obj["spec"])
    result = apply(control_plane, namespace, obj, check=False)
    assert result.returncode != 0, f"API server accepted a malformed Configuration: {obj}"
    assert field in result.stderr, f"error does not name {field}: {result.stderr}"
    missing = control_plane.kubectl("get", "configuration", "bad", "-n", namespace, check=False)
    assert missing.returncode != 0


def test_configuration_name_that_would_break_resource_names_is_refused(
    control_plane: ControlPlane, namespace: str
) -> None:
    too_long = apply(control_plane, namespace, minimal_configuration("c" * 57), check=False)
    assert too_long.returncode != 0
    assert "at most 56 characters" in too_long.stderr, too_long.stderr
    longest = apply(control_plane, namespace, minimal_configuration("c" * 56))
    assert " created" in longest.stdout


def test_handler_name_is_immutable(control_plane: ControlPlane, namespace: str) -> None:
    obj = minimal_configuration("cam")
    apply(control_plane, namespace, obj)
    changed = copy.deepcopy(obj)
    changed["spec"]["discoveryHandler"]["name"] = "onvif"
    result = apply(control_plane, namespace, changed, check=False)
    assert result.returncode != 0
    assert "spec.discoveryHandler.name" in result.stderr
    assert "immutable" in result.stderr
    stored = get_json(control_plane, namespace, "configuration", "cam")
    assert stored["spec"]["discoveryHandler"]["name"] == "debugEcho"
    # Other fields stay editable.
    changed["spec"]["discoveryHandler"]["name"] = "debugEcho"
    changed["spec"]["capacity"] = 4
    apply(control_plane, namespace, changed)
    assert get_json(control_plane, namespace, "configuration", "cam")["spec"]["capacity"] == 4


def test_agents_merge_nodes_and_slots_with_server_side_apply(
    control_plane: ControlPlane, namespace: str
) -> None:
    name = instance_name("onvif-camera", "uuid:cam-1", shared=True, node="")

    def agent_view(node: str, slot: int) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {"name": name},
                "spec": {"configurationName": "onvif-camera", "shared": True, "capacity": 2,
                         "nodes": [node], "deviceUsage": {slot_id(name, slot): ""}}}

    for node, slot in (("node-a", 0), ("node-b", 1)):
        control_plane.kubectl(
            "apply", "--server-side", f"--field-manager=edgeplug-agent-{node}", "-n", namespace,
            "-f", "-", stdin=json.dumps(agent_view(node, slot)))
    merged = Instance.from_object(get_json(control_plane, namespace, "instance", name))
    assert sorted(merged.spec.nodes) == ["node-a", "node-b"]
    assert set(merged.spec.device_usage) == {slot_id(name, 0), slot_id(name, 1)}
    # node-b's agent withdraws: only its own entries go.
    control_plane.kubectl(
        "apply", "--server-side", "--field-manager=edgeplug-agent-node-b", "-n", namespace,
        "-f", "-", stdin=json.dumps({"apiVersion": API_VERSION, "kind": INSTANCE_KIND,
                                      "metadata": {"name": name}}))
    after = Instance.from_object(get_json(control_plane, namespace, "instance", name))
    assert after.spec.nodes == ("node-a",)
    assert set(after.spec.device_usage) == {slot_id(name, 0)}


def test_instance_rejects_mistakes(control_plane: ControlPlane, namespace: str) -> None:
    base: dict[str, Any] = {
        "apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {"name": "i"},
        "spec": {"configurationName": "c", "deviceUsage": {"i-0": ""}},
    }
    apply(control_plane, namespace, base)
    cases = [
        ({"configurationName": "other"}, "spec.configurationName"),
        ({"shared": True}, "spec.shared"),
        ({"deviceUsage": {"i-0": "C:no-node:"}}, "spec.deviceUsage.i-0"),
        ({"capacity": 0}, "spec.capacity"),
    ]
    for change, field in cases:
        obj = copy.deepcopy(base)
        obj["spec"].update(change)
        result = apply(control_plane, namespace, obj, check=False)
        assert result.returncode != 0, f"accepted {change}"
        assert field in result.stderr, f"error does not name {field}: {result.stderr}"
