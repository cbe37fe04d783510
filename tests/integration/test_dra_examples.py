"""The DRA examples (crds/examples/dra/) are accepted by the real API server (schema and CEL
selectors compiled by it, ``--dry-run=server``) and select by attributes the agent publishes
for their handler's properties."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml

from crds import dra
from tests.harness.controlplane import ControlPlane

EXAMPLES = resources.files("crds").joinpath("examples", "dra")
#: The property each example selects by, as its handler names it.
SELECTED_PROPERTY = {
    "debug-echo.yaml": "DEBUG_ECHO_DESCRIPTION",
    "onvif.yaml": "ONVIF_DEVICE_IP_ADDRESS",
    "opcua.yaml": "OPCUA_DISCOVERY_URL",
    "udev.yaml": "UDEV_DEVNODE",
    "ascend.yaml": "ASCEND_CHIP_MODEL",
    "ascend-partitions.yaml": "ASCEND_VNPU_TYPE",
    "udev-serial-radio.yaml": None,
}
_ATTRIBUTE = re.compile(r'device\.attributes\["edgeplug\.io"\]\.([a-z_0-9]+)')


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.name.endswith(".yaml")) == sorted(
        SELECTED_PROPERTY)


@pytest.mark.parametrize("example", sorted(SELECTED_PROPERTY))
def test_example_is_accepted_and_selects_a_published_attribute(
    control_plane: ControlPlane, namespace: str, example: str
) -> None:
    text = EXAMPLES.joinpath(example).read_text(encoding="utf-8")
    template = next(d for d in yaml.safe_load_all(text) if d["kind"] == "ResourceClaimTemplate")
    used = set(_ATTRIBUTE.findall(text))
    prop = SELECTED_PROPERTY[example]
    if prop is None:
        assert used == set()
    else:
        published = {dra.attribute_name(prop), dra.ALIASES.get(prop, "")}
        assert used, "the example selects by an attribute"
        assert used <= published, (used, published)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=text)
