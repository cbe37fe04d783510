"""udev's own rule engine as the oracle: which devices does systemd-udev match for each rule,
and which does ``edgeplug discover`` list?

The handler claims to match "as udev matches"; this asks udev. ``oracle()``
starts this module in a private mount and network namespace (``unshare --mount --net``), where
it mounts tmpfs over /run, /dev and udev's rules directories and a fresh sysfs (showing the
namespace's own links: ``lo`` up, a veth pair ``v0`` up without carrier and ``v1`` down, whose
``carrier`` cannot be read), so nothing on the host changes. There it writes the tags it is given
into udev's database (/run/udev/data, where udevd keeps them; both engines read them there) and

1. runs ``edgeplug discover`` (``cli.main``, in-process, one Configuration per rule) and lists
   every device libudev enumerates, in a child process (under umockdev's preload library when
   given a bed's environment: then /sys is the bed's tree). Those are the devices the kernel
   sends uevents for; directories without a subsystem (``/sys/devices/platform``, a PCI root)
   get none, so udev never runs rules on them: they count as parents only;
2. writes all rules into one rules file, one line each, with the marker assignment
   ``ENV{EDGEPLUG_MATCH_<n>}="1"`` appended, and runs ``udevadm test --action=add`` once per
   device (two at a time), reading which markers each device got; a line udev refuses is named
   in udevadm's log (``<file>:<line> Invalid ...``).

``udevadm test`` needs Debian's ``udev`` package (.ci/apt/udev.txt) and root for the namespaces.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES_FILE = "/etc/udev/rules.d/99-edgeplug-oracle.rules"
RULES_DIRS = ("/etc/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d",
              "/usr/local/lib/udev/rules.d")
MARKER = re.compile(r"^EDGEPLUG_MATCH_(\d+)=1$", re.MULTILINE)
REFUSED_LINE = re.compile(re.escape(RULES_FILE) + r":(\d+) (Invalid|Failed)")
UDEVADM = "udevadm"
DISCOVER_TIMEOUT_S = 120.0
#: udevadm test processes are mostly start-up (hwdb, kmod index): two at a time on 2 cores.
UDEVADM_WORKERS = 2


@dataclass(frozen=True)
class Verdict:
    """One rule's result on both sides: the devices (DEVPATHs) matched, None when refused."""

    rule: str
    udev: frozenset[str] | None
    edgeplug: frozenset[str] | None
    edgeplug_error: str = ""

    @property
    def agrees(self) -> bool:
        return self.udev == self.edgeplug


@dataclass(frozen=True)
class OracleRun:
    verdicts: list[Verdict]
    devices: int  # devices udevadm processed
    discover_s: float  # all rules through edgeplug discover
    udev_s: float  # every device through udevadm test


def oracle(rules: Sequence[str], *, env: Mapping[str, str] | None = None,
           tags: Mapping[str, Sequence[str]] | None = None,
           timeout_s: float = 900.0) -> OracleRun:
    """Run ``rules`` through both engines over every device; ``env``: extra environment for
    both (a umockdev bed's ``env()`` points them at the bed's tree); ``tags``: DEVPATH → tags
    to write into udev's database first (this machine's tree only)."""
    for rule in rules:
        if "\n" in rule or "\r" in rule:
            raise ValueError(f"a udev rules line cannot hold a line break: {rule!r}")
    with tempfile.TemporaryDirectory(prefix="udev-oracle-") as work:
        job = Path(work, "job.json")
        job.write_text(json.dumps({"rules": list(rules), "env": dict(env or {}), "work": work,
                                   "tags": {k: list(v) for k, v in (tags or {}).items()}}))
        done = subprocess.run(
            ["unshare", "--mount", "--net", sys.executable, "-m", "tests.harness.udev_oracle",
             "inside", str(job)],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
            timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"oracle failed ({done.returncode}): {done.stderr[-4000:]}")
        result = json.loads(Path(work, "result.json").read_text())
    verdicts = [Verdict(rule=rule, udev=_set(result["udev"][i]), edgeplug=_set(result["ours"][i]),
                        edgeplug_error=result["errors"][i])
                for i, rule in enumerate(rules)]
    return OracleRun(verdicts, result["devices"], result["discover_s"], result["udev_s"])


def _set(paths: list[str] | None) -> frozenset[str] | None:
    return None if paths is None else frozenset(paths)


# ---- inside the namespaces ---------------------------------------------------------------

