"""Broker pods and Jobs rendered from a Configuration and an Instance."""

from __future__ import annotations

import dataclasses
from typing import Any

from controller import naming
from controller.brokers import render
from crds.configuration import Configuration
from crds.instance import Instance

POD_SPEC: dict[str, Any] = {
    "initContainers": [
        {"name": "init", "image": "busybox", "resources": {"requests": {"{{PLACEHOLDER}}": "1"}}}
    ],
    "containers": [
        {
            "name": "broker",
            "image": "ghcr.io/example/broker:1",
            "env": [{"name": "EDGEPLUG_INSTANCE", "value": "user-set"}],
            "resources": {"limits": {"{{PLACEHOLDER}}": "1", "cpu": "100m"}},
        }
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
}


def configuration(**spec: Any) -> Configuration:
    return Configuration.from_object(
        {
            "apiVersion": "edgeplug.io/v1alpha1",
            "kind": "Configuration",
            "metadata": {"name": "cam", "namespace": "ns", "uid": "cfg-uid", "generation": 3},
            "spec": {"discoveryHandler": {"name": "debugEcho"}, **spec},
        }
    )


def instance(nodes: list[str]) -> Instance:
    return Instance.from_object(
        {
            "metadata": {"name": "cam-abcdef", "namespace": "ns", "uid": "inst-uid"},
            "spec": {"configurationName": "cam", "nodes": nodes, "capacity": 2},
        }
    )


def test_pod_requests_instance_resource_in_every_container() -> None:
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC})
    pod = render.render_broker_pod(configuration=cfg, instance=instance(["n1"]), node="n1")
    init, main = pod["spec"]["initContainers"][0], pod["spec"]["containers"][0]
    assert init["resources"]["requests"] == {"edgeplug.io/cam-abcdef": "1"}
    assert main["resources"]["limits"] == {"edgeplug.io/cam-abcdef": "1", "cpu": "100m"}
    assert "{{PLACEHOLDER}}" in POD_SPEC["containers"][0]["resources"]["limits"], "no mutation"


def test_pod_is_pinned_labelled_and_owned() -> None:
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC})
    pod = render.render_broker_pod(configuration=cfg, instance=instance(["n1", "n2"]), node="n2")
    meta = pod["metadata"]
    assert meta["name"] == "cam-abcdef-n2-pod"
    assert meta["namespace"] == "ns"
    assert meta["labels"][naming.LABEL_CONFIGURATION] == "cam"
    assert meta["labels"][naming.LABEL_INSTANCE] == "cam-abcdef"
    assert meta["labels"][naming.LABEL_TARGET_NODE] == "n2"
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "edgeplug.io/v1alpha1",
        "kind": "Instance",
        "name": "cam-abcdef",
        "uid": "inst-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    (term,) = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]
    assert term["matchExpressions"][0]["key"] == "zone", "user's affinity kept"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["EDGEPLUG_INSTANCE"] == "user-set", "user env wins"
    assert env["EDGEPLUG_NODE_NAME"] == "n2"


def test_spec_hash_changes_with_the_spec_only() -> None:
    inst = instance(["n1"])
    a = render.render_broker_pod(
        configuration=configuration(brokerSpec={"brokerPodSpec": POD_SPEC}), instance=inst,
        node="n1",
    )
    b = render.render_broker_pod(
        configuration=configuration(brokerSpec={"brokerPodSpec": POD_SPEC}), instance=inst,
        node="n1",
    )
    changed = {**POD_SPEC, "containers": [{**POD_SPEC["containers"][0], "image": "other:2"}]}
    c = render.render_broker_pod(
        configuration=configuration(brokerSpec={"brokerPodSpec": changed}), instance=inst,
        node="n1",
    )
    key = naming.ANNOTATION_SPEC_HASH
    assert a["metadata"]["annotations"][key] == b["metadata"]["annotations"][key]
    assert a["metadata"]["annotations"][key] != c["metadata"]["annotations"][key]


def test_spec_hash_changes_when_the_device_properties_change() -> None:
    """A radio re-enumerated as /dev/ttyUSB1 keeps its Instance; its broker must be replaced."""
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC})
    before, after = (
        dataclasses.replace(instance(["n1"]), spec=dataclasses.replace(
            instance(["n1"]).spec, broker_properties={"UDEV_DEVNODE": node}))
        for node in ("/dev/ttyUSB0", "/dev/ttyUSB1")
    )
    key = naming.ANNOTATION_SPEC_HASH
    hashes = [
        render.render_broker_pod(configuration=cfg, instance=i, node="n1")["metadata"][
            "annotations"][key]
        for i in (before, after)
    ]
    assert hashes[0] != hashes[1]


