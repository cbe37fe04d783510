"""The agent DaemonSet's rollout, as the plain manifests and the real Helm's rendering of the
chart declare it: one node's agent replaced at a time, never two agents on a node (no surge),
and a new agent must run a while before the next node's is replaced (docs/operations.md,
"Rolling out a new agent"). The chart's knobs are validated by its schema.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import helmbin
from tests.harness.controlplane import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
PLAIN = {"edgeplug-agent": REPO_ROOT / "deploy" / "manifests" / "agent-daemonset.yaml",
         "edgeplug-agent-npu": REPO_ROOT / "deploy" / "ascend" / "agent-npu-daemonset.yaml"}


def _helm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_DATA_HOME": str(tmp_path / "data"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    return subprocess.run([str(helmbin.resolve()), "template", "edgeplug", str(CHART), *args],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def _daemonset(documents: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in yaml.safe_load_all(documents)
                if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == name]
    return dict(found)


def _rollout(daemonset: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    spec = daemonset["spec"]
    strategy = spec["updateStrategy"]
    return (strategy["type"], strategy["rollingUpdate"]["maxSurge"],
            strategy["rollingUpdate"]["maxUnavailable"], spec["minReadySeconds"])


@pytest.mark.parametrize("name", list(PLAIN))
def test_one_node_at_a_time_never_two_agents_on_a_node(tmp_path: Path, name: str) -> None:
    plain = _rollout(_daemonset(PLAIN[name].read_text(), name))
    assert plain == ("RollingUpdate", 0, 1, 10)
    rendered = _helm(tmp_path, "--set", "ascend.enabled=true")
    assert rendered.returncode == 0, rendered.stderr
    assert _rollout(_daemonset(rendered.stdout, name)) == plain, "the chart's defaults"
    faster = _helm(tmp_path, "--set", "ascend.enabled=true",
                   "--set", "agent.rollout.maxUnavailable=10%",
                   "--set", "agent.rollout.minReadySeconds=30")
    assert faster.returncode == 0, faster.stderr
    assert _rollout(_daemonset(faster.stdout, name)) == ("RollingUpdate", 0, "10%", 30)


@pytest.mark.parametrize(("setting", "named"), [
    # With no surge, a rollout that could never start.
    ("agent.rollout.maxUnavailable=0", "'/agent/rollout/maxUnavailable'"),
    ("agent.rollout.maxUnavailable=150%", "'/agent/rollout/maxUnavailable'"),
    ("agent.rollout.minReadySeconds=-1", "'/agent/rollout/minReadySeconds'"),
    ("agent.rollout.maxSurge=1", "'maxSurge' not allowed"),  # a surge is never used
])
def test_a_bad_rollout_value_is_refused_naming_it(tmp_path: Path, setting: str,
                                                   named: str) -> None:
    done = _helm(tmp_path, "--set", setting)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr
