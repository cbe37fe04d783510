"""The harness's hermeticity: what it refuses and what its guard sees (tests/harness/hermetic.py).

Test_helm's agent once used this machine's /var/lib/akri (the chart's
default, left as it was) and restored another process's handler registration from it. These
tests pin the parts that keep that from happening again: every path setting of the agent is
known to the harness, the chart's own environment is refused as it is and accepted once moved
under a directory of the test's own, and the guard sees a record read and a socket made and
removed in a watched directory, one that did not exist when the watch began included.
"""

from __future__ import annotations

import socket
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.settings import AgentSettings
from tests.harness import hermetic
from tests.harness.controlplane import REPO_ROOT

DAEMONSET = REPO_ROOT / "deploy" / "manifests" / "agent-daemonset.yaml"


def _daemonset_env() -> dict[str, str]:
    """The agent container's plain variables in the DaemonSet manifest, NODE_NAME filled in as
    the downward API would."""
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    env: dict[str, Any] = {v["name"]: v.get("value", "") for v in container["env"]}
    return {**env, "NODE_NAME": "node-a"}


def test_every_path_setting_of_the_agent_is_known() -> None:
    variables = {s.variable for s in hermetic.PATH_SETTINGS}
    assert {"PLUGIN_DIR", "POD_RESOURCES_SOCKET", "CDI_SPEC_DIR",
            "DISCOVERY_HANDLERS_DIRECTORY", "DRA_PLUGINS_DIR", "DRA_REGISTRY_DIR",
            "KUBELET_CLIENT_CERT"} <= variables
    defaults = AgentSettings.from_env({"NODE_NAME": "n"})
    paths = {f.name for f in fields(AgentSettings)
             if isinstance(getattr(defaults, f.name), Path)}
    assert {s.field for s in hermetic.PATH_SETTINGS} == paths
    names = {f.name for f in fields(AgentSettings)}
    for field_name, groups in hermetic.ONLY_WITH.items():
        switches = {switch for group in groups for switch in group}
        assert {field_name, *switches} <= names, "ONLY_WITH names a field the agent lacks"
    assert Path("/var/lib/akri") in hermetic.HOST_DIRECTORIES


def test_the_chart_environment_as_rendered_is_refused_naming_each_host_path() -> None:
    env = _daemonset_env()
    with pytest.raises(hermetic.NotHermetic) as refused:
        hermetic.refuse_host_environment({**env, "DEVICE_PLUGINS": "off"}, what="the agent")
    message = str(refused.value)
    assert "DISCOVERY_HANDLERS_DIRECTORY=/var/lib/akri" in message
    assert "CDI_SPEC_DIR=/var/run/cdi" in message
    assert "PLUGIN_DIR" not in message, "device plugins off: their directory is not used"


def test_the_chart_environment_moved_under_its_own_root_is_accepted(tmp_path: Path) -> None:
    env = {**_daemonset_env(), "CDI_SPEC_DIR": ""}
    moved = hermetic.own_paths(env, tmp_path)
    hermetic.refuse_host_environment(moved, what="the agent")
    assert moved["DISCOVERY_HANDLERS_DIRECTORY"] == str(tmp_path / "var/lib/akri")
    assert moved["CDI_SPEC_DIR"] == "", "a setting turned off stays off"
    # Left to its default, a path moves all the same.
    assert moved["DRA_REGISTRY_DIR"] == str(tmp_path / "var/lib/kubelet/plugins_registry")


def test_a_dra_agent_without_its_plugin_directory_is_refused() -> None:
    env = {"NODE_NAME": "n", "DEVICE_PLUGINS": "off", "CDI_SPEC_DIR": "",
           "DISCOVERY_HANDLERS_DIRECTORY": "", "DRA": "on", "DRA_REGISTRY_DIR": "/tmp/x/reg"}
    with pytest.raises(hermetic.NotHermetic, match="DRA_PLUGINS_DIR=/var/lib/kubelet/plugins"):
        hermetic.refuse_host_environment(env, what="the agent")
    hermetic.refuse_host_environment({**env, "DRA_REGISTRY_DIR": ""}, what="slices only")


def test_the_kubelets_certificate_is_refused_where_the_agent_reads_with_it() -> None:
    """Device plugins (the pods bound here) or the DRA plugin (claims) read it; slices alone
    do not."""
    base = {"NODE_NAME": "n", "CDI_SPEC_DIR": "", "DISCOVERY_HANDLERS_DIRECTORY": "",
            "POD_RESOURCES_SOCKET": "", "PLUGIN_DIR": "/tmp/x/plugins"}
    refused = "KUBELET_CLIENT_CERT=/var/lib/kubelet/pki/kubelet-client-current.pem"
    with pytest.raises(hermetic.NotHermetic, match=refused):
        hermetic.refuse_host_environment(base, what="device plugins")
    dra = {**base, "DEVICE_PLUGINS": "off", "DRA": "on", "DRA_PLUGINS_DIR": "/tmp/x/p",
           "DRA_REGISTRY_DIR": "/tmp/x/reg"}
    with pytest.raises(hermetic.NotHermetic, match=refused):
        hermetic.refuse_host_environment(dra, what="the DRA plugin")
    hermetic.refuse_host_environment({**dra, "DRA_REGISTRY_DIR": ""}, what="slices only")
    hermetic.refuse_host_environment({**base, "KUBELET_CLIENT_CERT": ""}, what="turned off")


def test_the_guard_sees_a_record_read_and_a_socket_made_and_gone_but_no_empty_directory(
    tmp_path: Path,
) -> None:
    """What test_helm's agent did in the host's /var/lib/akri, none of it left there after:
    read another process's record, served its socket, removed it on the way out."""
    akri = tmp_path / "var" / "lib" / "akri"
    record = akri / "edgeplug-registrations.json"
    watch = hermetic.HostWatch([akri])
    try:
        akri.mkdir(parents=True)  # not there when the watch began: watched from its ancestor
        (akri / "empty-mount-point").mkdir()
        assert watch.changed() == []
        record.write_text("[]")
        assert f"created {record}" in watch.changed()
        record.read_text()
        assert watch.changed() == [f"opened {record}", f"read {record}"]
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(akri / "agent-registration.sock"))
        (akri / "agent-registration.sock").unlink()
        complaint = watch.complaint("test_x")
        assert complaint is not None
        assert f"created {akri / 'agent-registration.sock'}" in complaint
        assert f"deleted {akri / 'agent-registration.sock'}" in complaint
        assert "NOT HERMETIC" in complaint
        assert "test_x" in complaint
        assert watch.complaint("test_y") is None, "each use is told once"
    finally:
        watch.close()


def test_files_already_in_a_directory_made_after_the_watch_began_are_told(
    tmp_path: Path,
) -> None:
    made = tmp_path / "made-elsewhere"
    made.mkdir()
    (made / "kubelet.sock").write_text("")
    target = tmp_path / "var" / "run" / "cdi"
    watch = hermetic.HostWatch([target])
    try:
        target.parent.mkdir(parents=True)
        made.rename(target)  # a whole tree moved in at once
        assert watch.changed() == [f"created {target / 'kubelet.sock'}"]
    finally:
        watch.close()


def test_the_controller_is_told_its_namespace() -> None:
    assert hermetic.controller_environment({})["POD_NAMESPACE"] == "edgeplug-system"
    assert hermetic.controller_environment({"POD_NAMESPACE": "ops"})["POD_NAMESPACE"] == "ops"
