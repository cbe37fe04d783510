"""The udev example Configurations are true for the handler: their details parse and say what
their comments say (the CRD schema side is checked with every example in test_crd_views)."""

from __future__ import annotations

from importlib import resources

import yaml

from discovery_handlers.udev import handler
from discovery_handlers.udev.matching import matches
from tests.unit.test_udev_matching import TTY


def details_of(example: str) -> str:
    text = resources.files("crds").joinpath("examples", example).read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    assert config["spec"]["discoveryHandler"]["name"] == "udev"
    details: str = config["spec"]["discoveryHandler"]["discoveryDetails"]
    return details


def test_serial_radio_example_selects_the_ftdi_tty_read_write() -> None:
    parsed = handler.parse_details(details_of("udev-serial-radio.yaml"), {})
    assert parsed.permissions == "rw"
    [rule] = parsed.rules
    assert matches(rule, TTY)


def test_video_example_is_akris_rule() -> None:
    parsed = handler.parse_details(details_of("udev.yaml"), {})
    [rule] = parsed.rules
    assert str(rule) == 'KERNEL=="video[0-9]*", ENV{ID_V4L_CAPABILITIES}==":capture:"'
    assert parsed.group_recursive is False
