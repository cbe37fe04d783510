"""Instance and Configuration services select the right brokers and keep the user's spec."""

from __future__ import annotations

from controller import naming
from controller.brokers import services
from crds.configuration import Configuration
from crds.instance import Instance

SERVICE_SPEC = {"type": "ClusterIP", "ports": [{"name": "grpc", "port": 80, "targetPort": 8083}]}


def make(**spec: object) -> tuple[Configuration, Instance]:
    cfg = Configuration.from_object(
        {
            "metadata": {"name": "cam", "namespace": "ns", "uid": "cfg-uid", "generation": 1},
            "spec": {"discoveryHandler": {"name": "debugEcho"}, **spec},
        }
    )
    inst = Instance.from_object(
        {
            "metadata": {"name": "cam-abcdef", "namespace": "ns", "uid": "inst-uid"},
            "spec": {"configurationName": "cam", "nodes": ["n1"]},
        }
    )
    return cfg, inst


def test_no_spec_no_service() -> None:
    cfg, inst = make()
    assert services.render_instance_service(configuration=cfg, instance=inst) is None
    assert services.render_configuration_service(configuration=cfg) is None


def test_instance_service_selects_that_instances_brokers() -> None:
    cfg, inst = make(instanceServiceSpec=SERVICE_SPEC)
    svc = services.render_instance_service(configuration=cfg, instance=inst)
    assert svc is not None
    assert svc["metadata"]["name"] == "cam-abcdef-svc"
    assert svc["spec"]["selector"] == {
        naming.LABEL_INSTANCE: "cam-abcdef",
        naming.LABEL_COMPONENT: naming.COMPONENT_BROKER,
    }
    assert svc["spec"]["ports"] == SERVICE_SPEC["ports"]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "inst-uid"


def test_configuration_service_selects_all_brokers_of_the_configuration() -> None:
    cfg, _ = make(configurationServiceSpec={**SERVICE_SPEC, "selector": {"user": "ignored"}})
    svc = services.render_configuration_service(configuration=cfg)
    assert svc is not None
    assert svc["metadata"]["name"] == "cam-svc"
    assert svc["spec"]["selector"] == {
        naming.LABEL_CONFIGURATION: "cam",
        naming.LABEL_COMPONENT: naming.COMPONENT_BROKER,
    }
    owner = svc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Configuration", "cfg-uid")
