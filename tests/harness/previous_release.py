"""The previous release's agent and controller, to run beside this tree's (version skew,
rollouts).

A fleet upgrade runs two versions side by side for as long as the agents'
DaemonSet takes to roll. The previous release is the newest commit of this repository's history
before ``PREVIOUS_RELEASE_BEFORE`` (``EDGEPLUG_PREVIOUS_RELEASE``, any git revision, chooses
another). Its product packages (``agent``, ``controller``, ``crds``, ``discovery_handlers``) are
exported with ``git archive`` into a cache directory keyed by the commit, never into this
tree; a process started with that directory as its working directory and ``PYTHONPATH`` imports
them before the editable install of this tree (a path entry is searched before the editable
finder). Both releases share this tree's virtual environment: the test checks that their
``pyproject.toml`` dependencies are the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.controlplane import REPO_ROOT

#: The previous release: the newest commit before this moment (the last of its cycle).
PREVIOUS_RELEASE_BEFORE = "2026-12-04T00:00:00Z"
PACKAGES = ("agent", "controller", "crds", "discovery_handlers", "pyproject.toml")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgeplug"


@dataclass(frozen=True)
class Release:
    commit: str
    root: Path  # the directory holding its packages


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()} (the previous "
                           "release is read from this repository's history: a shallow clone "
                           "needs `git fetch --unshallow`)")
    return done.stdout.strip()


def previous_commit() -> str:
    chosen = os.environ.get("EDGEPLUG_PREVIOUS_RELEASE")
    if chosen:
        return _git("rev-parse", "--verify", f"{chosen}^{{commit}}")
    if _git("rev-parse", "--is-shallow-repository") == "true":
        # A shallow clone lacks the previous release: fetch the history from where it came.
        subprocess.run(["git", "fetch", "--quiet", "--unshallow"], cwd=REPO_ROOT, check=False,
                       capture_output=True)
    commit = _git("rev-list", "-1", f"--before={PREVIOUS_RELEASE_BEFORE}", "HEAD")
    if not commit:
        raise RuntimeError(f"no commit before {PREVIOUS_RELEASE_BEFORE} in this history")
    return commit


def previous_release() -> Release:
    """The previous release's packages, exported once per commit."""
    commit = previous_commit()
    root = CACHE / f"previous-release-{commit}"
    if not (root / "pyproject.toml").exists():
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", commit, *PACKAGES],
                                 cwd=REPO_ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.rename(root)
    _same_dependencies(root)
    return Release(commit, root)


def _dependencies(pyproject: Path) -> Any:
    project = tomllib.loads(pyproject.read_text())["project"]
    return project.get("dependencies"), project.get("optional-dependencies")


def _same_dependencies(root: Path) -> None:
    theirs, ours = _dependencies(root / "pyproject.toml"), _dependencies(
        REPO_ROOT / "pyproject.toml")
    if theirs != ours:
        raise RuntimeError("the previous release's dependencies differ from this tree's: it "
                           "cannot run in this virtual environment")
