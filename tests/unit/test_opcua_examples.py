"""The shipped OPC-UA examples are true for the handler: their details parse, the secure one
with the certificate and key from its Secret."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from discovery_handlers.contract import Secret
from discovery_handlers.opcua import handler
from discovery_handlers.opcua.details import FilterAction, SecurityMode


def example(name: str) -> dict[str, Any]:
    text = resources.files("crds").joinpath("examples", name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def test_example_configuration_parses() -> None:
    spec = example("opcua.yaml")["spec"]["discoveryHandler"]
    details = handler.parse_details(spec["discoveryDetails"], {})
    assert details.discovery_urls == ("opc.tcp://opcua-lds.factory.example:4840/",
                                      "opc.tcp://10.1.2.3:4841/")
    assert details.application_names.action is FilterAction.INCLUDE
    assert details.application_names.keeps("Thermometer-Line-2")
    assert details.security is None


def test_secure_example_parses_with_its_secret() -> None:
    spec = example("opcua-secure.yaml")["spec"]["discoveryHandler"]
    values = example("opcua-client-cert-secret.yaml")["stringData"]
    properties = {
        prop["name"]: Secret(values[prop["valueFrom"]["secretKeyRef"]["key"]].encode())
        for prop in spec["discoveryProperties"]
    }
    details = handler.parse_details(spec["discoveryDetails"], properties)
    assert details.security is not None
    assert (details.security.policy, details.security.mode) == (
        "Basic256Sha256", SecurityMode.SIGN_AND_ENCRYPT)
