"""The discovery-handler contract (version 2): what every handler, built in or third party, gives.

The one seam between the agent and handlers, knowing nothing of Kubernetes: ``Device``, ``Health``,
``DeviceList``, ``Secret``, ``InvalidDetails``, the ``DiscoveryHandler`` protocol and its optional
hooks (``ClaimDevice``: what the DRA prepare hook answers), and ``run_blocking`` for blocking
work. The contract: docs/handlers.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

#: Threads shared by every handler's blocking calls (see ``run_blocking``).
BLOCKING_WORKERS = 8

_T = TypeVar("_T")


@dataclass(frozen=True)
class Mount:
    """A host path a broker container gets mounted (for example a vendor driver directory)."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    """A device node a broker container may open; permissions are cgroup's ``r``, ``w``, ``m``."""

    container_path: str
    host_path: str
    permissions: str = "rwm"


@dataclass(frozen=True)
class Health:
    """Whether a present device may be handed out now; ``reason`` says why not (shown to users)."""

    healthy: bool = True
    reason: str = ""

    @classmethod
    def unhealthy(cls, reason: str) -> Health:
        return cls(healthy=False, reason=reason)


HEALTHY = Health()


@dataclass(frozen=True)
class Device:
    """One discovered device.

    ``id`` must be stable across discoveries and restarts: the Instance name is derived from it.
    ``properties`` reach brokers as environment variables, so names are shell-safe identifiers;
    they must never hold a secret (the agent refuses a device whose property carries a Secret's
    value). ``warning`` is a problem users should see that does not make the device unhealthy
    (a camera refusing the configured credentials, listed with what it shows without them): the
    agent posts it once as a Warning Event on the Instance; it never holds a secret. ``extra``
    is the handler's own data for its hooks (a chip's card number, say); it reaches neither the
    API nor a container.
    """

    id: str
    properties: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    health: Health = HEALTHY
    warning: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)


#: Properties that make a device one partition of a bigger one, for DRA's partitionable
#: devices (KEP-4815; ``crds.dra_slices`` publishes them): the counter set it consumes from (one
#: per whole device, a DNS label such as ``davinci0``), what it consumes and what the whole has,
#: as ``<counter>=<quantity>`` pairs (``aicore=4,memory=4Gi``).
PARTITION_COUNTER_SET = "DRA_COUNTER_SET"
PARTITION_CONSUMES = "DRA_CONSUMES_COUNTERS"
PARTITION_SHARED = "DRA_SHARED_COUNTERS"


class DeviceList(tuple[Device, ...]):
    """A device list that also says what went wrong with discovery itself, short of failing.

    ``warnings`` are problems users should see on the Configuration that belong to no device
    (a discovery server that stopped answering, so the servers it listed are gone from the
    list). A handler may yield a ``DeviceList`` wherever a plain sequence is allowed; each time
    a warning appears in a yielded list the agent logs it and posts it once as a Warning Event
    on the Configuration, and logs when it is gone. The warnings are the current state, not a
    stream of news: a handler repeats a warning in every list while it holds, and a change of
    warnings alone is a reason to yield a new list. They never hold a secret. Equality is the
    tuple's (devices only).
    """

    warnings: tuple[str, ...]

    def __new__(cls, devices: Iterable[Device] = (), warnings: Iterable[str] = ()) -> Self:
        listed = super().__new__(cls, devices)
        listed.warnings = tuple(warnings)
        return listed


def warnings_of(devices: Sequence[Device]) -> tuple[str, ...]:
    """The discovery warnings a yielded list carries (none for a plain sequence)."""
    return devices.warnings if isinstance(devices, DeviceList) else ()


@dataclass(frozen=True, eq=True)
class Secret:
    """A discovery property read from a Kubernetes Secret: bytes, shown as ``<redacted>``.

    Binary Secret data (a DER certificate, a key) stays bytes; ``text()`` decodes UTF-8 and names
    no content when it cannot.
    """

    value: bytes = field(repr=False)

    def text(self) -> str:
        try:
            return self.value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError("secret value is not UTF-8 text") from exc

    def __str__(self) -> str:
        return "<redacted>"

    def __repr__(self) -> str:
        return "Secret(<redacted>)"


#: A resolved discovery property: literal and ConfigMap values are text, Secret values ``Secret``.
PropertyValue = str | Secret


def property_text(properties: Mapping[str, PropertyValue], name: str) -> str | None:
    """The text of property ``name`` (Secret or not), None when absent."""
    value = properties.get(name)
    if value is None:
        return None
    return value.text() if isinstance(value, Secret) else value


