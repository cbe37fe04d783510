"""Broker, job and service names are deterministic, valid DNS labels, and never collide."""

from __future__ import annotations

import re

import pytest

from agent.dra import slices
from controller import naming
from crds.naming import fallback_instance_name, instance_resource_name
from tests.harness.kubelet_records import is_extended_resource_name

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def test_short_valid_names_are_kept_verbatim() -> None:
    assert naming.broker_pod_name("cam-a1b2c3", "node-1") == "cam-a1b2c3-node-1-pod"
    assert naming.broker_job_name("cam-a1b2c3", 7) == "cam-a1b2c3-7-job"
    assert naming.instance_service_name("cam-a1b2c3") == "cam-a1b2c3-svc"
    assert naming.configuration_service_name("cam") == "cam-svc"


@pytest.mark.parametrize(
    ("instance", "node"),
    [
        ("c" * 60 + "-abcdef", "node-1"),
        ("cam-abcdef", "n" * 200),
        ("cam-abcdef", "Worker.Example.COM"),
        ("x" * 63, "y" * 63),
    ],
)
def test_long_or_odd_names_become_valid_labels(instance: str, node: str) -> None:
    name = naming.broker_pod_name(instance, node)
    assert len(name) <= naming.DNS_LABEL_MAX
    assert DNS_LABEL.match(name), name
    assert name == naming.broker_pod_name(instance, node), "names must be deterministic"


def test_truncated_names_differ_when_inputs_differ() -> None:
    long_node = "n" * 100
    a = naming.broker_pod_name("cam-aaaaaa", long_node + "a")
    b = naming.broker_pod_name("cam-aaaaaa", long_node + "b")
    assert a != b
    # Sanitising must not fold two different node names into one pod name.
    assert naming.broker_pod_name("cam-aaaaaa", "a.b") != naming.broker_pod_name(
        "cam-aaaaaa", "a-b"
    )


def test_service_names_start_with_a_letter() -> None:
    name = naming.configuration_service_name("0cam")
    assert name[0].isalpha()
    assert DNS_LABEL.match(name)


@pytest.mark.parametrize("node", ["node-b", "ip-10-0-1-23.eu-west-1.compute.internal", "m" * 48])
def test_a_fallback_instance_gets_every_derived_name_valid(node: str) -> None:
    """A fallback name (``<name>.<node>``, crds.naming) has a '.' no DNS label allows: its
    broker pods, jobs and service still get valid labels, its DRA device a valid name, and its
    pods' label and resource name a valid value."""
    for configuration in ("cam", "c" * 56):
        instance = fallback_instance_name(configuration, "1a2b3c", node)
        assert instance is not None
        for name in (naming.broker_pod_name(instance, node), naming.broker_job_name(instance, 3),
                     naming.instance_service_name(instance), slices.device_name(instance)):
            assert DNS_LABEL.match(name), name
            assert len(name) <= naming.DNS_LABEL_MAX
        assert is_extended_resource_name(instance_resource_name(instance))
        assert LABEL_VALUE.match(instance)
