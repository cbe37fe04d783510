"""Broker pods, jobs and services follow Instances (real control plane + controller process)."""

from __future__ import annotations

from typing import Any

from controller import naming
from crds.naming import fallback_instance_name, instance_resource_name
from tests.harness import controller_process as h
from tests.harness.controlplane import ControlPlane


def pods_by_name(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in h.broker_pods(plane, namespace)}


def services(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        s["metadata"]["name"]: s
        for s in h.items(plane, f"/api/v1/namespaces/{namespace}/services")
    }


def test_instance_gets_pinned_owned_brokers_and_services(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("cam")
    inst = f"{cfg}-a1b2c3"
    h.apply(control_plane, h.configuration(
        namespace, cfg, pod_spec=h.broker_pod_spec(), instance_service=True,
        configuration_service=True,
    ))
    h.apply(control_plane,
            h.instance(namespace, inst, configuration_name=cfg, nodes=["n-1", "n-2"]))
    pods = h.wait_until(
        lambda: (p := pods_by_name(control_plane, namespace)) and len(p) == 2 and p,
        what="two broker pods, one per node",
    )
    uid = h.get(control_plane, h.instance_path(namespace, inst))
    assert uid is not None
    for node in ("n-1", "n-2"):
        pod = pods[f"{inst}-{node}-pod"]
        labels = pod["metadata"]["labels"]
        assert labels["edgeplug.io/instance"] == inst
        assert labels["edgeplug.io/configuration"] == cfg
        assert labels["edgeplug.io/target-node"] == node
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "Instance", uid["metadata"]["uid"], True,
        )
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {f"edgeplug.io/{inst}": "1"}
    svcs = h.wait_until(
        lambda: (s := services(control_plane, namespace)) and len(s) == 2 and s,
        what="instance and configuration services",
    )
    assert svcs[f"{inst}-svc"]["spec"]["selector"] == {
        "edgeplug.io/instance": inst, "app.kubernetes.io/component": "broker"}
    assert svcs[f"{cfg}-svc"]["spec"]["selector"] == {
        "edgeplug.io/configuration": cfg, "app.kubernetes.io/component": "broker"}

    status = h.wait_until(
        lambda: ((h.get(control_plane, h.configuration_path(namespace, cfg)) or {}).get("status")
                 or {}).get("brokers") == {"desired": 2, "ready": 0}
        and h.get(control_plane, h.configuration_path(namespace, cfg)),
        what="status with 2 desired brokers",
    )
    assert status["status"]["instanceCount"] == 1
    conditions = {c["type"]: c for c in status["status"]["conditions"]}
    assert conditions["BrokersReady"]["status"] == "False"
    assert conditions["BrokersReady"]["message"] == "0/2 brokers ready"

    # The device leaves node n-2: its broker goes, the other stays.
    h.patch(control_plane, "instances.edgeplug.io", namespace, inst, {"spec": {"nodes": ["n-1"]}})
    h.wait_until(
        lambda: set(pods_by_name(control_plane, namespace)) == {f"{inst}-n-1-pod"},
        what="only the n-1 broker left",
    )

    # The device goes offline: Instance deleted → broker and both services gone.
    control_plane.kubectl("delete", "instances.edgeplug.io", inst, "-n", namespace)
    h.wait_until(lambda: not pods_by_name(control_plane, namespace), what="no broker pod left")
    h.wait_until(lambda: not services(control_plane, namespace), what="no service left")


def test_a_fallback_named_instance_gets_its_broker_and_service_like_any_other(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    """A local device whose Akri name was taken is published as ``<name>.<node>``
    (crds.naming.fallback_instance_name): a '.' no broker pod or Service name may hold."""
    cfg, node = h.unique("cam"), "edge-7.example.internal"
    inst = fallback_instance_name(cfg, "a1b2c3", node)
    assert inst is not None
    h.apply(control_plane, h.configuration(
        namespace, cfg, pod_spec=h.broker_pod_spec(), instance_service=True))
    h.apply(control_plane, h.instance(namespace, inst, configuration_name=cfg, nodes=[node]))
    pods = h.wait_until(lambda: pods_by_name(control_plane, namespace) or None,
                        what=f"the broker of {inst}")
    pod = pods[naming.broker_pod_name(inst, node)]
    assert pod["metadata"]["labels"]["edgeplug.io/instance"] == inst
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        instance_resource_name(inst): "1"}
    svcs = h.wait_until(lambda: services(control_plane, namespace) or None,
                        what=f"the service of {inst}")
    assert svcs[naming.instance_service_name(inst)]["spec"]["selector"] == {
        "edgeplug.io/instance": inst, "app.kubernetes.io/component": "broker"}


