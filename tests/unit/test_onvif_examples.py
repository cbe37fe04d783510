"""The shipped ONVIF example is true for the handler: its details parse, its properties resolve."""

from __future__ import annotations

from importlib import resources

import yaml

from discovery_handlers.contract import Secret
from discovery_handlers.onvif import handler
from discovery_handlers.onvif.details import FilterAction


def test_example_configuration_parses_with_its_secret() -> None:
    examples = resources.files("crds").joinpath("examples")
    configuration = yaml.safe_load(examples.joinpath("onvif.yaml").read_text(encoding="utf-8"))
    secret = yaml.safe_load(
        examples.joinpath("onvif-auth-secret.yaml").read_text(encoding="utf-8")
    )
    spec = configuration["spec"]["discoveryHandler"]
    values = secret["stringData"]
    properties = {
        prop["name"]: Secret(values[prop["valueFrom"]["secretKeyRef"]["key"]].encode())
        for prop in spec["discoveryProperties"]
    }
    details = handler.parse_details(spec["discoveryDetails"], properties)
    assert details.scopes is not None
    assert details.scopes.action is FilterAction.INCLUDE
    assert len(details.unicast_targets) == 14  # the hosts of 10.0.8.0/28
    default = details.credentials.lookup("00000000-0000-0000-0000-000000000000")
    assert default is not None
    assert default.username == "camera-admin"
    own = details.credentials.lookup("urn:uuid:3fa1fe68-b915-4053-a3e1-ac15a21f5f91")
    assert own is not None
    assert own.username == "dock-viewer"
