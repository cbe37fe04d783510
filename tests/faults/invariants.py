"""One recorder of the invariants every fault must keep, checked on every event while it runs.

A fault that breaks an invariant for two seconds and then heals would pass a
test that looks only at the end. ``InvariantRecorder`` is fed by real watches on the API server
(Instances and Pods of the test's namespace, each re-listed and re-watched after any error, so
an API outage loses nothing but time) and by the kubelets' own records (``DeviceNode``'s records
file, read every ``KUBELET_POLL_S``: the kubelet's device manager has no watch to offer), and
flags at once:

- an Instance serving more live containers than its capacity, judged by what each container
  got from ``Allocate`` (its Instance device ids, and for the Configuration resource the
  Instance hash in its environment), never by ``deviceUsage``: a wrong free erases the very
  record that would show it;
- a slot held by two live pods (the kubelets' allocations, with the Configuration resource's
  virtual ids mapped onto slots through ``deviceUsage``), or held by a live pod on one node
  while ``deviceUsage`` gives it to another node;
- a pod failed with ``UnexpectedAdmissionError`` (or failed at all): any status the API server
  ever reported, and any the kubelets recorded (a kubelet killed right after rejecting a pod
  may never have told the API server);
- an Instance deleted, or re-created under a new uid, though its device never vanished (the test
  says which devices it took away: ``allow_gone``);
- two live broker pods for one (Instance, node).

A slot problem counts when two readings ``KUBELET_POLL_S`` apart both show it with the same
pods: a pod live in both readings was live while the other was seen (the records of two
kubelets are read one after the other, and each is written a moment after its kubelet acts).
``problems_now`` is the final-state check the tests poll after the fault (``converged``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from agent.kube.client import InstanceResource, as_dict
from crds.api import GROUP
from crds.instance import SlotUsage, SlotUsageKind
from crds.naming import LABEL_TARGET_NODE
from tests.harness.kube_waits import until

log = logging.getLogger(__name__)

#: How often the kubelets' records are read while a fault runs.
KUBELET_POLL_S = 0.2
#: Pause before a failed list or watch is tried again (the API server may be away).
WATCH_RETRY_S = 0.5
ADMISSION_ERROR = "UnexpectedAdmissionError"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_INSTANCE = "edgeplug.io/instance"
COMPONENT_BROKER = "broker"
ENDED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, order=True)
class Holder:
    """One live pod, as a kubelet holds it."""

    node: str
    namespace: str
    pod: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}@{self.node}"


class KubeletView:
    """What one kubelet (``DeviceNode``) allocated: its records file, read as it changes."""

    def __init__(self, node: str, records_path: Path) -> None:
        self.node = node
        self.records_path = records_path
        self._last: list[dict[str, Any]] = []

    def pods(self) -> list[dict[str, Any]]:
        """Every pod record (admitted, rejected, ended); the last good reading while the file
        is being replaced."""
        with contextlib.suppress(OSError, json.JSONDecodeError, ValueError):
            data = json.loads(self.records_path.read_text())
            self._last = list(data.get("pods") or [])
        return self._last

    def live_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if p.get("live")]


def is_broker(pod: Mapping[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == COMPONENT_BROKER


def is_live(pod: Mapping[str, Any]) -> bool:
    """Not being deleted and not ended."""
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase not in ENDED_PHASES


def broker_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(LABEL_INSTANCE, "?"), labels.get(LABEL_TARGET_NODE, "?")


def live_brokers(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(Instance, node) → names of the live broker pods for it."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pod in pods:
        if is_broker(pod) and is_live(pod):
            found[broker_key(pod)].append(pod["metadata"]["name"])
    return found


def slot_holders(
    kubelets: Sequence[KubeletView], instances: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, set[Holder]], list[str]]:
    """Slot → the live pods holding it, from the kubelets' allocations, and the virtual ids of
    the Configuration resource that ``deviceUsage`` does not (yet) map to a slot."""
    virtual: dict[tuple[str, str, str], str] = {}  # (configuration, vid, node) → slot
    configurations: set[str] = set()
    for name, obj in instances.items():
        spec = obj.get("spec") or {}
        configurations.add(spec.get("configurationName", ""))
        for slot, value in (spec.get("deviceUsage") or {}).items():
            usage = parse_usage(value)
            if usage is not None and usage.kind is SlotUsageKind.CONFIGURATION:
                virtual[(spec.get("configurationName", ""), usage.virtual_id, usage.node)] = slot
        del name
    holders: dict[str, set[Holder]] = defaultdict(set)
    unmapped: list[str] = []
    for kubelet in kubelets:
        for pod in kubelet.live_pods():
            holder = Holder(kubelet.node, pod["namespace"], pod["name"], pod.get("uid", ""))
            for container in pod.get("containers") or []:
                for resource, ids in (container.get("deviceIDs") or {}).items():
                    name = resource.removeprefix(f"{GROUP}/")
                    for device in ids or []:
                        if name in configurations and name not in instances:
                            slot = virtual.get((name, device, kubelet.node))
                            if slot is None:
                                unmapped.append(f"{resource} {device} of {holder}")
                                continue
                            holders[slot].add(holder)
                        else:
                            holders[device].add(holder)
    return holders, unmapped


def instance_users(
    kubelets: Sequence[KubeletView], capacities: Mapping[str, int]
) -> dict[str, set[str]]:
    """Instance → the live containers that got one of its slots, judged by what each container
    got from ``Allocate`` alone (never by ``deviceUsage``, which a wrong free erases).

    An Instance resource's device ids are its slots (each id one use). A Configuration
    resource's virtual ids name no slot: the Instance that served one is the one whose hash the
    container's environment carries (``<PROPERTY>_<HASH>``, Akri's names), one use per such
    Instance beyond those its own resource's ids account for. Users are named
    ``<namespace>/<pod>@<node>/<container>#<n>`` (``#n`` tells apart two slots of one container).
    """
    by_hash = {name.rpartition("-")[2].upper(): name for name in capacities}
    users: dict[str, set[str]] = defaultdict(set)
    for kubelet in kubelets:
        for pod in kubelet.live_pods():
            for container in pod.get("containers") or []:
                who = f"{pod['namespace']}/{pod['name']}@{kubelet.node}/{container.get('name')}"
                counted: dict[str, int] = defaultdict(int)
                for resource, ids in (container.get("deviceIDs") or {}).items():
                    name = resource.removeprefix(f"{GROUP}/")
                    if name in capacities:
                        counted[name] += len(ids or [])
                served = {by_hash[key.rpartition("_")[2]]
                          for key in container.get("envs") or {}
                          if key.rpartition("_")[2] in by_hash}
                for name in served:
                    counted[name] = max(counted[name], 1)
                for name, n in counted.items():
                    users[name].update(f"{who}#{k}" for k in range(n))
    return users


def overused(users: Mapping[str, set[str]], capacities: Mapping[str, int]) -> dict[str, str]:
    """Instance problems now: more live containers got its slots than it has (keys name the
    containers, so a re-reading can confirm the same ones)."""
    return {
        f"overused {name} {sorted(who)}": (
            f"Instance {name} of capacity {capacities[name]} serves {len(who)} live containers"
            f" at once: {', '.join(sorted(who))}")
        for name, who in users.items()
        if name in capacities and len(who) > capacities[name]
    }


def parse_usage(value: str) -> SlotUsage | None:
    try:
        return SlotUsage.parse(value)
    except ValueError:
        return None


def recorded_slots(instances: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Slot → the node ``deviceUsage`` gives it to (held slots only)."""
    out = {}
    for obj in instances.values():
        for slot, value in ((obj.get("spec") or {}).get("deviceUsage") or {}).items():
            usage = parse_usage(value)
            if usage is not None and usage.kind is not SlotUsageKind.FREE:
                out[slot] = usage.node
    return out


