"""Instance, CDI, slot and resource names must be Akri's, byte for byte.

The first two rows are names Akri's own documentation prints (the debugEcho Configuration
``akri-debug-echo-foo`` with shared devices ``foo0`` and ``foo1``); the others pin the rule for
local devices (node appended to the id before hashing) and Akri's ``.``/``/`` replacement.
"""

from __future__ import annotations

import re

import pytest

from crds.cli import main as cli_main
from crds.naming import (
    DNS_LABEL_MAX,
    cdi_name,
    configuration_resource_name,
    fallback_instance_name,
    instance_digest,
    instance_name,
    instance_name_from_digest,
    instance_resource_name,
    slot_id,
    slot_index,
)

KNOWN_NAMES = [
    # configuration, device id, shared, node, expected Instance name
    ("akri-debug-echo-foo", "foo0", True, "node-a", "akri-debug-echo-foo-8120fe"),  # Akri docs
    ("akri-debug-echo-foo", "foo1", True, "node-b", "akri-debug-echo-foo-a19705"),  # Akri docs
    ("udev-video", "/dev/video0", False, "workera", "udev-video-46ee11"),
    ("udev-video", "/dev/video0", False, "workerb", "udev-video-48825d"),
    ("opcua", "opc.tcp://10.0.0.1:5657/", True, "", "opcua-0baabd"),
    ("onvif-camera", "uuid:3fa1fe68-b915-4053-a3e1-ac15a21f5f91", True, "n1",
     "onvif-camera-bb0879"),
    ("cfg", "video1", True, "node-a", "cfg-cf97ff"),
    ("cfg", "video1", False, "node-b", "cfg-dfdbf3"),
    ("cfg.v1", "video1", False, "node-a", "cfg-v1-00776f"),  # '.' becomes '-'
]


@pytest.mark.parametrize(("configuration", "device_id", "shared", "node", "expected"), KNOWN_NAMES)
def test_instance_name_matches_akri(
    configuration: str, device_id: str, shared: bool, node: str, expected: str
) -> None:
    assert instance_name(configuration, device_id, shared=shared, node=node) == expected


def test_shared_devices_name_alike_on_every_node_local_ones_do_not() -> None:
    # Akri's own test of generate_instance_digest, as properties.
    shared_a = instance_digest("video1", shared=True, node="node-a")
    shared_b = instance_digest("video1", shared=True, node="node-b")
    local_a = instance_digest("video1", shared=False, node="node-a")
    local_b = instance_digest("video1", shared=False, node="node-b")
    assert shared_a == shared_b
    assert local_a != local_b
    assert local_a != shared_a
    for digest in (shared_a, local_a, local_b):
        assert re.fullmatch(r"[0-9a-f]{6}", digest), digest
    # The digests of KNOWN_NAMES' cfg rows, and of Akri's documented foo0 (akri-...-8120fe).
    assert (shared_a, local_b) == ("cf97ff", "dfdbf3")
    assert instance_digest("foo0", shared=True, node="") == "8120fe"


def test_cdi_name_is_vendor_class_equals_digest() -> None:
    assert cdi_name("akri-debug-echo-foo", "8120fe") == "edgeplug.io/akri-debug-echo-foo=8120fe"


def test_slot_ids_are_instance_dash_index_and_parse_back() -> None:
    assert slot_id("onvif-camera-bb0879", 0) == "onvif-camera-bb0879-0"
    assert slot_id("onvif-camera-bb0879", 11) == "onvif-camera-bb0879-11"
    assert slot_index("onvif-camera-bb0879", "onvif-camera-bb0879-11") == 11
    with pytest.raises(ValueError, match="not a slot"):
        slot_index("onvif-camera-bb0879", "other-bb0879-1")
    with pytest.raises(ValueError, match="not a slot"):
        slot_index("onvif-camera-bb0879", "onvif-camera-bb0879-x")
    with pytest.raises(ValueError, match=">= 0"):
        slot_id("i", -1)


def test_resource_names() -> None:
    assert instance_resource_name("udev-video-46ee11") == "edgeplug.io/udev-video-46ee11"
    assert configuration_resource_name("udev-video", None) == "edgeplug.io/udev-video"
    assert configuration_resource_name("cfg.v1", "") == "edgeplug.io/cfg-v1"
    assert (
        configuration_resource_name("ascend-910", "huawei.com/Ascend910") == "huawei.com/Ascend910"
    )


def test_cli_prints_instance_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["instance-name", "akri-debug-echo-foo", "foo0", "--shared"]) == 0
    assert capsys.readouterr().out == "akri-debug-echo-foo-8120fe\n"
    assert cli_main(["instance-name", "udev-video", "/dev/video0", "--node", "workera"]) == 0
    assert capsys.readouterr().out == "udev-video-46ee11\n"


def test_cli_refuses_local_device_without_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["instance-name", "udev-video", "/dev/video0"]) == 2
    assert "--node" in capsys.readouterr().err


_RESOURCE_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def test_fallback_names_carry_the_node_after_the_first_dot_within_resource_name_limits() -> None:
    """What the agents' Instance policy reads: all after the first '.' is the node (Akri names
    hold no '.'); what the kubelet needs: 63 characters after edgeplug.io/."""
    assert fallback_instance_name("cam", "1a2b3c", "node-b") == "cam-1a2b3c.node-b"
    assert fallback_instance_name("cam.v1", "1a2b3c", "n.b") == "cam-v1-1a2b3c.n.b"
    seen: set[str] = set()
    for configuration in ("cam", "c" * 56, "c" * 40 + ".x", "c" * 40 + ".y", "d" * 30):
        for node in ("n", "ip-10-0-1-23.eu-west-1.compute.internal", "m" * 48):
            name = fallback_instance_name(configuration, "1a2b3c", node)
            assert name is not None, (configuration, node)
            head, _, after = name.partition(".")
            assert after == node
            assert "." not in instance_name_from_digest(configuration, "1a2b3c")
            assert len(name) <= DNS_LABEL_MAX
            assert _RESOURCE_NAME_PART.match(name)
            assert head.endswith("-1a2b3c")  # the digest stays last (broker env suffixes)
            seen.add(name)
    assert len(seen) == 15  # configurations cut alike stay apart by their hash
    long = fallback_instance_name("c" * 56, "1a2b3c", "m" * 48)
    assert long is not None
    assert long.startswith("c-")
    assert "--1a2b3c." in long
    # A cut form never equals a whole one: its digest follows "--", an Akri name's never does.
    assert fallback_instance_name(long.partition(".")[0].rpartition("--")[0], "1a2b3c",
                                  "m" * 48) != long
    assert fallback_instance_name("c" * 56, "1a2b3c", "m" * 49) is None
    assert fallback_instance_name("cam", "1a2b3c", "m" * 52) is not None
    assert fallback_instance_name("cam", "1a2b3c", "m" * 53) is None
    assert fallback_instance_name("cam", "1a2b3c", "m" * 200) is None
