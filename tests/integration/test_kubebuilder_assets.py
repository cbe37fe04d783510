"""``KUBEBUILDER_ASSETS``: a user's own envtest binaries are used instead of our build.

envtest's asset directories hold ``etcd``, ``kube-apiserver`` and ``kubectl`` (no scheduler or
controller-manager). Here the assets are small wrapper scripts around the multi-call binary, so
the test can see which commands the harness ran from the assets and which it filled in itself.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.harness import kubebin
from tests.harness.controlplane import ControlPlane

ENVTEST_COMMANDS = ("etcd", "kube-apiserver", "kubectl")


def _envtest_assets(directory: Path) -> Path:
    multi = kubebin.build()
    for name in ENVTEST_COMMANDS:
        script = directory / name
        script.write_text(f'#!/bin/sh\nexec "{multi}" {name} "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An envtest assets directory, named by KUBEBUILDER_ASSETS for the test."""
    (tmp_path / "assets").mkdir()
    directory = _envtest_assets(tmp_path / "assets")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(directory))
    return directory


def test_assets_are_used_for_what_they_hold(assets: Path) -> None:
    binaries = kubebin.resolve()
    for name in ENVTEST_COMMANDS:
        assert binaries.argv[name] == (str(assets / name),)
    multi = str(kubebin.cached_binary())
    assert binaries.argv["kube-scheduler"] == (multi, "kube-scheduler")
    assert binaries.argv["kube-controller-manager"] == (multi, "kube-controller-manager")


def test_control_plane_runs_on_envtest_assets(assets: Path) -> None:
    with ControlPlane(install_crds=True) as plane:
        assert plane.binaries.argv["kube-apiserver"] == (str(assets / "kube-apiserver"),)
        out = plane.kubectl("get", "crd", "instances.edgeplug.io", "-o", "name").stdout
        assert out.strip() == "customresourcedefinition.apiextensions.k8s.io/instances.edgeplug.io"
