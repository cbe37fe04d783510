"""The Ascend node profile (deploy/ascend, the chart's ``ascend.enabled``) reaches the driver.

On a real NPU node the agent must load DCMI and see the driver directory, or
discovery falls back to the device nodes (every chip healthy forever, pods without the driver
mount). Here the profile's own mounts and environment, read from the manifest, are applied to
the handler: in a private mount namespace the emulated host's driver directory, DCMI directory
and ``npu-smi`` (tests/harness/ascend_node.py, with the DCMI stand-in compiled from
tests/harness/ascend_dcmi/fake_dcmi.c) are bind-mounted read-only where the DaemonSet mounts
the host's, ``/dev`` is the emulated host's, and the handler runs with the DaemonSet's
environment and its default details. It must use DCMI, as on a node. The manifests and the
chart are also checked to put exactly one agent on every node.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import helmbin
from tests.harness.ascend_node import AscendNode, chips_910b, dcmi_library
from tests.harness.controlplane import REPO_ROOT

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
OVERLAY = REPO_ROOT / "deploy" / "ascend"
CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
NPU_AGENT = "edgeplug-agent-npu"
ASCEND_VOLUMES = ("ascend-driver", "ascend-dcmi", "npu-smi")
#: Variables only the NPU agent sets: the driver's libraries, and Volcano's device-info ConfigMap.
ASCEND_VARIABLES = ("LD_LIBRARY_PATH", "VOLCANO_DEVICE_INFO")
RUN_TIMEOUT_S = 60
PROBE = """
import json
from discovery_handlers.ascend.details import parse_details
from discovery_handlers.ascend.sources import scan
result = scan(parse_details("", {}))
print(json.dumps({"source": result.status.source, "problems": list(result.status.problems),
                  "ids": [d.id for d in result.devices],
                  "healthy": [d.health.healthy for d in result.devices],
                  "mounts": [[m.host_path, m.container_path, m.read_only]
                             for m in result.devices[0].mounts] if result.devices else []}))
