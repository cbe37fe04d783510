"""The ascend handler's discoveryDetails: defaults, every field, and bad input named by field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from discovery_handlers.ascend import handler
from discovery_handlers.ascend.details import AscendDetails
from discovery_handlers.contract import InvalidDetails


def parse(text: str) -> AscendDetails:
    return handler.parse_details(text, {})


def test_empty_details_mean_the_defaults() -> None:
    details = parse("")
    assert details == AscendDetails()
    assert details.health_poll_seconds == 5.0  # Huawei's plugin polls every 5 s
    assert details.sources == ("dcmi", "npu-smi", "devices")
    assert details.driver_path == "/usr/local/Ascend/driver"
    assert details.library_path is None  # the loader's search path


def test_every_field_is_read() -> None:
    details = parse(
        "hostRoot: /host\nlibraryPath: /usr/local/dcmi/libdcmi.so\nnpuSmiPath: /usr/bin/npu-smi\n"
        "driverPath: /opt/driver\nmountDriver: false\nsources: [npu-smi, devices]\n"
        "chipNames: [Ascend910, Ascend310P3]\nhealthPollSeconds: 1800\n"
        "dcmiTimeoutSeconds: 0.5\nruntimeOptions: [NODRV, VERBOSE]\n")
    assert details == AscendDetails(
        host_root="/host", library_path="/usr/local/dcmi/libdcmi.so",
        npu_smi_path="/usr/bin/npu-smi", driver_path="/opt/driver", mount_driver=False,
        sources=("npu-smi", "devices"), chip_names=("Ascend910", "Ascend310P3"),
        health_poll_seconds=1800.0, dcmi_timeout_seconds=0.5,
        runtime_options=("NODRV", "VERBOSE"))
    assert details.on_host("/dev/davinci0") == "/host/dev/davinci0"
    assert details.npu_smi_paths == ("/usr/bin/npu-smi",)
    # Unset: where the driver installs it on servers, then on Atlas 200/500.
    assert parse("").npu_smi_paths == ("/usr/local/bin/npu-smi", "/usr/local/sbin/npu-smi")


@pytest.mark.parametrize(("text", "field", "words"), [
    ("[1, 2]", "(root)", "mapping"),
    ("a: [", "(root)", "not valid YAML"),
    ("chipName: [Ascend910]", "chipName", "unknown field"),
    ("hostRoot: host", "hostRoot", "absolute path"),
    ("libraryPath: /a/../b", "libraryPath", "no '..'"),
    ("npuSmiPath: 3", "npuSmiPath", "absolute path"),
    ("dcmiTimeoutSeconds: 0", "dcmiTimeoutSeconds", "outside 0.1..60"),
    ("dcmiTimeoutSeconds: fast", "dcmiTimeoutSeconds", "number of seconds"),
    ("mountDriver: yes please", "mountDriver", "true or false"),
    ("sources: []", "sources", "non-empty list"),
    ("sources: [dcmi, nvml]", "sources[1]", "'nvml' is not one of"),
    ("sources: [dcmi, dcmi]", "sources[1]", "listed twice"),
    ("chipNames: [910B]", "chipNames[0]", "not a chip name"),
    ("chipNames: []", "chipNames", "non-empty list"),
    ("healthPollSeconds: 0.5", "healthPollSeconds", "outside 1..1800"),
    ("healthPollSeconds: 1801", "healthPollSeconds", "outside 1..1800"),
    ("healthPollSeconds: true", "healthPollSeconds", "number of seconds"),
    ("healthPollSeconds: '5'", "healthPollSeconds", "number of seconds"),
    ("runtimeOptions: [VIRTUAL]", "runtimeOptions[0]", "not one of"),
])
def test_bad_details_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(InvalidDetails) as caught:
        parse(text)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_parsing_does_not_load_the_vendor_library() -> None:
    """The webhook and `edgeplug discover` parse details where no DCMI library exists."""
    code = ("import sys; from discovery_handlers.ascend import handler; "
            "handler.parse_details('chipNames: [Ascend910]', {}); "
            "print(sorted(m for m in sys.modules if m.startswith('discovery_handlers.ascend')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert "discovery_handlers.ascend.details" in out
    assert "discovery_handlers.ascend.dcmi" not in out
    assert "discovery_handlers.ascend.sources" not in out
