"""``edgeplug discover`` as a user runs it: a subprocess on a Configuration file, no cluster.

debugEcho is the handler (its devices are in its details); the other handlers' tests run the
same command against their real parts or simulators.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from crds.naming import instance_name

RUN_TIMEOUT_S = 60


def _configuration(path: Path, details: dict[str, Any], **spec: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "echo"},
        "spec": {"discoveryHandler": {"name": "debugEcho",
                                      "discoveryDetails": yaml.safe_dump(details)}, **spec},
    }))
    return path


def _discover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "discover", *args],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )


def test_prints_what_the_agent_would_publish(tmp_path: Path) -> None:
    cfg = _configuration(tmp_path / "c.yaml", {"descriptions": ["foo0", "foo1"], "shared": False},
                         brokerProperties={"MODE": "test"})
    done = _discover("-f", str(cfg), "--node", "edge-1", "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["handler"] == "debugEcho"
    assert report["shared"] is False
    assert [(d["id"], d["instance"]) for d in report["devices"]] == [
        ("foo0", instance_name("echo", "foo0", shared=False, node="edge-1")),
        ("foo1", instance_name("echo", "foo1", shared=False, node="edge-1")),
    ]
    assert report["devices"][0]["properties"] == {"DEBUG_ECHO_DESCRIPTION": "foo0", "MODE": "test"}
    assert report["devices"][0]["healthy"] is True

    text = _discover("-f", str(cfg), "--node", "edge-1")
    assert text.returncode == 0, text.stderr
    assert "- device foo0 (healthy)" in text.stdout
    assert "property DEBUG_ECHO_DESCRIPTION=foo0" in text.stdout


def test_bad_details_exit_2_naming_the_field(tmp_path: Path) -> None:
    cfg = _configuration(tmp_path / "c.yaml", {"descriptions": ["foo0", "foo0"]})
    done = _discover("-f", str(cfg))
    assert done.returncode == 2
    assert "discoveryDetails.descriptions[1]: duplicate description 'foo0'" in done.stderr
    assert done.stdout == ""


def test_unknown_handler_and_unresolvable_property_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration", "metadata": {"name": "x"},
        "spec": {"discoveryHandler": {"name": "nope"}},
    }))
    done = _discover("-f", str(cfg))
    assert done.returncode == 2
    assert "unknown discovery handler 'nope'" in done.stderr

    cfg = _configuration(tmp_path / "d.yaml", {"descriptions": ["foo0"]})
    document = yaml.safe_load(cfg.read_text())
    document["spec"]["discoveryHandler"]["discoveryProperties"] = [
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pw"}}}]
    cfg.write_text(yaml.safe_dump(document))
    done = _discover("-f", str(cfg))
    assert done.returncode == 2
    assert "discoveryProperties[0] (PW)" in done.stderr
    assert "--property PW=VALUE" in done.stderr
    assert _discover("-f", str(cfg), "--property", "PW=x", "-o", "json").returncode == 0


def test_watch_prints_each_change(tmp_path: Path) -> None:
    offline = tmp_path / "offline"
    cfg = _configuration(tmp_path / "c.yaml", {"descriptions": ["foo0", "foo1"],
                                               "availabilityFile": str(offline)})
    with subprocess.Popen(
        [sys.executable, "-m", "cli", "discover", "-f", str(cfg), "--watch", "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as process:
        try:
            assert process.stdout is not None
            first = json.loads(process.stdout.readline())
            assert [d["id"] for d in first["devices"]] == ["foo0", "foo1"]
            offline.write_text("foo1\n")
            second = json.loads(process.stdout.readline())
            assert [d["id"] for d in second["devices"]] == ["foo0"]
        finally:
            process.kill()


def test_two_devices_of_one_akri_name_are_shown_as_the_agent_names_them(tmp_path: Path) -> None:
    """d2318 and d2629 share Akri's name cams-6db282 (3 bytes of digest): the one with the
    smaller device digest keeps it, the other shows its collision name and CDI name."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "cams"},
        "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": yaml.safe_dump(
            {"descriptions": ["d2318", "d2629"], "shared": True})}}}))
    done = _discover("-f", str(cfg), "-o", "json")
    assert done.returncode == 0, done.stderr
    rows = {d["id"]: d for d in json.loads(done.stdout)["devices"]}
    assert {i: (r["instance"], r["cdiName"], r["akriNameOf"]) for i, r in rows.items()} == {
        "d2629": ("cams-6db282", "edgeplug.io/cams=6db282", ""),
        "d2318": ("cams-a254a46d30284e12", "edgeplug.io/cams=a254a46d30284e12",
                  "3b808b732b3924ae"),
    }
    text = _discover("-f", str(cfg))
    assert "instance: cams-a254a46d30284e12" in text.stdout
    assert "its Akri name is device 3b808b732b3924ae's" in text.stdout
