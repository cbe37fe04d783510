"""Filters, ids and properties of ONVIF cameras, over tables: what brokers and users see."""

from __future__ import annotations

import pytest

from discovery_handlers.onvif import cameras as c
from discovery_handlers.onvif import handler
from discovery_handlers.onvif.scanner import description_due
from discovery_handlers.onvif.wsd_messages import Match

UUID = "3fa1fe68-b915-4053-a3e1-ac15a21f5f91"
URL = "http://10.0.0.5:8080/onvif/device_service"


def camera(
    *,
    xaddrs: tuple[str, ...] = (URL,),
    source: str = "10.0.0.5",
    scopes: tuple[str, ...] = ("onvif://www.onvif.org/location/dock",),
    mac: str = "aa:bb:cc:dd:ee:01",
    described: bool = True,
) -> c.Camera:
    description = (
        c.Description(
            mac=mac,
            manufacturer="Acme",
            model="X1",
            firmware="2.1",
            streams=(
                c.Stream("main", "rtsp://10.0.0.5/main"),
                c.Stream("sub.1", "rtsp://10.0.0.5/s"),
            ),
        )
        if described
        else None
    )
    return c.Camera(
        match=Match(uuid=UUID, xaddrs=xaddrs, scopes=scopes),
        source=source,
        last_seen=0.0,
        description=description,
    )


def test_device_id_and_properties_are_akris_then_ours() -> None:
    device = c.device_of(camera())
    assert device.id == f"{URL}-{UUID}"
    assert device.properties == {
        "ONVIF_DEVICE_SERVICE_URL": URL,
        "ONVIF_DEVICE_UUID": UUID,
        "ONVIF_DEVICE_IP_ADDRESS": "10.0.0.5",
        "ONVIF_DEVICE_MAC_ADDRESS": "aa:bb:cc:dd:ee:01",
        "ONVIF_DEVICE_MANUFACTURER": "Acme",
        "ONVIF_DEVICE_MODEL": "X1",
        "ONVIF_DEVICE_FIRMWARE_VERSION": "2.1",
        "ONVIF_DEVICE_PROFILES": "main,sub.1",
        "ONVIF_STREAM_URI": "rtsp://10.0.0.5/main",
        "ONVIF_STREAM_URI_MAIN": "rtsp://10.0.0.5/main",
        "ONVIF_STREAM_URI_SUB_1": "rtsp://10.0.0.5/s",
    }
    assert device.health.healthy


def test_unhealthy_camera_keeps_its_properties_and_says_why() -> None:
    cam = camera()
    cam.healthy, cam.reason = False, "GetSystemDateAndTime: no answer within 3s"
    device = c.device_of(cam)
    assert not device.health.healthy
    assert "no answer" in device.health.reason
    assert device.properties["ONVIF_DEVICE_MODEL"] == "X1"


@pytest.mark.parametrize(
    ("xaddrs", "source", "url", "ip"),
    [
        ((URL,), "10.0.0.5", URL, "10.0.0.5"),
        (("http://10.9.9.9/a", URL), "10.0.0.5", URL, "10.0.0.5"),  # the one it answered from
        (("http://cam.local/onvif/device_service",), "10.0.0.7", None, "10.0.0.7"),
        (("http://[fd00::5]:80/onvif/device_service",), "fd00::5", None, "fd00::5"),
        # several XAddrs, none on the sender's address: same family first, then a host name,
        # then the other family; loopback and zoneless link-local last
        (("http://[fe80::1]/d", "http://127.0.0.1/d", "http://10.0.0.6/d"), "10.0.0.5",
         "http://10.0.0.6/d", "10.0.0.6"),
        (("http://[fd00::6]/d", "http://cam.local/d", "http://10.0.0.6/d"), "10.0.0.5",
         "http://10.0.0.6/d", "10.0.0.6"),
        (("http://[fd00::6]/d", "http://cam.local/d"), "10.0.0.5", "http://cam.local/d",
         "10.0.0.5"),
        (("http://[fe80::6]/d", "http://[fd00::6]/d"), "10.0.0.5", "http://[fd00::6]/d",
         "fd00::6"),
        (("http://10.0.0.6/d", "http://[fd00::6]/d"), "fd00::9", "http://[fd00::6]/d", "fd00::6"),
    ],
)
def test_service_url_and_ip(
    xaddrs: tuple[str, ...], source: str, url: str | None, ip: str
) -> None:
    cam = camera(xaddrs=xaddrs, source=source)
    assert cam.service_url == (url or xaddrs[0])
    assert c.ip_address_of(cam) == ip


@pytest.mark.parametrize(
    ("uri", "stripped"),
    [
        ("rtsp://admin:pw@10.0.0.5:554/live", "rtsp://10.0.0.5:554/live"),
        ("rtsp://admin@10.0.0.5/live?ch=1", "rtsp://10.0.0.5/live?ch=1"),
        ("rtsp://[fd00::5]:554/live", "rtsp://[fd00::5]:554/live"),
        ("RTSP://10.0.0.5/a", "rtsp://10.0.0.5/a"),
        ("javascript:alert(1)", None),
        ("file:///etc/passwd", None),
        ("rtsp:///nohost", None),
        ("rtsp://10.0.0.5:99999/", None),
        ("", None),
    ],
)
def test_stream_uris_lose_their_credentials(uri: str, stripped: str | None) -> None:
    assert c.strip_credentials(uri) == stripped