def slot_conflicts(
    holders: Mapping[str, set[Holder]], recorded: Mapping[str, str]
) -> dict[str, str]:
    """Slot → what is wrong with it now: two live pods, or a live pod on a node other than the
    one ``deviceUsage`` names. Keys name the pods so a re-reading can confirm the same ones."""
    found = {}
    for slot, pods in holders.items():
        if len(pods) > 1:
            found[f"{slot} {sorted(pods)}"] = (
                f"slot {slot} held by {len(pods)} live pods: {', '.join(map(str, sorted(pods)))}")
        owner = recorded.get(slot)
        for pod in pods:
            if owner is not None and owner != pod.node:
                found[f"{slot} {pod} {owner}"] = (
                    f"slot {slot} used by {pod} but deviceUsage gives it to {owner}")
    return found


@dataclass
class InvariantRecorder:
    """Watches one namespace and the given kubelets; ``violations`` lists every breach seen."""

    kubeconfig: Path
    namespace: str
    kubelets: Callable[[], Sequence[KubeletView]]
    violations: list[str] = field(default_factory=list)
    #: Events seen, by kind: proof that the watches were live during the fault.
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _uids: dict[str, str] = field(default_factory=dict)
    _may_go: set[str] = field(default_factory=set)
    _flagged: set[str] = field(default_factory=set)
    _suspects: dict[str, str] = field(default_factory=dict)
    #: Capacity of every Instance seen (kept after deletion: containers may outlive it).
    _capacities: dict[str, int] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _client: AsyncClient | None = None

    # -- what the test tells and asks --------------------------------------------------------

    def allow_gone(self, *instances: str) -> None:
        """These Instances' devices vanished (the test took them away): they may be deleted,
        and come back under a new uid."""
        self._may_go.update(instances)

    def assert_clean(self) -> None:
        assert not self.violations, "invariants broken during the fault:\n" + "\n".join(
            self.violations)

    def _flag(self, key: str, message: str) -> None:
        if key not in self._flagged:
            self._flagged.add(key)
            self.violations.append(message)
            log.error("invariant broken: %s", message)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> InvariantRecorder:
        self._client = AsyncClient(KubeConfig.from_file(str(self.kubeconfig)))
        self._tasks = [
            asyncio.create_task(self._follow(InstanceResource, self._on_instance,
                                             self.instances)),
            asyncio.create_task(self._follow(Pod, self._on_pod, self.pods)),
            asyncio.create_task(self._poll_kubelets()),
        ]
        await self._wait_listed()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.close()

    async def _wait_listed(self) -> None:
        """Return once both watches have listed (events["listed"] counts each list)."""
        await until(lambda: self.events["listed"] >= 2, what="the recorder's watches to list")

    # -- watches -----------------------------------------------------------------------------

    async def _follow(self, resource: Any, on_event: Callable[[str, dict[str, Any]], None],
                      state: dict[str, dict[str, Any]]) -> None:
        """List, then watch from the list's version; after any error, list again (objects
        gone meanwhile count as deleted)."""
        assert self._client is not None
        while True:
            try:
                listing = self._client.list(resource, namespace=self.namespace)
                current = {o["metadata"]["name"]: o async for o in _dicts(listing)}
                for name in set(state) - set(current):
                    on_event("DELETED", state[name])
                for obj in current.values():
                    on_event("MODIFIED" if obj["metadata"]["name"] in state else "ADDED", obj)
                self.events["listed"] += 1
                async for kind, obj in self._client.watch(
                    resource, namespace=self.namespace, resource_version=listing.resourceVersion
                ):
                    on_event(kind, as_dict(obj))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure: list and watch again
                self.events["watch errors"] += 1
                log.info("watch of %s: %r; listing again", resource.__name__, error)
            await asyncio.sleep(WATCH_RETRY_S)

    def _on_instance(self, kind: str, obj: dict[str, Any]) -> None:
        self.events[f"Instance {kind}"] += 1
        name, uid = obj["metadata"]["name"], obj["metadata"].get("uid", "")
        if kind == "DELETED":
            self.instances.pop(name, None)
            if name not in self._may_go:
                self._flag(f"deleted {name} {uid}",
                           f"Instance {name} deleted though its device never vanished")
            return
        seen = self._uids.get(name)
        if seen is not None and seen != uid and name not in self._may_go:
            self._flag(f"recreated {name} {uid}",
                       f"Instance {name} re-created (uid {seen} → {uid}) without cause")
        self._uids[name] = uid
        self.instances[name] = obj

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        self.events[f"Pod {kind}"] += 1
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
            return
        self.pods[name] = obj
        status = obj.get("status") or {}
        if status.get("reason") == ADMISSION_ERROR or status.get("phase") == "Failed":
            self._flag(f"failed {obj['metadata'].get('uid')}",
                       f"pod {name} failed: {status.get('reason')} {status.get('message')}")
        for (instance, node), names in live_brokers(self.pods.values()).items():
            if len(names) > 1:
                self._flag(f"brokers {sorted(names)}",
                           f"{len(names)} live brokers for {instance} on {node}: {names}")

    # -- the kubelets ------------------------------------------------------------------------

    async def _poll_kubelets(self) -> None:
        while True:
            self._check_slots()
            await asyncio.sleep(KUBELET_POLL_S)

    def _check_slots(self) -> None:
        self.events["slot checks"] += 1
        for kubelet in self.kubelets():
            for pod in kubelet.pods():
                if pod.get("phase") == "Failed" or pod.get("reason") == ADMISSION_ERROR:
                    self._flag(f"failed {pod.get('uid')}",
                               f"pod {pod.get('name')} failed on {kubelet.node}: "
                               f"{pod.get('reason')} {pod.get('message')}")
        holders, _ = slot_holders(self.kubelets(), self.instances)
        suspects = slot_conflicts(holders, recorded_slots(self.instances))
        for name, obj in self.instances.items():
            self._capacities[name] = int((obj.get("spec") or {}).get("capacity") or 1)
        suspects.update(overused(instance_users(self.kubelets(), self._capacities),
                                 self._capacities))
        for key in suspects.keys() & self._suspects.keys():
            self._flag(key, suspects[key])
        self._suspects = suspects


async def _dicts(listing: Any) -> AsyncIterator[dict[str, Any]]:
    async for obj in listing:
        yield as_dict(obj)