def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _private_system() -> None:
    """tmpfs where udevadm writes or reads rules, a sysfs of this network namespace, and links
    whose carrier reads 1, 0 and not at all."""
    _sh("mount", "--make-rprivate", "/")
    _sh("mount", "-t", "sysfs", "sysfs", "/sys")
    for path in ("/run", "/dev", *RULES_DIRS):
        if os.path.isdir(path) and not os.path.islink(path):
            _sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path)
    for name, minor in (("null", 3), ("zero", 5), ("urandom", 9)):
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", 0o666)
    _sh("ip", "link", "set", "lo", "up")
    _sh("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    _sh("ip", "link", "set", "v0", "up")


def _write_tags(tags: Mapping[str, Sequence[str]]) -> None:
    """Tags in udev's database (/run/udev/data, the namespace's tmpfs), as udevd would have
    written them: both engines read them there (TAG, TAGS)."""
    import pyudev

    context = pyudev.Context()
    Path("/run/udev/data").mkdir(parents=True, exist_ok=True)
    for devpath, names in tags.items():
        device = pyudev.Devices.from_sys_path(context, f"/sys{devpath}")
        number = device.device_number
        if number:
            kind = "b" if device.subsystem == "block" else "c"
            db_id = f"{kind}{os.major(number)}:{os.minor(number)}"
        elif device.subsystem == "net":
            db_id = f"n{device.attributes.asint('ifindex')}"
        else:
            db_id = f"+{device.subsystem}:{device.sys_name}"
        lines = [f"G:{t}" for t in names] + [f"Q:{t}" for t in names]
        Path("/run/udev/data", db_id).write_text("\n".join(lines) + "\n")


def _inside(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    work, rules = Path(job["work"]), job["rules"]
    _private_system()
    _write_tags(job["tags"])
    env = {**os.environ, **job["env"]}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "tests.harness.udev_oracle", "discover", job_path],
                   env=env, check=True, timeout=DISCOVER_TIMEOUT_S * max(len(rules), 1))
    ours = json.loads(Path(work, "ours.json").read_text())
    discover_s = time.monotonic() - started
    Path(RULES_FILE).write_text("".join(
        f'{rule}, ENV{{EDGEPLUG_MATCH_{n}}}="1"\n' for n, rule in enumerate(rules)))
    started = time.monotonic()
    matched: list[list[str] | None] = [[] for _ in rules]
    refused: set[int] = set()
    with ThreadPoolExecutor(UDEVADM_WORKERS) as pool:
        for devpath, stdout, stderr in pool.map(lambda d: _udevadm_test(d, env),
                                                ours["all_devices"]):
            refused.update(int(m.group(1)) - 1 for m in REFUSED_LINE.finditer(stderr))
            for m in MARKER.finditer(stdout):
                entry = matched[int(m.group(1))]
                assert entry is not None
                entry.append(devpath)
    for index in refused:
        matched[index] = None
    Path(work, "result.json").write_text(json.dumps({
        "udev": matched, "ours": ours["matched"], "errors": ours["errors"],
        "devices": len(ours["all_devices"]), "discover_s": discover_s,
        "udev_s": time.monotonic() - started}))


def _udevadm_test(devpath: str, env: Mapping[str, str]) -> tuple[str, str, str]:
    done = subprocess.run([UDEVADM, "test", "--action=add", f"/sys{devpath}"], env=env,
                          capture_output=True, text=True, errors="surrogateescape",
                          timeout=120, check=False)
    return devpath, done.stdout, done.stderr


def _discover(job_path: str) -> None:
    """``edgeplug discover`` per rule (the CLI's own code, in this process) and libudev's list
    of every device."""
    import pyudev

    from cli import main as cli

    job = json.loads(Path(job_path).read_text())
    work = Path(job["work"])
    matched: list[list[str] | None] = []
    errors: list[str] = []
    for index, rule in enumerate(job["rules"]):
        config = work / f"rule-{index}.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
            "metadata": {"name": f"oracle-{index}"},
            "spec": {"discoveryHandler": {"name": "udev",
                                          "discoveryDetails": yaml.safe_dump(
                                              {"udevRules": [rule]})}}}))
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = cli.main(["discover", "-f", str(config), "--node", "oracle", "-o",
                                   "json", "--timeout", str(DISCOVER_TIMEOUT_S)])
        except Exception as exc:  # a crash is a verdict too: it lists nothing
            status, err = 2, io.StringIO(f"crashed: {type(exc).__name__}: {exc}")
        if status == 2:
            matched.append(None)
            errors.append(err.getvalue().strip())
        elif status == 0:
            listing: dict[str, Any] = json.loads(out.getvalue().splitlines()[0])
            matched.append(sorted(d["id"] for d in listing["devices"]))
            errors.append("")
        else:
            raise RuntimeError(f"edgeplug discover exited {status}: {err.getvalue()}")
    context = pyudev.Context()
    devices = sorted({str(d.device_path) for d in context.list_devices()})
    Path(work, "ours.json").write_text(json.dumps(
        {"matched": matched, "errors": errors, "all_devices": devices}))


if __name__ == "__main__":
    {"inside": _inside, "discover": _discover}[sys.argv[1]](sys.argv[2])