"""


def _rendered_overlay() -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True,
                         check=True, timeout=RUN_TIMEOUT_S).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _daemonsets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}


def _affinity(daemonset: dict[str, Any]) -> tuple[str, str, list[str]]:
    spec = daemonset["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [term] = terms["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    return expression["key"], expression["operator"], expression["values"]


def _profile(daemonset: dict[str, Any]) -> tuple[dict[str, str], list[tuple[str, str, bool]]]:
    """The NPU agent's literal environment, and its Ascend mounts as (host path, container
    path, read-only)."""
    spec = daemonset["spec"]["template"]["spec"]
    [container] = spec["containers"]
    env = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = [(volumes[m["name"]], m["mountPath"], bool(m.get("readOnly")))
              for m in container["volumeMounts"] if m["name"] in ASCEND_VOLUMES]
    return env, mounts


def test_exactly_one_agent_on_every_node() -> None:
    daemonsets = _daemonsets(_rendered_overlay())
    assert set(daemonsets) == {"edgeplug-agent", NPU_AGENT}
    key, operator, values = _affinity(daemonsets[NPU_AGENT])
    assert (key, operator) == ("accelerator", "In")
    assert "huawei-Ascend910" in values
    assert _affinity(daemonsets["edgeplug-agent"]) == (key, "NotIn", values)


def test_the_npu_agent_gets_the_driver_read_only_and_privilege() -> None:
    npu = _daemonsets(_rendered_overlay())[NPU_AGENT]
    env, mounts = _profile(npu)
    assert sorted(mounts) == [
        ("/usr/local/Ascend/driver", "/usr/local/Ascend/driver", True),
        ("/usr/local/bin/npu-smi", "/usr/local/bin/npu-smi", True),
        ("/usr/local/dcmi", "/usr/local/dcmi", True)]
    assert env["LD_LIBRARY_PATH"].split(":") == [
        "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/lib64/driver",
        "/usr/local/Ascend/driver/lib64/common", "/usr/local/dcmi"]
    [container] = npu["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == {"runAsUser": 0, "privileged": True,
                                            "readOnlyRootFilesystem": True}


def _pod_parts(daemonset: dict[str, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """(env, volume mounts, volumes), the Ascend additions left out."""
    spec = daemonset["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return ([v for v in container["env"] if v["name"] not in ASCEND_VARIABLES],
            [m for m in container["volumeMounts"] if m["name"] not in ASCEND_VOLUMES],
            [v for v in spec["volumes"] if v["name"] not in ASCEND_VOLUMES])


@pytest.mark.parametrize("source", ["overlay", "chart"])
def test_the_npu_agent_is_the_plain_agent_plus_ascend(source: str, tmp_path: Path) -> None:
    daemonsets = (_daemonsets(_rendered_overlay()) if source == "overlay"
                  else _render_chart(tmp_path, "--set", "ascend.enabled=true"))
    assert _pod_parts(daemonsets[NPU_AGENT]) == _pod_parts(daemonsets["edgeplug-agent"])


def _render_chart(tmp_path: Path, *values: str) -> dict[str, dict[str, Any]]:
    env = {"HELM_CONFIG_HOME": str(tmp_path / "c"), "HELM_CACHE_HOME": str(tmp_path / "k"),
           "HELM_DATA_HOME": str(tmp_path / "d"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([str(helmbin.resolve()), "template", "edgeplug", str(CHART),
                          "--namespace", "edgeplug-system", *values], capture_output=True,
                         text=True, check=True, env=env, timeout=RUN_TIMEOUT_S).stdout
    return _daemonsets([doc for doc in yaml.safe_load_all(out) if doc])


def test_the_chart_renders_the_same_profile(tmp_path: Path) -> None:
    plain = _render_chart(tmp_path)
    assert set(plain) == {"edgeplug-agent"}
    assert "affinity" not in plain["edgeplug-agent"]["spec"]["template"]["spec"]
    charted = _render_chart(tmp_path, "--set", "ascend.enabled=true")
    overlay = _daemonsets(_rendered_overlay())
    (chart_env, chart_mounts), (overlay_env, overlay_mounts) = (
        _profile(charted[NPU_AGENT]), _profile(overlay[NPU_AGENT]))
    assert chart_mounts == overlay_mounts
    assert chart_env["LD_LIBRARY_PATH"] == overlay_env["LD_LIBRARY_PATH"]
    assert (charted[NPU_AGENT]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
            == overlay[NPU_AGENT]["spec"]["template"]["spec"]["containers"][0]["securityContext"])
    assert _affinity(charted[NPU_AGENT]) == _affinity(overlay[NPU_AGENT])
    assert _affinity(charted["edgeplug-agent"]) == _affinity(overlay["edgeplug-agent"])


def _run_in_profile(node: AscendNode, tmp_path: Path, env: dict[str, str],
                    mounts: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """The probe, in a private mount namespace where the DaemonSet's mounts come from the
    emulated host and /dev is its /dev (with the real null and urandom)."""
    saved = tmp_path / "real-dev"
    saved.mkdir()
    lines = ["set -e", f"mount --bind /dev {shlex.quote(str(saved))}"]
    for name in ("null", "urandom"):
        (node.root / "dev" / name).touch()
    lines.append(f"mount --bind {shlex.quote(str(node.root / 'dev'))} /dev")
    lines += [f"mount --bind {shlex.quote(str(saved / n))} /dev/{n}" for n in ("null", "urandom")]
    lines.append("mount -t tmpfs profile /usr/local")  # the host's own /usr/local stays hidden
    for host, container, read_only in mounts:
        source = node.root / host.lstrip("/")
        make = "touch" if source.is_file() else "mkdir -p"
        lines += [f"mkdir -p {shlex.quote(str(Path(container).parent))}",
                  f"{make} {shlex.quote(container)}",
                  f"mount --bind {shlex.quote(str(source))} {shlex.quote(container)}"]
        if read_only:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(container)}")
    lines.append(f"exec {shlex.quote(sys.executable)} -c {shlex.quote(PROBE)}")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT),
             **node.env, **env})
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_handler_uses_dcmi_with_the_profiles_mounts_and_env(
        tmp_path: Path, dcmi_library: Path) -> None:
    node = AscendNode(tmp_path / "host", chips_910b(8), library=dcmi_library)
    env, mounts = _profile(_daemonsets(_rendered_overlay())[NPU_AGENT])
    found = _run_in_profile(node, tmp_path, env, mounts)
    assert found["source"] == "dcmi", found["problems"]
    assert found["problems"] == []
    assert found["ids"] == [f"davinci{i}" for i in range(8)]
    assert all(found["healthy"])
    # Pods get the host's driver directory, read-only.
    assert found["mounts"] == [["/usr/local/Ascend/driver", "/usr/local/Ascend/driver", True]]


def test_without_the_profiles_library_path_dcmi_is_not_found(
        tmp_path: Path, dcmi_library: Path) -> None:
    node = AscendNode(tmp_path / "host", chips_910b(2), library=dcmi_library)
    env, mounts = _profile(_daemonsets(_rendered_overlay())[NPU_AGENT])
    del env["LD_LIBRARY_PATH"]  # the plain agent's environment
    found = _run_in_profile(node, tmp_path, env, mounts)
    assert found["source"] == "npu-smi"
    assert any("cannot load libdcmi.so" in p for p in found["problems"])


pytestmark = pytest.mark.timeout(120)