class InvalidDetails(ValueError):
    """``discoveryDetails`` (or a discovery property) the handler cannot accept.

    ``field`` names the offending field as a dotted path, e.g. ``"udevRules[2]"``, so the agent
    can report it on the Configuration's status and in an Event.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"discoveryDetails.{field}: {message}")
        self.field = field
        self.reason = message


@runtime_checkable
class DiscoveryHandler(Protocol):
    """What the agent needs of a handler. Implementations are plain objects, often singletons.

    - ``name`` is what a Configuration's ``discoveryHandler.name`` says.
    - ``shared`` is True when the devices are reachable from several nodes (network cameras,
      OPC-UA servers) and False for node-local ones (USB ports, NPUs). Parsed details may carry
      a boolean ``shared`` attribute that overrides it per Configuration.
    - ``parse_details`` validates ``discoveryDetails`` (YAML text) and the resolved discovery
      properties and returns typed details, raising ``InvalidDetails`` on bad input. It must not
      import a vendor library (the admission webhook and ``edgeplug discover`` call it).
    - ``discover`` yields the complete current device list at once and again every time it
      changes (a device's health changing is a change); it runs until cancelled. Errors it
      cannot recover from propagate; the agent reports them and restarts the run with backoff.
      Problems it carries on through are reported as a ``DeviceList``'s ``warnings``.
    """

    name: str
    shared: bool

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> Any: ...

    def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]: ...


@runtime_checkable
class ComposingHandler(DiscoveryHandler, Protocol):
    """A handler that says what one container gets when it is given several of its devices.

    ``compose`` returns the container's environment for ``devices`` (in allocation order), e.g.
    ``{"ASCEND_VISIBLE_DEVICES": "0,1"}``; the Configuration's ``brokerProperties`` are added on
    top by the agent. Without this hook each device's properties reach the container twice: as
    ``NAME_<INSTANCE HASH>`` for every device, and as plain ``NAME`` (Akri's behaviour).
    Mounts and device nodes are always the union of the devices'.
    """

    def compose(self, details: Any, devices: Sequence[Device]) -> Mapping[str, str]: ...


@runtime_checkable
class RankingHandler(DiscoveryHandler, Protocol):
    """A handler that ranks devices for a multi-device request (same card, same NUMA node).

    ``rank`` returns ``size`` devices from ``available`` (healthy and free on this node),
    always including ``must_include``; the configuration-level plugin answers the kubelet's
    ``GetPreferredAllocation`` with it and places the request's slots accordingly.
    """

    def rank(
        self,
        details: Any,
        available: Sequence[Device],
        must_include: Sequence[Device],
        size: int,
    ) -> Sequence[Device]: ...


@runtime_checkable
class LabellingHandler(DiscoveryHandler, Protocol):
    """A handler that describes the node's devices as Node labels a scheduler or a person reads
    (chip model and count, say). Keys under ``edgeplug.io/`` are set on the agent's own Node
    while the Configuration has devices there and removed with the last device. Other keys are
    ignored, except the few a vendor's own device plugin writes that the agent's node policy
    lets through (``agent.discovery.node_labels.FOREIGN_LABEL_KEYS``): those are set and, as the
    vendor's plugin does, never removed."""

    def node_labels(self, details: Any, devices: Sequence[Device]) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class PodFacts:
    """A pod that holds devices of this node, as ``AnnotatingHandler`` sees it."""

    name: str
    uid: str
    host_ip: str  # the address of the pod's node, as the kubelet reports it


@runtime_checkable
class AnnotatingHandler(DiscoveryHandler, Protocol):
    """A handler whose devices' users expect annotations on the pods that hold them (the pod
    annotations a vendor's own device plugin writes, which its schedulers read).

    The agent asks after the kubelet lists the pod with the devices (pod-resources), with all of
    the pod's devices of one Configuration, and merges the answer into the pod's annotations
    (only the keys its pod policy allows: ``agent.deviceplugins.pod_annotations.ANNOTATION_KEYS``).
    An empty answer writes nothing."""

    def pod_annotations(self, details: Any, devices: Sequence[Device], pod: PodFacts
                        ) -> Mapping[str, str]: ...


@runtime_checkable
class PreparingHandler(DiscoveryHandler, Protocol):
    """A handler that must check or prepare devices right before a container starts.

    The agent then asks the kubelet for ``PreStartContainer`` and calls ``prepare`` with the
    container's devices; raising fails the container's start with the exception's message.
    """

    async def prepare(self, details: Any, devices: Sequence[Device]) -> None: ...


@dataclass(frozen=True)
class ClaimDevice:
    """What a handler made on the node for one device of a DRA claim: ``device`` as the
    claim's containers get it, and ``record``, what undoing it needs (text only: the agent
    keeps it in its prepared-claims record, across restarts, and logs it; never a secret)."""

    device: Device
    record: Mapping[str, str]


@runtime_checkable
class ClaimPreparingHandler(DiscoveryHandler, Protocol):
    """A handler that makes something on the node for a device a DRA claim was allocated (a
    vNPU cut from the chip a partition names, say) when the kubelet prepares the claim, and
    removes it when the claim is unprepared.

    - ``prepare_claim_device`` makes it and says what the containers get, or returns None when
      the device needs nothing made; raising refuses the claim with the exception's message and
      must leave nothing made.
    - ``unprepare_claim_device`` removes what ``record`` names; it gets no details (the agent
      may have restarted since), so the record says all it needs. Raising leaves the claim
      prepared: the kubelet asks again.
    - ``claim_device_kept`` is told of each record the agent kept from before its restart
      (when its DRA plugin starts), so the handler knows what it made.
    """

    async def prepare_claim_device(self, details: Any, device: Device) -> ClaimDevice | None: ...

    async def unprepare_claim_device(self, record: Mapping[str, str]) -> None: ...

    def claim_device_kept(self, record: Mapping[str, str]) -> None: ...


def is_shared(handler: DiscoveryHandler, details: Any) -> bool:
    """Whether one Configuration's devices are shared: a boolean ``shared`` attribute on its
    parsed details (debugEcho's choice per Configuration) wins over the handler's."""
    override = getattr(details, "shared", None)
    return override if isinstance(override, bool) else handler.shared


_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _blocking_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=BLOCKING_WORKERS, thread_name_prefix="handler-blocking"
        )
    return _executor


async def run_blocking(func: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Run a blocking call on the handlers' thread pool and await its result.

    Cancelling the awaiting task returns at once; the thread cannot be interrupted and finishes
    its call in the background (so bound the call itself where the library allows: a socket
    timeout, a library's own deadline). Context variables travel with the call.
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    return await loop.run_in_executor(_blocking_executor(), call)
