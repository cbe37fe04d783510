"""Find or build the Helm binary the chart tests run.

The chart in deploy/helm/edgeplug is tested with the real Helm (lint, template,
install, upgrade, uninstall against the local control plane), and Helm is not packaged by Debian
or PyPI. ``tests/harness/helmbin`` is a Go module that pins ``helm.sh/helm/v3`` as a tool; this
module builds Helm's own ``cmd/helm`` from it through the Go module proxy, with the version
stamps Helm's Makefile sets, caches it beside the control plane keyed by the hash of the pins,
and reuses it until they change. ``HELM`` names a helm binary to use instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

from tests.harness.kubebin import cache_dir, go_build

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "helmbin"
SOURCE_FILES = ("go.mod", "go.sum")
HELM_MODULE = "helm.sh/helm/v3"
HELM_PACKAGE = f"{HELM_MODULE}/cmd/helm"
CLIENT_GO_MODULE = "k8s.io/client-go"


def _required_version(module: str) -> str:
    """The version go.mod pins for ``module`` (a ``require`` line)."""
    text = (SOURCE_DIR / "go.mod").read_text()
    found = re.search(rf"^\s*{re.escape(module)} (v\S+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{SOURCE_DIR / 'go.mod'} pins no version of {module}")
    return found.group(1)


def helm_version() -> str:
    return _required_version(HELM_MODULE)


def _ldflags() -> str:
    """Helm's Makefile stamps: its version, and the Kubernetes version of its client-go."""
    client_go = _required_version(CLIENT_GO_MODULE).lstrip("v").split(".")
    kube_major, kube_minor = str(int(client_go[0]) + 1), client_go[1]
    stamps = [f"-X {HELM_MODULE}/internal/version.version={helm_version()}"]
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        stamps += [f"-X {HELM_MODULE}/{package}.k8sVersionMajor={kube_major}",
                   f"-X {HELM_MODULE}/{package}.k8sVersionMinor={kube_minor}"]
    return " ".join(["-s -w", *stamps])


def cached_binary() -> Path:
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    return cache_dir() / f"helm-{helm_version()}-{digest.hexdigest()[:16]}"


def build(*, force: bool = False) -> Path:
    """Build Helm unless an up-to-date one is cached; return its path."""
    target = cached_binary()
    if target.exists() and not force:
        return target
    log.info("building helm %s into %s", helm_version(), target)
    started = time.monotonic()
    go_build(SOURCE_DIR, target, what="Helm", package=HELM_PACKAGE, ldflags=_ldflags(),
             env={**os.environ, "CGO_ENABLED": "0"})
    log.info("helm built in %.0f s", time.monotonic() - started)
    return target


def resolve() -> Path:
    """``$HELM`` when set, else the cached (or freshly built) binary."""
    override = os.environ.get("HELM")
    return Path(override) if override else build()


def main() -> None:
    """``python -m tests.harness.helmbin``: build (or find) Helm and print its path."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build())


if __name__ == "__main__":
    main()
