"""Builds the broker pods and Jobs an Instance should have, as plain Kubernetes dicts. Pure.

``render_broker_pod``, ``render_broker_job`` and ``render_claim_template`` render them;
``validate_broker_spec`` says what is wrong with a Configuration's broker spec. What a broker is
made of: docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from controller import naming
from controller.brokers import broker_claims
from crds.api import RESOURCE_PLACEHOLDER
from crds.configuration import Configuration
from crds.instance import Instance
from crds.naming import instance_resource_name, target_node_label

_CONTAINER_LISTS: Final = ("initContainers", "containers")
_RESOURCE_SECTIONS: Final = ("requests", "limits")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Environment variables the controller adds to every broker container (Akri's brokers read the
#: device's own properties from the env the device plugin's Allocate sets; these say where the
#: broker runs and for which Instance, which Allocate cannot know).
ENV_INSTANCE: Final = "EDGEPLUG_INSTANCE"
ENV_CONFIGURATION: Final = "EDGEPLUG_CONFIGURATION"
ENV_NODE: Final = "EDGEPLUG_NODE_NAME"


def broker_labels(*, configuration: str, instance: str, node: str | None) -> dict[str, str]:
    labels = {
        naming.LABEL_CONFIGURATION: configuration,
        naming.LABEL_INSTANCE: instance,
        naming.LABEL_COMPONENT: naming.COMPONENT_BROKER,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    if node is not None:
        labels[naming.LABEL_TARGET_NODE] = target_node_label(node)
    return labels


def _containers(pod_spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for key in _CONTAINER_LISTS:
        for container in pod_spec.get(key) or ():
            if isinstance(container, dict):
                yield container


def substitute_placeholder(pod_spec: Mapping[str, Any], resource_name: str) -> dict[str, Any]:
    """A copy of ``pod_spec`` with every ``{{PLACEHOLDER}}`` resource key renamed."""
    spec = copy.deepcopy(dict(pod_spec))
    for container in _containers(spec):
        resources = container.get("resources") or {}
        for section in _RESOURCE_SECTIONS:
            amounts = resources.get(section)
            if isinstance(amounts, dict) and RESOURCE_PLACEHOLDER in amounts:
                amounts[resource_name] = amounts.pop(RESOURCE_PLACEHOLDER)
    return spec


def _ask_for_device(pod_spec: Mapping[str, Any], *, configuration: Configuration,
                    instance: Instance) -> dict[str, Any]:
    """A copy of ``pod_spec`` whose ``{{PLACEHOLDER}}`` asks for the Instance's device, by
    extended resource or (``brokerDeviceAccess: dra``) by claim."""
    if not broker_claims.uses_claims(configuration):
        return substitute_placeholder(pod_spec, instance_resource_name(instance.name))
    spec = copy.deepcopy(dict(pod_spec))
    broker_claims.claim_the_device(spec, _containers(spec), instance=instance.name)
    return spec


def render_claim_template(*, configuration: Configuration, instance: Instance
                          ) -> dict[str, Any]:
    """The ResourceClaimTemplate of ``instance``'s brokers (``brokerDeviceAccess: dra``)."""
    labels = broker_labels(configuration=configuration.name, instance=instance.name, node=None)
    return broker_claims.render_claim_template(configuration=configuration, instance=instance,
                                               labels=labels)


def _pin_to_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    """Adds a required node affinity ``metadata.name In nodes`` to every existing term (or one
    new term), keeping whatever affinity the user wrote."""
    requirement = {"key": "metadata.name", "operator": "In", "values": nodes}
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term.setdefault("matchFields", []).append(requirement)
    required["nodeSelectorTerms"] = terms


def _add_env(pod_spec: dict[str, Any], env: Mapping[str, str]) -> None:
    for container in _containers(pod_spec):
        existing = container.setdefault("env", [])
        names = {item.get("name") for item in existing if isinstance(item, dict)}
        existing.extend({"name": k, "value": v} for k, v in env.items() if k not in names)


def render_pod_spec(
    *, configuration: Configuration, instance: Instance, nodes: list[str]
) -> dict[str, Any]:
    """The Configuration's broker pod spec made concrete for ``instance`` on ``nodes``."""
    template = configuration.spec.broker_pod_spec
    if template is None:
        raise ValueError(f"Configuration {configuration.name} has no brokerPodSpec")
    spec = _ask_for_device(template, configuration=configuration, instance=instance)
    _pin_to_nodes(spec, nodes)
    env = {ENV_INSTANCE: instance.name, ENV_CONFIGURATION: configuration.name}
    if len(nodes) == 1:
        env[ENV_NODE] = nodes[0]
    _add_env(spec, env)
    return spec


