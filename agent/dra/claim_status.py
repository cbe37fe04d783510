"""What a prepared claim says of its devices: ResourceClaim ``status.devices``, for the claims this
agent prepares.

``ClaimStatus`` writes, per device of ours, a ``Ready`` condition following its health on this
node, its properties as ``data`` and a network device's address as ``networkData``, by
server-side apply of the claim's status (field manager ``edgeplug-agent-<node>``). A worker sends
the writes, never delaying a prepare, and rewrites a claim when a device's health changes; a
refused write is logged once. docs/dra.md, "What a prepared claim says: ``status.devices``".
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlsplit

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube.client import field_manager
from crds import dra

log = logging.getLogger(__name__)

ResourceClaimResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)

CONDITION_READY: Final = "Ready"
REASON_HEALTHY: Final = "DeviceHealthy"
REASON_UNHEALTHY: Final = "DeviceUnhealthy"
REASON_NOT_SERVED: Final = "DeviceNotServed"
#: The API's limit on a device's ``data`` is 10 KiB; properties beyond this many bytes of JSON
#: are left out (named in ``leftOut``).
MAX_DATA_BYTES: Final = 8 * 1024
MAX_MESSAGE: Final = 1024
#: Properties that name a network device's address (the handlers' own names).
IP_PROPERTIES: Final = ("ONVIF_DEVICE_IP_ADDRESS",)
MAC_PROPERTIES: Final = ("ONVIF_DEVICE_MAC_ADDRESS",)
URL_PROPERTIES: Final = ("OPCUA_DISCOVERY_URL", "ONVIF_DEVICE_SERVICE_URL")
HTTP_FORBIDDEN: Final = 403
HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
HTTP_UNPROCESSABLE: Final = 422

#: (pool, device name) of one allocated device of a claim.
Allocated = tuple[str, str]
#: The device this node serves under a pool and device name, among the table's (or None).
Finder = Callable[[Iterable[NodeDevice], str, str], "NodeDevice | None"]


def network_data(properties: Mapping[str, str]) -> dict[str, Any] | None:
    """``networkData`` for a device whose properties name an address: ``ips`` in CIDR form
    (the API's), from the IP property or the host of a URL property when it is an IP;
    ``hardwareAddress`` from the MAC property. None for a device with neither."""
    ips: list[str] = []
    candidates = [properties.get(p, "") for p in IP_PROPERTIES]
    candidates += [urlsplit(properties.get(p, "")).hostname or "" for p in URL_PROPERTIES]
    for text in candidates:
        try:
            address = ipaddress.ip_address(text.strip("[]"))
        except ValueError:
            continue
        cidr = f"{address}/{address.max_prefixlen}"
        if cidr not in ips:
            ips.append(cidr)
    found: dict[str, Any] = {}
    if ips:
        found["ips"] = ips
    mac = next((properties[p] for p in MAC_PROPERTIES if properties.get(p)), None)
    if mac:
        found["hardwareAddress"] = mac[:128]
    return found or None


def device_data(device: NodeDevice) -> dict[str, Any]:
    """The device's ``data``: its Instance, Configuration and properties (as many as fit)."""
    data: dict[str, Any] = {"instance": device.instance, "configuration": device.configuration,
                            "properties": {}}
    left: list[str] = []
    size = len(json.dumps(data))
    for name, value in sorted(device.properties.items()):
        cost = len(json.dumps({name: value})) + 1
        if size + cost > MAX_DATA_BYTES:
            left.append(name)
            continue
        data["properties"][name] = value
        size += cost
    if left:
        data["leftOut"] = left
    return data


def ready(device: NodeDevice | None) -> tuple[str, str, str]:
    """(status, reason, message) of the ``Ready`` condition."""
    if device is None:
        return "Unknown", REASON_NOT_SERVED, "the device is not served on this node now"
    if device.healthy:
        return "True", REASON_HEALTHY, ""
    return "False", REASON_UNHEALTHY, device.health.reason[:MAX_MESSAGE]


def device_entry(pool: str, name: str, device: NodeDevice | None, *, since: str,
                 share_id: str | None = None) -> dict[str, Any]:
    """One ``status.devices`` entry; ``since``: the condition's ``lastTransitionTime``;
    ``share_id``: the allocation's ``shareID`` of a device shared between claims (the API
    server refuses an entry of such a device without it)."""
    status, reason, message = ready(device)
    entry: dict[str, Any] = {
        "driver": dra.DRIVER, "pool": pool, "device": name,
        **({"shareID": share_id} if share_id else {}),
        "conditions": [{"type": CONDITION_READY, "status": status, "reason": reason,
                        "message": message, "lastTransitionTime": since}],
    }
    if device is not None:
        entry["data"] = device_data(device)
        network = network_data(device.properties)
        if network is not None:
            entry["networkData"] = network
    return entry


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def written_since(claim: Mapping[str, Any]) -> dict[Allocated, tuple[str, str]]:
    """What the claim already says of our devices: (pool, device) → (Ready status, time)."""
    found: dict[Allocated, tuple[str, str]] = {}
    for entry in (claim.get("status") or {}).get("devices") or ():
        if entry.get("driver") != dra.DRIVER:
            continue
        for condition in entry.get("conditions") or ():
            if condition.get("type") == CONDITION_READY:
                found[(str(entry.get("pool")), str(entry.get("device")))] = (
                    str(condition.get("status")), str(condition.get("lastTransitionTime")))
    return found


class ClaimStatus:
    """Writes ``status.devices`` of the claims this node prepared; ``run`` until cancelled.

    ``prepared`` is told each claim as it is prepared (with what the claim already said);
    ``forget`` when it is unprepared; the worker follows the device table for health changes.
    """

    def __init__(self, client: AsyncClient, *, node_name: str, devices: NodeDeviceTable,
                 find: Finder) -> None:
        self._client = client
        self._devices = devices
        self._find = find
        self._manager = field_manager(node_name)
        #: uid → (namespace, name, allocated devices).
        self._claims: dict[str, tuple[str, str, tuple[Allocated, ...]]] = {}
        #: (uid, pool, device) → (Ready status, lastTransitionTime) as last written.
        self._ready: dict[tuple[str, str, str], tuple[str, str]] = {}
        #: What each claim's last write held, to write only what changed.
        self._written: dict[str, list[dict[str, Any]]] = {}
        #: uid → the share ids of its devices shared between claims.
        self._shares: dict[str, dict[Allocated, str]] = {}
        self._pending: set[str] = set()
        self._wake = asyncio.Event()
        self._refused = False
        self.writes = 0  # status writes made, for tests

    def prepared(self, uid: str, namespace: str, name: str, allocated: Iterable[Allocated],
                 claim: Mapping[str, Any] | None = None,
                 shares: Mapping[Allocated, str] | None = None) -> None:
        """``shares``: the allocation's ``shareID`` of each device shared between claims."""
        self._claims[uid] = (namespace, name, tuple(allocated))
        self._shares[uid] = dict(shares or {})
        for (pool, device), ready_since in written_since(claim or {}).items():
            self._ready.setdefault((uid, pool, device), ready_since)
        self._pending.add(uid)
        self._wake.set()

    def forget(self, uid: str) -> None:
        self._claims.pop(uid, None)
        self._written.pop(uid, None)
        self._shares.pop(uid, None)
        self._pending.discard(uid)
        for key in [k for k in self._ready if k[0] == uid]:
            del self._ready[key]

    def entries(self, uid: str) -> list[dict[str, Any]]:
        """The claim's entries now (a condition's time moves only when its status does)."""
        _, _, allocated = self._claims[uid]
        table = self._devices.snapshot().values()
        found = []
        for pool, name in allocated:
            device = self._find(table, pool, name)
            status = ready(device)[0]
            before = self._ready.get((uid, pool, name))
            since = before[1] if before is not None and before[0] == status else now()
            self._ready[(uid, pool, name)] = (status, since)
            found.append(device_entry(pool, name, device, since=since,
                                      share_id=self._shares.get(uid, {}).get((pool, name))))
        return found

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow_devices())
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending:
                    uid = self._pending.pop()
                    if uid in self._claims:
                        await self._write(uid)

    async def _follow_devices(self) -> None:
        """A change in the device table looks at every claim again; only those whose
        entries differ are written."""
        version = self._devices.version
        while True:
            version = await self._devices.wait_changed(version)
            self._pending.update(self._claims)
            self._wake.set()

    async def _write(self, uid: str) -> None:
        if self._refused:
            return  # refused once: no right, no request per claim (an agent restart retries)
        namespace, name, _ = self._claims[uid]
        entries = self.entries(uid)
        if self._written.get(uid) == entries:
            return
        if uid not in self._written and any("data" not in e for e in entries):
            # Not written by this process yet and a device not served (yet: an agent that
            # just started has an empty table): no "Unknown" written over what is there.
            return
        body = {"apiVersion": dra.API_VERSION, "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "status": {"devices": entries}}
        try:
            await self._client.patch(ResourceClaimResource.Status, name, body,
                                     namespace=namespace, patch_type=PatchType.APPLY,
                                     field_manager=self._manager, force=True)
        except ApiError as error:
            code = error.status.code
            if code == HTTP_FORBIDDEN:
                if not self._refused:
                    log.warning("claim status not written: the agent's token may not patch "
                                "resourceclaims/status (%s); see docs/dra.md",
                                error.status.message)
                self._refused = True
            elif code not in (HTTP_NOT_FOUND, HTTP_CONFLICT, HTTP_UNPROCESSABLE):
                log.warning("claim status not written (%s)", error.status.message,
                            extra={"claim": f"{namespace}/{name}"})
            return
        except Exception as error:  # the API server away: the next change writes it
            log.warning("claim status not written (%s)", error,
                        extra={"claim": f"{namespace}/{name}"})
            return
        self.writes += 1
        self._written[uid] = entries