def test_job_is_named_with_generation_and_pinned_to_instance_nodes() -> None:
    job_spec = {"backoffLimit": 2, "template": {"spec": {"containers": POD_SPEC["containers"]}}}
    cfg = configuration(brokerSpec={"brokerJobSpec": job_spec})
    job = render.render_broker_job(configuration=cfg, instance=instance(["n2", "n1"]))
    assert job["metadata"]["name"] == "cam-abcdef-3-job"
    template = job["spec"]["template"]
    assert template["metadata"]["labels"][naming.LABEL_INSTANCE] == "cam-abcdef"
    assert template["spec"]["restartPolicy"] == "OnFailure"
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert "edgeplug.io/cam-abcdef" in limits
    (term,) = template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchFields"][0]["values"] == ["n1", "n2"]
    assert job["spec"]["backoffLimit"] == 2


def test_validation_names_the_broken_field() -> None:
    bad = {"containers": [{"name": "Bad_Name", "image": "x"}, {"name": "ok"}]}
    problems = render.validate_broker_spec(configuration(brokerSpec={"brokerPodSpec": bad}))
    assert any("containers[0].name" in p and "Bad_Name" in p for p in problems), problems
    assert any("containers[1].image: required" in p for p in problems), problems
    assert render.validate_broker_spec(configuration(brokerSpec={"brokerPodSpec": POD_SPEC})) == []
    assert render.validate_broker_spec(configuration()) == []


def test_a_dra_broker_claims_its_instance_device_instead_of_the_extended_resource() -> None:
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC}, brokerDeviceAccess="dra")
    pod = render.render_broker_pod(configuration=cfg, instance=instance(["n1"]), node="n1")
    init, main = pod["spec"]["initContainers"][0], pod["spec"]["containers"][0]
    assert init["resources"] == {"claims": [{"name": "edgeplug-device"}]}
    assert main["resources"] == {"limits": {"cpu": "100m"},
                                 "claims": [{"name": "edgeplug-device"}]}
    assert pod["spec"]["resourceClaims"] == [
        {"name": "edgeplug-device", "resourceClaimTemplateName": "cam-abcdef"}]
    plugin = render.render_broker_pod(
        configuration=configuration(brokerSpec={"brokerPodSpec": POD_SPEC}),
        instance=instance(["n1"]), node="n1")
    assert "resourceClaims" not in plugin["spec"]
    # Switching the access mode is a spec change: the brokers roll.
    hashes = {p["metadata"]["annotations"][naming.ANNOTATION_SPEC_HASH] for p in (pod, plugin)}
    assert len(hashes) == 2
    assert "{{PLACEHOLDER}}" in POD_SPEC["containers"][0]["resources"]["limits"], "no mutation"


def test_a_dra_broker_job_claims_through_the_same_template() -> None:
    job_spec = {"template": {"spec": {"containers": [POD_SPEC["containers"][0]]}}}
    cfg = configuration(brokerSpec={"brokerJobSpec": job_spec}, brokerDeviceAccess="dra")
    job = render.render_broker_job(configuration=cfg, instance=instance(["n1"]))
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["resourceClaims"] == [
        {"name": "edgeplug-device", "resourceClaimTemplateName": "cam-abcdef"}]
    assert pod_spec["containers"][0]["resources"]["claims"] == [{"name": "edgeplug-device"}]


def test_the_claim_template_selects_the_instance_device_and_goes_with_the_instance() -> None:
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC}, brokerDeviceAccess="dra")
    template = render.render_claim_template(configuration=cfg, instance=instance(["n1"]))
    assert (template["kind"], template["metadata"]["name"]) == ("ResourceClaimTemplate",
                                                                "cam-abcdef")
    (owner,) = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Instance", "inst-uid")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "edgeplug-device"
    assert request["exactly"]["deviceClassName"] == "cam.ns.edgeplug.io"
    assert request["exactly"]["selectors"] == [{"cel": {
        "expression": '("instance" in device.attributes["edgeplug.io"]'
                      ' && "cam-abcdef" == device.attributes["edgeplug.io"].instance)'}}]
    # The claims made from it carry the brokers' labels.
    assert template["spec"]["metadata"]["labels"][naming.LABEL_INSTANCE] == "cam-abcdef"


def test_dra_brokers_need_the_controllers_device_classes() -> None:
    cfg = configuration(brokerSpec={"brokerPodSpec": POD_SPEC}, brokerDeviceAccess="dra")
    (problem,) = render.validate_broker_spec(cfg, device_classes=False)
    assert problem.startswith("spec.brokerDeviceAccess")
    assert "--dra" in problem
    assert render.validate_broker_spec(cfg, device_classes=True) == []
    plugin = configuration(brokerSpec={"brokerPodSpec": POD_SPEC})
    assert render.validate_broker_spec(plugin, device_classes=False) == []
