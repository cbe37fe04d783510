"""Instance, CDI, slot and resource names must be Akri's, byte for byte.

The first two rows are names Akri's own documentation prints (the debugEcho Configuration
``akri-debug-echo-foo`` with shared devices ``foo0`` and ``foo1``); the others pin the rule for
local devices (node appended to the id before hashing) and Akri's ``.``/``/`` replacement.
Akri's 3-byte digest collides (``COLLIDING``: pairs found among 3,000 and 10,000 ids); the
device digest and collision names keep both devices of such a pair, as the tables below say.
"""

from __future__ import annotations

import re

import pytest

from cli.main import main as cli_main
from crds.naming import (
    DNS_LABEL_MAX,
    Planned,
    cdi_name,
    collision_instance_name,
    configuration_resource_name,
    device_digest,
    fallback_instance_name,
    instance_digest,
    instance_name,
    instance_name_from_digest,
    instance_names,
    instance_resource_name,
    name_digest,
    plan_names,
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


def test_cli_prints_every_name_a_device_may_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["instance-name", "cams", "d2318", "--shared", "--all"]) == 0
    assert capsys.readouterr().out == "cams-6db282\ncams-a254a46d30284e12\n"
    assert cli_main(["instance-name", "cams", "/dev/video7496", "--node", "edge-1", "--all"]) == 0
    digest = device_digest("/dev/video7496", shared=False, node="edge-1")
    assert capsys.readouterr().out.split() == [
        "cams-772f72", "cams-772f72.edge-1", f"cams-{digest}", f"cams-{digest}.edge-1"]


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


COLLIDING = [
    # configuration, two device ids, shared, node, their one Akri name, their device digests
    ("cams", "d2318", "d2629", True, "", "cams-6db282",
     ("a254a46d30284e12", "3b808b732b3924ae")),  # the report's pair, debugEcho ids
    ("cams", "/dev/video7496", "/dev/video9815", False, "edge-1", "cams-772f72",
     ("", "")),
    ("udev-video", "d3491", "d5658", False, "worker-a", "udev-video-0558f2", ("", "")),
]


@pytest.mark.parametrize(("configuration", "first", "second", "shared", "node", "akri",
                          "digests"), COLLIDING)
def test_colliding_devices_share_an_akri_name_and_differ_in_their_device_digest(
        configuration: str, first: str, second: str, shared: bool, node: str, akri: str,
        digests: tuple[str, str]) -> None:
    assert instance_name(configuration, first, shared=shared, node=node) == akri
    assert instance_name(configuration, second, shared=shared, node=node) == akri
    long = [device_digest(d, shared=shared, node=node) for d in (first, second)]
    assert long[0] != long[1]
    for digest in long:
        assert re.fullmatch(r"[0-9a-f]{16}", digest), digest
    if digests != ("", ""):
        assert tuple(long) == digests
    plan = plan_names(configuration, [second, first], shared=shared, node=node)
    names = {plan[first].name, plan[second].name}
    assert None not in names
    assert len(names) == 2
    assert akri in names
    # The smaller device digest keeps the Akri name; the other is told whose it is.
    keeper, other = sorted((first, second), key=lambda d: device_digest(d, shared=shared,
                                                                        node=node))
    assert plan[keeper].name == akri
    assert plan[keeper].akri_holder == ""
    assert plan[other].akri_holder == plan[keeper].digest
    assert plan[other].akri_name == akri
    # Whatever order the handler lists them in.
    assert plan_names(configuration, [first, second], shared=shared, node=node) == plan


def test_shared_collision_names_are_the_devices_own_on_every_node() -> None:
    a = instance_names("cams", "d2318", shared=True, node="node-a")
    b = instance_names("cams", "d2318", shared=True, node="node-b")
    assert a == b == ("cams-6db282", "cams-a254a46d30284e12")
    assert instance_names("cams", "d2629", shared=True, node="") == (
        "cams-6db282", "cams-3b808b732b3924ae")
    local = instance_names("cams", "/dev/video7496", shared=False, node="edge-1")
    digest = device_digest("/dev/video7496", shared=False, node="edge-1")
    assert local == ("cams-772f72", "cams-772f72.edge-1", f"cams-{digest}",
                     f"cams-{digest}.edge-1")
    assert instance_names("cams", "/dev/video7496", shared=False, node="edge-2")[0] \
        != local[0]