def hash_of(obj: Any) -> str:
    """A stable hash of a JSON-able object (keys sorted), for the spec-hash annotation."""
    return naming.spec_hash(json.dumps(obj, sort_keys=True, separators=(",", ":")))


def render_broker_pod(
    *, configuration: Configuration, instance: Instance, node: str
) -> dict[str, Any]:
    """The broker pod ``instance`` should have on ``node``."""
    spec = render_pod_spec(configuration=configuration, instance=instance, nodes=[node])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.broker_pod_name(instance.name, node),
            "namespace": instance.namespace,
            "labels": broker_labels(
                configuration=configuration.name, instance=instance.name, node=node
            ),
            "annotations": {naming.ANNOTATION_SPEC_HASH: hash_of(
                {"pod": spec, "device": dict(instance.spec.broker_properties)}
            )},
            "ownerReferences": [instance.owner_reference()],
        },
        "spec": spec,
    }


def render_broker_job(*, configuration: Configuration, instance: Instance) -> dict[str, Any]:
    """The Job ``instance`` should have for the Configuration's current generation. Its pods may
    run on any node that sees the device."""
    job_spec = configuration.spec.broker_job_spec
    if job_spec is None:
        raise ValueError(f"Configuration {configuration.name} has no brokerJobSpec")
    spec = copy.deepcopy(dict(job_spec))
    template = spec.setdefault("template", {})
    pod_spec = _ask_for_device(template.get("spec") or {}, configuration=configuration,
                               instance=instance)
    _pin_to_nodes(pod_spec, sorted(instance.spec.nodes))
    _add_env(pod_spec, {ENV_INSTANCE: instance.name, ENV_CONFIGURATION: configuration.name})
    pod_spec.setdefault("restartPolicy", "OnFailure")
    template["spec"] = pod_spec
    labels = broker_labels(configuration=configuration.name, instance=instance.name, node=None)
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": naming.broker_job_name(instance.name, configuration.generation),
            "namespace": instance.namespace,
            "labels": labels,
            "annotations": {
                naming.ANNOTATION_SPEC_HASH: hash_of(spec),
                naming.ANNOTATION_GENERATION: str(configuration.generation),
            },
            "ownerReferences": [instance.owner_reference()],
        },
        "spec": spec,
    }


def validate_pod_spec(pod_spec: Mapping[str, Any] | None, *, where: str) -> list[str]:
    """Mistakes in a broker pod spec that would make every broker creation fail, each naming
    the field, so the Configuration's status can say why before the API server refuses it."""
    if pod_spec is None:
        return []
    problems: list[str] = []
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.append(f"{where}.containers: at least one container is required")
    for key in _CONTAINER_LISTS:
        items = pod_spec.get(key) or []
        if not isinstance(items, list):
            problems.append(f"{where}.{key}: must be a list")
            continue
        for index, container in enumerate(items):
            path = f"{where}.{key}[{index}]"
            if not isinstance(container, dict):
                problems.append(f"{path}: must be an object")
                continue
            name = container.get("name")
            if not isinstance(name, str) or not name:
                problems.append(f"{path}.name: required")
            elif len(name) > naming.DNS_LABEL_MAX or not _DNS_LABEL.match(name):
                problems.append(f"{path}.name: {name!r} is not a valid DNS label")
            image = container.get("image")
            if not isinstance(image, str) or not image.strip():
                problems.append(f"{path}.image: required")
    return problems


def validate_broker_spec(configuration: Configuration, *, device_classes: bool = True
                         ) -> list[str]:
    """Problems with the Configuration's broker spec (empty when it is fine or absent);
    ``device_classes``: whether this controller keeps DeviceClasses (``--dra``), which brokers
    that claim their device need."""
    spec = configuration.spec
    if spec.has_broker and broker_claims.uses_claims(configuration) and not device_classes:
        return ["spec.brokerDeviceAccess: dra needs DeviceClasses: run the controller with --dra"
                " (docs/dra.md)"]
    if spec.broker_pod_spec is not None:
        return validate_pod_spec(spec.broker_pod_spec, where="spec.brokerSpec.brokerPodSpec")
    if spec.broker_job_spec is not None:
        template = (spec.broker_job_spec.get("template") or {}).get("spec")
        if not isinstance(template, dict):
            return ["spec.brokerSpec.brokerJobSpec.template.spec: required"]
        return validate_pod_spec(template, where="spec.brokerSpec.brokerJobSpec.template.spec")
    return []
