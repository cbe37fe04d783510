"""The agent and controller images, built for real and run from their unpacked roots.

A Dockerfile nobody builds rots, and there is no container engine or registry
here. ``deploy/images/build-oci.sh`` (``make images``) builds both images without a daemon,
from the same inputs as the Dockerfiles, as OCI image archives. This test takes each archive as
a user's runtime would (the OCI layout's tag, its manifest and layers, the image config turned
into a runtime bundle by umoci), and runs the image's own entrypoint as the image's own user in
the unpacked root (``chroot``: the filesystem the container would see, without a runtime):
``--help`` answers, the agent image loads every discovery handler and its vendor library, the
controller image runs unprivileged and holds kopf and not the agent (nor the agent the
controller).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.controlplane import REPO_ROOT

# The first run builds the images (a few minutes on two cores); later runs find them built.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

IMAGES_DIR = REPO_ROOT / "build" / "images"
BUILD_TIMEOUT_S = 840
RUN_TIMEOUT_S = 60
REF_NAME = "org.opencontainers.image.ref.name"
#: What pyproject.toml's entry points name, all of which the full agent image must load.
HANDLERS = {"debugEcho", "udev", "onvif", "opcua", "ascend"}
#: Unprivileged user of the controller image (as controller.Dockerfile's USER).
CONTROLLER_UID = 65532


@pytest.fixture(scope="module")
def archives() -> Path:
    """The archives ``make images`` writes, through that target (so its record of what is built
    stays true): built here when missing or out of date, nothing done when up to date."""
    done = subprocess.run(["make", "--no-print-directory", "images", "AGENT_HANDLER_SETS=all"],
                          cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"make images failed:\n{done.stderr[-4000:]}"
    return IMAGES_DIR


@dataclass(frozen=True)
class Unpacked:
    """An image as a runtime would start it: its root, command, user and environment."""

    tag: str
    rootfs: Path
    args: list[str]
    uid: int
    gid: int
    env: dict[str, str]

    def run(self, *args: str, as_image_user: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command in the unpacked root with the image's environment."""
        user = [f"--userspec={self.uid}:{self.gid}"] if as_image_user else []
        return subprocess.run(
            ["chroot", *user, str(self.rootfs), "/usr/bin/env", "-i",
             *(f"{k}={v}" for k, v in self.env.items()), *args],
            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        )


def _unpack(archive: Path, folder: Path) -> Unpacked:
    layout, bundle = folder / "layout", folder / "bundle"
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="tar")
    [manifest] = json.loads((layout / "index.json").read_text())["manifests"]
    tag = manifest["annotations"][REF_NAME]
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    process = json.loads((bundle / "config.json").read_text())["process"]
    env = dict(item.split("=", 1) for item in process["env"])
    return Unpacked(tag=tag, rootfs=bundle / "rootfs", args=list(process["args"]),
                    uid=process["user"]["uid"], gid=process["user"]["gid"], env=env)


@pytest.fixture(scope="module")
def agent(archives: Path, tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    return _unpack(archives / "edgeplug-agent.oci.tar", tmp_path_factory.mktemp("agent"))


@pytest.fixture(scope="module")
def controller(archives: Path, tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    return _unpack(archives / "edgeplug-controller.oci.tar",
                  tmp_path_factory.mktemp("controller"))


def _version() -> str:
    for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("pyproject.toml has no version")


def test_agent_image_entrypoint_answers_help(agent: Unpacked) -> None:
    assert agent.tag == _version()
    assert agent.args == ["edgeplug-agent"]
    # Root: the agent creates its sockets in the kubelet's root-owned device-plugin directory.
    assert (agent.uid, agent.gid) == (0, 0)
    done = agent.run(*agent.args, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: edgeplug-agent"), done.stdout
    assert "NODE_NAME" in done.stdout


def test_controller_image_entrypoint_answers_help_unprivileged(controller: Unpacked) -> None:
    assert controller.tag == _version()
    assert controller.args == ["edgeplug-controller"]
    assert (controller.uid, controller.gid) == (CONTROLLER_UID, CONTROLLER_UID)
    done = controller.run(*controller.args, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: edgeplug-controller"), done.stdout


LOAD_HANDLERS = """
import ctypes.util, importlib.metadata as md
names = []
for ep in md.entry_points(group="edgeplug.discovery_handlers"):
    ep.load()
    names.append(ep.name)
import pyudev, asyncua, onvif, lxml.etree
assert ctypes.util.find_library("udev"), "libudev not found (pyudev needs it)"
print(",".join(sorted(names)))
"""


def test_agent_image_loads_every_handler_and_its_library(agent: Unpacked) -> None:
    done = agent.run("python3", "-c", LOAD_HANDLERS)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.strip().split(",")) == HANDLERS


@pytest.mark.parametrize(
    ("image", "present", "absent"),
    [("agent", "lightkube, grpc, agent.main", "kopf, kubernetes, controller, pip"),
     ("controller", "kopf, kubernetes, controller.main", "agent, pyudev, asyncua, pip")],
)
def test_each_image_holds_its_own_part_only(
    request: pytest.FixtureRequest, image: str, present: str, absent: str
) -> None:
    unpacked: Unpacked = request.getfixturevalue(image)
    assert unpacked.run("python3", "-c", f"import {present}").returncode == 0
    for module in absent.split(", "):
        done = unpacked.run("python3", "-c", f"import {module}")
        assert done.returncode != 0, f"the {image} image holds {module}"
        assert "ModuleNotFoundError" in done.stderr, done.stderr