FILTER_CASES = [
    # (details, camera kwargs, kept)
    ("", {}, True),
    ("ipAddresses: {items: [10.0.0.5]}", {}, True),
    ("ipAddresses: {items: [10.0.0.0/24], action: Exclude}", {}, False),
    ("ipAddresses: {items: [10.0.1.5]}", {}, False),
    ("ipAddresses: {items: [10.0.1.5], action: Exclude}", {}, True),
    ("macAddresses: {items: ['AA-BB-CC-DD-EE-01']}", {}, True),
    ("macAddresses: {items: ['aa:bb:cc:dd:ee:01'], action: Exclude}", {}, False),
    ("macAddresses: {items: ['aa:bb:cc:dd:ee:01']}", {"mac": ""}, False),  # unknown MAC
    ("macAddresses: {items: ['aa:bb:cc:dd:ee:01'], action: Exclude}", {"mac": ""}, True),
    ("scopes: {items: [onvif://www.onvif.org/location/dock]}", {}, True),
    ("scopes: {items: [onvif://www.onvif.org/location/dock], action: Exclude}", {}, False),
    ("scopes: {items: [onvif://www.onvif.org/location/gate]}", {}, False),
    ("scopes: {items: [onvif://www.onvif.org/location/gate], action: Exclude}", {}, True),
    (f"uuids: {{items: ['urn:uuid:{UUID.upper()}']}}", {}, True),
    (f"uuids: {{items: [{UUID}], action: Exclude}}", {}, False),
    ("uuids: {items: [00000000-0000-0000-0000-000000000000]}", {}, False),
    ("{ipAddresses: {items: [10.0.0.5]}, scopes: {items: [x]}}", {}, False),  # all must keep
]


@pytest.mark.parametrize(("text", "kwargs", "kept"), FILTER_CASES)
def test_filters(text: str, kwargs: dict[str, str], kept: bool) -> None:
    details = handler.parse_details(text, {})
    assert c.passes_filters(details, camera(**kwargs)) is kept  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("", True),
        ("macAddresses: {items: ['aa:bb:cc:dd:ee:01']}", True),  # its MAC is not known yet
        ("macAddresses: {items: ['aa:bb:cc:dd:ee:01'], action: Exclude}", True),
        ("ipAddresses: {items: [10.0.1.5]}", False),
        ("scopes: {items: [onvif://www.onvif.org/location/dock], action: Exclude}", False),
        ("{macAddresses: {items: ['aa:bb:cc:dd:ee:01']}, uuids: {items: [other]}}", False),
    ],
)
def test_a_camera_not_described_yet_may_pass_every_filter_but_the_mac(
    text: str, kept: bool
) -> None:
    """Whether a failing camera is worth a warning: the filters could still keep it."""
    details = handler.parse_details(text, {})
    undescribed = camera(described=False)
    assert c.may_pass_filters(details, undescribed) is kept
    assert not c.passes_filters(details, undescribed) or kept


def test_visible_devices_are_described_filtered_and_sorted() -> None:
    details = handler.parse_details("scopes: {items: [s1]}", {})
    one = camera(xaddrs=("http://10.0.0.9/onvif/device_service",), scopes=("s1",))
    two = camera(xaddrs=("http://10.0.0.1/onvif/device_service",), scopes=("s1",))
    undescribed = camera(scopes=("s1",), described=False)
    excluded = camera(scopes=("s2",))
    cams = {"a": one, "b": two, "c": undescribed, "d": excluded}
    ids = [device.id for device in c.visible_devices(details, cams)]
    assert ids == [c.device_id(two), c.device_id(one)]


def test_property_values_are_capped() -> None:
    cam = camera()
    assert cam.description is not None
    cam.description = c.Description(model="M" * 5000)
    assert len(c.device_of(cam).properties["ONVIF_DEVICE_MODEL"]) == c.MAX_PROPERTY_CHARS


def test_a_dual_stack_camera_keeps_the_url_it_was_first_seen_on() -> None:
    v4, v6 = URL, "http://[fd00::5]:8080/onvif/device_service"
    cam = camera(xaddrs=(v4, v6), source="10.0.0.5")
    cam.pin_url()
    first = c.device_id(cam)
    cam.source = "fd00::5"  # the same camera, heard over IPv6
    cam.pin_url()
    assert c.device_id(cam) == first
    cam.match = Match(uuid=UUID, xaddrs=(v6,), scopes=())  # it stopped listing the IPv4 one
    cam.pin_url()
    assert cam.service_url == v6


@pytest.mark.parametrize(
    ("description", "words"),
    [
        (c.Description(model="X1"), None),
        (c.Description(auth_refused=True), "refused the configured credentials"),
        (c.Description(credentials_missing=True), "wants credentials and none are configured"),
    ],
)
def test_auth_warning_names_the_camera(description: c.Description, words: str | None) -> None:
    cam = camera()
    cam.description = description
    warning = c.auth_warning(cam)
    if words is None:
        assert warning == ""
    else:
        assert words in warning
        assert f"{cam.service_url} (uuid {cam.match.uuid})" in warning


@pytest.mark.parametrize(("described_at", "now", "due"), [
    (None, 0.5, True),  # never described, the clock just started (a host that just booted)
    (None, 1e6, True),
    (0.0, 0.5, False),  # described a moment ago, near the clock's origin
    (10.0, 300.0, False),
    (10.0, 310.5, True),
])
def test_a_description_is_due_when_never_read_whatever_the_clock_reads(
    described_at: float | None, now: float, due: bool
) -> None:
    assert description_due(described_at, now) is due