#: plan_names over one device list and what the API server already holds (name → recorded
#: deviceDigest, "" for an Instance of no device of ours): device id → name given.
D2318, D2629 = "a254a46d30284e12", "3b808b732b3924ae"
PLANS = [
    # nothing held: the smaller digest (d2629's) keeps the Akri name
    ({}, {"d2318": "cams-a254a46d30284e12", "d2629": "cams-6db282"}),
    # another node's create won the Akri name for d2318: the API server's word stands
    ({"cams-6db282": D2318}, {"d2318": "cams-6db282", "d2629": "cams-3b808b732b3924ae"}),
    # each already published (a restart): kept
    ({"cams-6db282": D2318, "cams-3b808b732b3924ae": D2629},
     {"d2318": "cams-6db282", "d2629": "cams-3b808b732b3924ae"}),
    # the Akri name is another Instance's (a squat, or a device gone): both take their own
    ({"cams-6db282": ""},
     {"d2318": "cams-a254a46d30284e12", "d2629": "cams-3b808b732b3924ae"}),
    # ... and a collision name squatted too leaves that device unpublished
    ({"cams-6db282": "", "cams-a254a46d30284e12": ""},
     {"d2318": None, "d2629": "cams-3b808b732b3924ae"}),
]


@pytest.mark.parametrize(("held", "expected"), PLANS)
def test_plan_names(held: dict[str, str], expected: dict[str, str | None]) -> None:
    plan = plan_names("cams", ["d2318", "d2629", "d2318"], shared=True, node="n1", held=held)
    assert {d: p.name for d, p in plan.items()} == expected


def test_a_local_collision_keeps_the_node_in_the_second_name() -> None:
    plan = plan_names("cams", ["/dev/video7496", "/dev/video9815"], shared=False, node="edge-1")
    assert sorted(p.name or "" for p in plan.values()) == ["cams-772f72", "cams-772f72.edge-1"]
    # With the Akri name another node's, the fallback goes to one, the collision name to the
    # other (whose fallback is held by the first).
    held = plan_names("cams", ["/dev/video7496", "/dev/video9815"], shared=False,
                      node="edge-1", held={"cams-772f72": ""})
    names = sorted(p.name or "" for p in held.values())
    assert names[1] == "cams-772f72.edge-1"
    assert re.fullmatch(r"cams-[0-9a-f]{16}", names[0]), names


def test_collision_names_fit_resource_names_and_never_equal_an_akri_name() -> None:
    digest = device_digest("d2318", shared=True, node="")
    assert collision_instance_name("cams", digest) == f"cams-{digest}"
    assert collision_instance_name("cam.v1", digest) == f"cam-v1-{digest}"
    seen = set()
    for configuration in ("c" * 46, "c" * 47, "c" * 62, "c" * 61 + ".x", "c" * 61 + ".y"):
        name = collision_instance_name(configuration, digest)
        assert len(name) <= DNS_LABEL_MAX, name
        assert _RESOURCE_NAME_PART.match(name)
        assert name.endswith(f"-{digest}")
        assert name_digest(name) == digest
        seen.add(name)
    assert len(seen) == 5
    assert len(collision_instance_name("c" * 46, digest)) == DNS_LABEL_MAX
    # An Akri name ends in "-" and 6 hex characters, a collision name in 16 hex characters.
    for configuration in ("cams", f"cams-{digest[:9]}", "a" * 60):
        akri = instance_name(configuration, "x", shared=True, node="")
        assert not re.search(r"[0-9a-f]{7}$", akri), akri
    assert name_digest("cams-6db282") == "6db282"
    assert name_digest("cams-6db282.node-a") == "6db282"
    assert name_digest(f"cams-{digest}.node-a") == digest


def test_the_cdi_names_of_colliding_devices_differ() -> None:
    plan = plan_names("cams", ["d2318", "d2629"], shared=True, node="")
    cdi = {cdi_name("cams", name_digest(p.name or "")) for p in plan.values()}
    assert cdi == {"edgeplug.io/cams=6db282", "edgeplug.io/cams=a254a46d30284e12"}


def test_planned_reads_as_a_row() -> None:
    assert plan_names("cams", ["d2629"], shared=True, node="") == {
        "d2629": Planned("d2629", D2629, "cams-6db282", "cams-6db282")}
