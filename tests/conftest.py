"""Fixtures shared by every test directory.

The control plane is real (etcd, kube-apiserver, kube-scheduler, kube-controller-manager built
from Kubernetes' Go modules, see tests/harness/kubebin.py) and started once per test session;
tests isolate themselves with their own namespaces and object names.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.controlplane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A device-plugin directory of the test's own, short: a Unix socket path fits 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
