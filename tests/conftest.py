"""Fixtures shared by every test directory.

The control plane is real (etcd, kube-apiserver, kube-scheduler, kube-controller-manager built
from Kubernetes' Go modules, see tests/harness/kubebin.py) and started once per test session;
tests isolate themselves with their own namespaces and object names. The Kubernetes version is
``$EDGEPLUG_KUBE_VERSION`` (default the newest pinned, see tests/harness/kubebin.py); the run's
header and its last line name it, so a reader of the output sees which version each test ran on.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import hermetic, kubebin
from tests.harness.controlplane import ControlPlane


def _version_line() -> str:
    run = "compatibility run" if kubebin.KUBE_VERSION != kubebin.NEWEST_VERSION else "newest"
    return f"Kubernetes {kubebin.KUBE_VERSION} ({run}; {kubebin.VERSION_ENV} chooses)"


def pytest_report_header() -> str:
    return _version_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"these tests ran on {_version_line()}")


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


@pytest.fixture(scope="session", autouse=True)
def host_defaults() -> Iterator[hermetic.HostWatch]:
    """This machine's own kubelet, CDI and Akri directories, watched for the whole session: a
    process the suite starts must never use a file there (tests/harness/hermetic.py)."""
    watch = hermetic.HostWatch()
    try:
        yield watch
        complaint = watch.complaint("the session's last teardown")
    finally:
        watch.close()
    if complaint:
        pytest.fail(complaint, pytrace=False)


@pytest.fixture(autouse=True)
def host_defaults_untouched(
    request: pytest.FixtureRequest, host_defaults: hermetic.HostWatch
) -> Iterator[None]:
    """Fails the test during which a file in the host's default directories was used."""
    yield
    complaint = host_defaults.complaint(request.node.nodeid)
    if complaint:
        pytest.fail(complaint, pytrace=False)
