"""``tests/harness/aptdeps.sh``, the Makefile's install step for the Debian packages of
``.ci/apt/*.txt``: nothing asked of apt when all are installed, the missing ones installed as
root or through ``sudo -n``, and otherwise one message naming them and the command to run.

``make test`` on a fresh machine relies on this step, and a CI machine that has
every package never exercises its other branches. The script runs for real against this
machine's dpkg database, from a copy of the repository layout holding a list of our own; the
``apt-get`` (and, for the sudo branch, ``sudo``) it finds on ``PATH`` are stand-ins that record
how they were called, since a test must not install packages. The non-root cases run the script
as ``nobody`` (util-linux ``setpriv``), so the suite runs them as root, as it runs everything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.controlplane import REPO_ROOT

SCRIPT = REPO_ROOT / "tests" / "harness" / "aptdeps.sh"
#: Installed wherever the script can run at all (it is a bash script asking dpkg).
PRESENT = "bash"
MISSING = "edgeplug-test-no-such-package"
NOBODY = 65534

#: Records its arguments, one call a line, and succeeds (stands for apt-get).
FAKE_APT_GET = '#!/bin/sh\necho "$(id -u) $*" >> "$APT_RECORD"\n'
#: ``sudo -n``: refuses (a password would be needed) unless $SUDO_OK; else records the command
#: and runs it (as the caller: it stands for sudo's decision, not for root).
FAKE_SUDO = ('#!/bin/sh\n[ "$1" = -n ] && shift\n[ -n "$SUDO_OK" ] || exit 1\n'
             '[ "$1" = true ] && exit 0\necho "sudo $*" >> "$APT_RECORD"\nexec "$@"\n')


@pytest.fixture
def repo() -> Iterator[Path]:
    """A repository layout (the script, .ci/apt/) that ``nobody`` can read, and a bin folder."""
    assert os.geteuid() == 0, "these tests switch to nobody: run the suite as root"
    root = Path(tempfile.mkdtemp(prefix="ep-apt-", dir="/tmp"))
    (root / "tests" / "harness").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "tests" / "harness" / "aptdeps.sh")
    (root / ".ci" / "apt").mkdir(parents=True)
    (root / "bin").mkdir()
    for name, text in (("apt-get", FAKE_APT_GET), ("sudo", FAKE_SUDO)):
        (root / "bin" / name).write_text(text)
        (root / "bin" / name).chmod(0o755)
    record = root / "apt-calls"
    record.touch()
    record.chmod(0o666)
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run(repo: Path, lists: dict[str, str], *, as_nobody: bool = False,
        sudo_ok: bool = False) -> subprocess.CompletedProcess[str]:
    for name, text in lists.items():
        (repo / ".ci" / "apt" / name).write_text(text)
    env = {"PATH": f"{repo / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
           "APT_RECORD": str(repo / "apt-calls"), "SUDO_OK": "1" if sudo_ok else ""}
    user = (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            if as_nobody else [])
    return subprocess.run([*user, str(repo / "tests" / "harness" / "aptdeps.sh")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def apt_calls(repo: Path) -> list[str]:
    return (repo / "apt-calls").read_text().splitlines()


def test_all_installed_asks_dpkg_only_and_says_nothing(repo: Path) -> None:
    done = run(repo, {"a.txt": f"# a comment\n{PRESENT}  # why\n", "b.txt": f"{PRESENT}\n"},
               as_nobody=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert apt_calls(repo) == []


def test_root_installs_only_the_missing_packages_of_every_list(repo: Path) -> None:
    done = run(repo, {"a.txt": f"{PRESENT}\n", "new-topic.txt": f"{MISSING} {PRESENT}\n"})
    assert done.returncode == 0, done.stderr
    calls = apt_calls(repo)
    assert [call.split()[0] for call in calls] == ["0", "0"]  # as root, no sudo
    assert calls[0].endswith(" update")
    assert calls[1].endswith(f" install -y --no-install-recommends {MISSING}")


def test_a_user_with_passwordless_sudo_installs_through_it(repo: Path) -> None:
    done = run(repo, {"a.txt": f"{MISSING}\n"}, as_nobody=True, sudo_ok=True)
    assert done.returncode == 0, done.stderr
    calls = apt_calls(repo)
    assert [call.split()[0] for call in calls] == ["sudo", str(NOBODY), "sudo", str(NOBODY)]
    assert [call.split()[-1] for call in calls] == ["update", "update", MISSING, MISSING]


def test_without_root_or_sudo_it_stops_with_one_message_naming_the_command(repo: Path) -> None:
    done = run(repo, {"a.txt": f"{PRESENT}\n{MISSING}\n"}, as_nobody=True)
    assert done.returncode == 1
    assert done.stdout == ""
    assert MISSING in done.stderr.splitlines()[0]
    assert PRESENT not in done.stderr
    assert (f"sudo apt-get update && sudo apt-get install -y --no-install-recommends {MISSING}"
            in done.stderr)
    assert apt_calls(repo) == []