def jobs_by_name(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {
        j["metadata"]["name"]: j
        for j in h.items(plane, f"/apis/batch/v1/namespaces/{namespace}/jobs")
    }


def generation_of(plane: ControlPlane, namespace: str, cfg: str) -> int:
    obj = h.get(plane, h.configuration_path(namespace, cfg))
    assert obj is not None, f"Configuration {cfg} missing"
    return int(obj["metadata"]["generation"])


def test_job_broker_per_instance_and_new_job_on_spec_change(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("job")
    job_spec = {"backoffLimit": 1, "template": {"spec": h.broker_pod_spec()}}
    h.apply(control_plane, h.configuration(namespace, cfg, job_spec=job_spec))
    first, second = f"{cfg}-aaaaaa", f"{cfg}-bbbbbb"
    for name in (first, second):
        h.apply(control_plane, h.instance(namespace, name, configuration_name=cfg, nodes=["n-1"]))
    generation = generation_of(control_plane, namespace, cfg)
    h.wait_until(
        lambda: set(jobs_by_name(control_plane, namespace))
        == {f"{first}-{generation}-job", f"{second}-{generation}-job"},
        what="one Job per Instance named with the generation",
    )
    job = jobs_by_name(control_plane, namespace)[f"{first}-{generation}-job"]
    template = job["spec"]["template"]["spec"]["containers"][0]
    assert template["resources"]["limits"] == {f"edgeplug.io/{first}": "1"}

    changed = {"backoffLimit": 1, "template": {"spec": h.broker_pod_spec(image="other:2")}}
    h.apply(control_plane, h.configuration(namespace, cfg, job_spec=changed))
    new_generation = generation_of(control_plane, namespace, cfg)
    assert new_generation > generation
    jobs = h.wait_until(
        lambda: (j := jobs_by_name(control_plane, namespace))
        and set(j) == {f"{first}-{new_generation}-job", f"{second}-{new_generation}-job"}
        and j,
        what="the old Jobs replaced by new-generation ones",
    )
    image = jobs[f"{first}-{new_generation}-job"]["spec"]["template"]["spec"]["containers"][0][
        "image"
    ]
    assert image == "other:2"


def test_changed_broker_spec_rolls_the_pods(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("roll")
    inst = f"{cfg}-cccccc"
    h.apply(control_plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec()))
    h.apply(control_plane, h.instance(namespace, inst, configuration_name=cfg, nodes=["n-1"]))
    old = h.wait_until(
        lambda: pods_by_name(control_plane, namespace).get(f"{inst}-n-1-pod"),
        what="the broker pod",
    )
    h.apply(control_plane,
            h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec(image="v2:2")))
    new = h.wait_until(
        lambda: (p := pods_by_name(control_plane, namespace).get(f"{inst}-n-1-pod"))
        and p["metadata"]["uid"] != old["metadata"]["uid"] and p,
        what="the broker pod recreated from the new spec",
    )
    assert new["spec"]["containers"][0]["image"] == "v2:2"
    assert len(pods_by_name(control_plane, namespace)) == 1, "never two brokers for one node"


def condition(plane: ControlPlane, namespace: str, cfg: str, kind: str) -> dict[str, Any] | None:
    obj = h.get(plane, h.configuration_path(namespace, cfg)) or {}
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return dict(found)
    return None


def spec_invalid(plane: ControlPlane, namespace: str, cfg: str, which: str) -> dict[str, Any]:
    """The BrokerSpecValid condition of ``cfg`` once it is False (fails naming ``which``)."""
    found: dict[str, Any] = h.wait_until(
        lambda: (c := condition(plane, namespace, cfg, "BrokerSpecValid"))
        and c["status"] == "False" and c,
        what=f"BrokerSpecValid=False on {which}",
    )
    return found


def events_for(plane: ControlPlane, namespace: str, cfg: str) -> list[dict[str, Any]]:
    return [
        e for e in h.items(plane, f"/api/v1/namespaces/{namespace}/events")
        if (e.get("involvedObject") or {}).get("name") == cfg
    ]


def test_malformed_broker_spec_is_reported_and_others_unaffected(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    bad, refused, good = h.unique("bad"), h.unique("refused"), h.unique("good")
    # Caught by the controller: an invalid container name and a container without image.
    bad_spec = {"containers": [{"name": "Not_A_Label", "image": "x:1"}, {"name": "noimage"}]}
    # Caught only by the API server: a restart policy that does not exist.
    refused_spec = {**h.broker_pod_spec(), "restartPolicy": "Sometimes"}
    h.apply(control_plane, h.configuration(namespace, bad, pod_spec=bad_spec))
    h.apply(control_plane, h.configuration(namespace, refused, pod_spec=refused_spec))
    h.apply(control_plane, h.configuration(namespace, good, pod_spec=h.broker_pod_spec()))
    for cfg in (bad, refused, good):
        h.apply(control_plane, h.instance(namespace, f"{cfg}-dddddd", configuration_name=cfg,
                                          nodes=["n-1"]))

    invalid = spec_invalid(control_plane, namespace, bad, "the malformed Configuration")
    assert invalid["reason"] == "InvalidBrokerSpec"
    assert "containers[0].name" in invalid["message"]
    assert "containers[1].image: required" in invalid["message"]
    h.wait_until(
        lambda: any(e["reason"] == "InvalidBrokerSpec" and e["type"] == "Warning"
                    for e in events_for(control_plane, namespace, bad)),
        what="a Warning Event saying the broker spec is invalid",
    )
    refusal = spec_invalid(control_plane, namespace, refused,
                           "the Configuration the API server refused")
    assert refusal["reason"] == "BrokerCreationRefused"
    assert "restartPolicy" in refusal["message"]
    h.wait_until(
        lambda: any(e["reason"] == "BrokerRefused" and "restartPolicy" in e["message"]
                    for e in events_for(control_plane, namespace, refused)),
        what="a Warning Event with the API server's refusal",
    )
    pods = h.wait_until(
        lambda: (p := pods_by_name(control_plane, namespace)) and p, what="the good broker"
    )
    assert set(pods) == {f"{good}-dddddd-n-1-pod"}
    ok = condition(control_plane, namespace, good, "BrokerSpecValid")
    assert ok is not None
    assert ok["status"] == "True"
    h.wait_until(
        lambda: any(e["reason"] == "PodCreated" for e in events_for(control_plane, namespace,
                                                                      good)),
        what="a PodCreated Event on the good Configuration",
    )


def test_deleted_configuration_takes_instances_brokers_and_services(
    control_plane: ControlPlane, namespace: str, controller: h.ControllerProcess
) -> None:
    cfg = h.unique("gone")
    h.apply(control_plane, h.configuration(namespace, cfg, pod_spec=h.broker_pod_spec(),
                                           instance_service=True, configuration_service=True))
    for suffix in ("eeeeee", "ffffff"):
        h.apply(control_plane, h.instance(namespace, f"{cfg}-{suffix}", configuration_name=cfg,
                                          nodes=["n-1"]))
    h.wait_until(lambda: len(pods_by_name(control_plane, namespace)) == 2, what="two brokers")
    h.wait_until(lambda: len(services(control_plane, namespace)) == 3, what="three services")
    control_plane.kubectl("delete", "configurations.edgeplug.io", cfg, "-n", namespace)
    path = f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/instances"
    h.wait_until(lambda: not h.items(control_plane, path), what="the Instances deleted")
    h.wait_until(lambda: not pods_by_name(control_plane, namespace), what="no broker left")
    h.wait_until(lambda: not services(control_plane, namespace), what="no service left")
    h.wait_until(lambda: h.get(control_plane, h.configuration_path(namespace, cfg)) is None,
                 what="the Configuration itself gone (finalizer released)")
