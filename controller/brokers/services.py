"""Builds the Instance and Configuration Services, as plain Kubernetes dicts. Pure.

``render_instance_service`` and ``render_configuration_service`` keep the user's ServiceSpec and
set the selector (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from controller import naming
from controller.brokers.render import hash_of
from crds.configuration import Configuration
from crds.instance import Instance


def _labels(*, configuration: str, instance: str | None, component: str) -> dict[str, str]:
    labels = {
        naming.LABEL_CONFIGURATION: configuration,
        naming.LABEL_COMPONENT: component,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    if instance is not None:
        labels[naming.LABEL_INSTANCE] = instance
    return labels


def instance_service_selector(instance: str) -> dict[str, str]:
    return {naming.LABEL_INSTANCE: instance, naming.LABEL_COMPONENT: naming.COMPONENT_BROKER}


def configuration_service_selector(configuration: str) -> dict[str, str]:
    return {
        naming.LABEL_CONFIGURATION: configuration,
        naming.LABEL_COMPONENT: naming.COMPONENT_BROKER,
    }


def render_instance_service(
    *, configuration: Configuration, instance: Instance
) -> dict[str, Any] | None:
    """The Instance's service, or ``None`` when the Configuration asks for none."""
    return _service(
        template=configuration.spec.instance_service_spec,
        selector=instance_service_selector(instance.name),
        name=naming.instance_service_name(instance.name),
        namespace=instance.namespace,
        labels=_labels(
            configuration=configuration.name,
            instance=instance.name,
            component=naming.COMPONENT_INSTANCE_SERVICE,
        ),
        owner=instance.owner_reference(),
    )


def render_configuration_service(*, configuration: Configuration) -> dict[str, Any] | None:
    """The Configuration's service, or ``None`` when it asks for none."""
    return _service(
        template=configuration.spec.configuration_service_spec,
        selector=configuration_service_selector(configuration.name),
        name=naming.configuration_service_name(configuration.name),
        namespace=configuration.namespace,
        labels=_labels(
            configuration=configuration.name,
            instance=None,
            component=naming.COMPONENT_CONFIGURATION_SERVICE,
        ),
        owner=configuration.owner_reference(),
    )


def _service(
    *,
    template: Mapping[str, Any] | None,
    selector: dict[str, str],
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: Mapping[str, Any],
) -> dict[str, Any] | None:
    """A Service from the user's ServiceSpec, selecting ``selector`` and owned by ``owner``."""
    if template is None:
        return None
    spec = copy.deepcopy(dict(template))
    spec["selector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {naming.ANNOTATION_SPEC_HASH: hash_of(spec)},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }
