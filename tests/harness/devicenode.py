"""A node whose device side is the kubelet's own device manager, behind NodeEmulator's interface.

The Python node emulator is our reading of the kubelet; ``DeviceNode`` runs the
kubelet's real device manager, pod-resources server and admission (the ``devicenode`` command
of the multi-call binary, see tests/harness/kubebin/devicenode.go) for one node, in a mount
namespace of its own so that its fixed ``/var/lib/kubelet/device-plugins/`` is the given plugin
directory. It has NodeEmulator's constructor and methods, so a test moves from one to the other
by changing the class; what the kubelet did is read from the JSON records file the node keeps.

A kubelet restart (``restart_kubelet``) restarts the process with its checkpoint and the
emulated runtime's containers kept; ``reboot`` restarts it without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any, cast

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from tests.harness import kubebin
from tests.harness.aio_process import terminate
from tests.harness.cdi import CdiDeviceNode, CdiEdits
from tests.harness.kubelet_records import ContainerAllocation, Registration
from tests.harness.node_stand_in import NodeStandIn

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
#: The kubelet's device-manager checkpoint, in the plugin directory.
CHECKPOINT = "kubelet_internal_checkpoint"
#: How long a node may take to come up (register the Node, serve kubelet.sock).
START_TIMEOUT_S = 60.0
#: How long a stopping node may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 15.0
#: How long a command on the node's stdin may take to be answered.
COMMAND_TIMEOUT_S = 30.0
#: How often start-up re-checks its condition.
WAIT_POLL_S = 0.05
LEASE_NAMESPACE = "kube-node-lease"


def _cdi_edits(report: Mapping[str, Any] | None) -> CdiEdits | None:
    """The runtime's CDI edits as tests/harness/cdi.py gives them (same JSON as cditool's)."""
    if report is None:
        return None
    return CdiEdits(
        env=dict(item.split("=", 1) for item in report["env"] or []),
        device_nodes=tuple(CdiDeviceNode(n["path"], n["type"], n["major"], n["minor"],
                                         n.get("permissions") or "")
                           for n in report["deviceNodes"] or []),
        mounts=tuple((m["source"], m["destination"], tuple(m["options"] or ()))
                     for m in report["mounts"] or []),
    )


class DeviceNode(NodeStandIn):
    """One node run by the kubelet's device manager: NodeEmulator's interface, the real code."""

    def _build(self) -> None:
        # The node's own /var/lib/kubelet, records and log; made by the first start.
        self._state_dir = Path("/tmp") / f"ep-dn-{self.node_name}-{uuid.uuid4().hex[:6]}"
        self.records_path = self._state_dir / "records.json"
        self.log_path = self._state_dir / "devicenode.log"
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        argv = [
            "unshare", "--mount", "--propagation", "private", "--",
            str(kubebin.build()), "devicenode",
            "--kubeconfig", str(self.kubeconfig), "--node-name", self.node_name,
            "--state-dir", str(self._state_dir / "kubelet"), "--plugin-dir", str(self.plugin_dir),
            "--records", str(self.records_path),
            "--cdi-spec-dirs", ",".join(str(d) for d in self.cdi_spec_dirs),
        ]
        if self.pod_resources_socket is not None:
            argv += ["--pod-resources-socket", str(self.pod_resources_socket)]
        if self.labels:
            argv += ["--labels", ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))]
        return argv

    async def start(self) -> None:
        """Start the node and return once its Node is posted and kubelet.sock is served."""
        if shutil.which("unshare") is None:
            raise RuntimeError("DeviceNode needs util-linux's 'unshare' (mount namespaces)")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._state_dir.mkdir(mode=0o700, exist_ok=True)
        before = self._data().get("started")
        self._log = self.log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            *self._argv(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=self._log)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            data = self._data()
            if data.get("ready") and data.get("started") != before and self.kubelet_socket.exists():
                break
            if self._process.returncode is not None:
                raise RuntimeError(f"devicenode {self.node_name} exited with "
                                   f"{self._process.returncode}:\n{self.log_tail()}")
            if loop.time() >= deadline:
                await self._terminate()
                raise TimeoutError(f"devicenode {self.node_name} did not come up in "
                                   f"{START_TIMEOUT_S:.0f}s:\n{self.log_tail()}")
            await asyncio.sleep(WAIT_POLL_S)
        log.info("devicenode %s serving %s", self.node_name, self.kubelet_socket)

    async def _terminate(self) -> None:
        process, self._process = self._process, None
        await terminate(process, grace_s=STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    async def stop(self, *, delete_node: bool = False) -> None:
        """Stop the node process; optionally delete its Node and Lease."""
        await self._terminate()
        if delete_node:
            async with contextlib.AsyncExitStack() as stack:
                client = AsyncClient(KubeConfig.from_file(str(self.kubeconfig)))
                stack.push_async_callback(client.close)
                with contextlib.suppress(ApiError):
                    await client.delete(Lease, self.node_name, namespace=LEASE_NAMESPACE)
                with contextlib.suppress(ApiError):
                    await client.delete(Node, self.node_name)
        shutil.rmtree(self._state_dir, ignore_errors=True)

    async def __aenter__(self) -> DeviceNode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def restart_kubelet(self) -> None:
        """A kubelet restart: the process ends and starts again with its device-manager
        checkpoint and the runtime's containers kept. The device manager deletes every plugin
        socket as it starts; running pods keep their devices without a new Allocate."""
        await self._terminate()
        await self.start()

    async def reboot(self) -> None:
        """A node reboot: the process starts again with neither checkpoint nor running
        containers, so every pod bound to the node is admitted (and allocated) anew."""
        await self._terminate()
        (self.plugin_dir / CHECKPOINT).unlink(missing_ok=True)
        data = self._data()
        data["pods"] = []
        self.records_path.write_text(json.dumps(data))
        await self.start()

    async def set_node_ready(self, ready: bool) -> None:
        """Post Ready=True or Ready=False now, as a kubelet whose runtime broke or recovered."""
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise RuntimeError(f"devicenode {self.node_name} is not running")
        command = f"ready {'true' if ready else 'false'}"
        process.stdin.write(f"{command}\n".encode())
        await process.stdin.drain()
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            answer = (await process.stdout.readline()).decode().strip()
        if answer != f"ok {command}":
            raise RuntimeError(f"devicenode {self.node_name}: {command!r} answered {answer!r}")

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # -- what tests read -------------------------------------------------------------------

    def _data(self) -> dict[str, Any]:
        """The records file as it is now, parsed at every read. A cache keyed on its mtime
        returned a stale copy for good: the node replaces the file twice within one tick of the
        kernel's coarse clock (a plugin connected, then its devices), both copies carry the same
        mtime, and a read between them kept the first (connected, no devices) while the node,
        with nothing more to say, never wrote again. The file is a few KiB."""
        try:
            return cast(dict[str, Any], json.loads(self.records_path.read_text()))
        except FileNotFoundError:
            return {}

    @property
    def registrations(self) -> list[Registration]:
        """Every registration the kubelet accepted (it connected to the plugin), oldest first."""
        return [Registration(resource_name=r["resource"], endpoint=r["endpoint"],
                             time=datetime.fromisoformat(r["time"]),
                             pre_start_required=r["preStartRequired"],
                             get_preferred_allocation_available=r["getPreferredAllocationAvailable"])
                for r in self._data().get("registrations") or []]

    def _pod(self, namespace: str, pod: str) -> dict[str, Any] | None:
        found = [p for p in self._data().get("pods") or []
                 if p["namespace"] == namespace and p["name"] == pod]
        return found[-1] if found else None

    def containers(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        """The newest pod of that name's containers as the runtime created them (device ids
        per resource, envs, mounts, devices, CDI names, and ``cdi``: the resolved edits)."""
        record = self._pod(namespace, pod)
        return list(record["containers"] or []) if record is not None else []

    def pod_failure(self, namespace: str, pod: str) -> tuple[str, str] | None:
        """(reason, message) the node gave when it failed the newest pod of that name."""
        record = self._pod(namespace, pod)
        if record is None or record["phase"] != "Failed":
            return None
        return record["reason"], record["message"]

    def allocations(self, namespace: str, pod: str) -> list[ContainerAllocation]:
        """What each container of the newest pod of that name got, one entry per resource
        (a container with several resources carries the merged options in each entry)."""
        out = []
        for c in self.containers(namespace, pod):
            for resource, ids in sorted((c["deviceIDs"] or {}).items()):
                out.append(ContainerAllocation(
                    resource_name=resource, device_ids=tuple(ids), envs=dict(c["envs"] or {}),
                    mounts=tuple((m[0], m[1], bool(m[2])) for m in c["mounts"] or []),
                    devices=tuple((d[0], d[1], d[2]) for d in c["devices"] or []),
                    cdi_devices=tuple(c["cdiDevices"] or []),
                    annotations=dict(c["annotations"] or {}), container=c["name"],
                    init_container=c["init"], cdi_edits=_cdi_edits(c["cdi"])))
        return out

    def allocated_device_ids(self, resource_name: str) -> set[str]:
        """Device ids of the resource that live pods on this node hold."""
        return {
            device
            for record in self._data().get("pods") or [] if record["live"]
            for c in record["containers"] or []
            for device in (c["deviceIDs"] or {}).get(resource_name, [])
        }

    def healthy_device_ids(self, resource_name: str) -> list[str]:
        """Device ids the kubelet counts healthy for the resource (empty when not connected)."""
        return sorted((self._data().get("healthy") or {}).get(resource_name) or [])

    def plugin_connected(self, resource_name: str) -> bool:
        """Whether the kubelet holds a connected client for the resource's plugin (it
        disconnects it when the plugin's ListAndWatch stream ends)."""
        return bool((self._data().get("connected") or {}).get(resource_name))

    def pod_admitted(self, namespace: str, pod: str) -> bool:
        """Whether the newest pod of that name was admitted and still holds its devices."""
        record = self._pod(namespace, pod)
        return record is not None and bool(record["live"])

