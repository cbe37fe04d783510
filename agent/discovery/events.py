"""Tell users, on the Configuration itself, what this node's discovery run thinks of it.

``ConfigurationReporter`` (``ok``, ``problem``, ``warnings``) applies this node's conditions
(``DiscoveryDetailsValid``, ``DiscoveryReady.<node>``, ``DiscoveryHealthy.<node>``) and posts
Events; ``emit_event`` posts one Event. Which verdict goes where, and why: docs/architecture.md,
"The agent's discovery modules".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from agent.kube import watching
from agent.kube.client import ConfigurationResource, field_manager, is_not_found
from crds.api import API_VERSION, CONDITION_DISCOVERY_DETAILS_VALID, CONFIGURATION_KIND
from crds.configuration import Configuration

log = logging.getLogger(__name__)

CONDITION_TYPE_PREFIX = "DiscoveryReady"
HEALTH_CONDITION_PREFIX = "DiscoveryHealthy"
#: The field manager suffix of the warnings condition (``DiscoveryHealthy.<node>``).
WARNINGS_MANAGER_SUFFIX = "-warnings"
EVENT_COMPONENT = "edgeplug-agent"
#: Reasons, CamelCase as Kubernetes conventions ask.
REASON_RUNNING = "DiscoveryRunning"
REASON_INVALID_DETAILS = "InvalidDiscoveryDetails"
REASON_UNKNOWN_HANDLER = "UnknownDiscoveryHandler"
REASON_PROPERTY_UNAVAILABLE = "DiscoveryPropertyUnavailable"
REASON_DISCOVERY_FAILED = "DiscoveryFailed"
REASON_VALID = "DiscoveryDetailsValid"
#: The reason of ``DiscoveryHealthy.<node>`` and of the Warning Event per new warning.
REASON_DISCOVERY_WARNING = "DiscoveryWarning"
#: Problems every node finds alike: reported once, in the shared condition.
CONFIGURATION_WIDE_REASONS = frozenset({REASON_INVALID_DETAILS, REASON_PROPERTY_UNAVAILABLE})
MAX_MESSAGE_LENGTH = 1024


def condition_type(node_name: str) -> str:
    """The condition that carries ``node_name``'s own discovery problems."""
    return f"{CONDITION_TYPE_PREFIX}.{node_name}"


def health_condition_type(node_name: str) -> str:
    """The condition that carries ``node_name``'s discovery warnings while it has any."""
    return f"{HEALTH_CONDITION_PREFIX}.{node_name}"


def condition_type_for(reason: str, node_name: str) -> str:
    """Which condition a problem with ``reason`` is reported in."""
    if reason in CONFIGURATION_WIDE_REASONS:
        return CONDITION_DISCOVERY_DETAILS_VALID
    return condition_type(node_name)


@dataclass(frozen=True)
class _Verdict:
    ok: bool
    reason: str
    message: str


class ConfigurationReporter:
    """Events and this node's condition for one Configuration (one per discovery run)."""

    def __init__(self, *, client: AsyncClient, node_name: str, configuration: Configuration):
        self._client = client
        self._node = node_name
        self._configuration = configuration
        self._last: _Verdict | None = None
        self._since = datetime.now(UTC)
        #: What the API server holds of this run's warnings; None: not known (none written yet,
        #: or a write not answered)
        self._warned: tuple[str, ...] | None = None
        self._warned_since = self._since

    async def ok(self, message: str) -> None:
        await self._report(_Verdict(True, REASON_RUNNING, message), event=False)

    async def problem(self, reason: str, message: str) -> None:
        """A Warning Event and a False condition; repeated identical problems are written once."""
        await self._report(_Verdict(False, reason, message[:MAX_MESSAGE_LENGTH]), event=True)

    async def warnings(self, messages: Sequence[str]) -> None:
        """Set ``DiscoveryHealthy.<node>`` to False with ``messages``, or withdraw it when there
        are none. Written when they change, and once when the run starts (a warning that ended
        while the agent was down is withdrawn); a failed write is tried again at the next call.
        """
        current = tuple(sorted(set(messages)))
        if current == self._warned:
            return
        if current and not self._warned:
            self._warned_since = datetime.now(UTC)
        # Unknown until the API server answers: a write cancelled in flight (the run stopped)
        # may have landed, so the next call writes whatever it has.
        self._warned = None
        conditions = []
        if current:
            message = f"node {self._node}: " + "; ".join(current)
            conditions.append({
                "type": health_condition_type(self._node), "status": "False",
                "reason": REASON_DISCOVERY_WARNING, "message": message[:MAX_MESSAGE_LENGTH],
            })
        try:
            await self._apply_conditions(conditions, self._warned_since,
                                         manager_suffix=WARNINGS_MANAGER_SUFFIX)
        except Exception as exc:  # the API server away: the next call or resync writes it
            gone = isinstance(exc, ApiError) and is_not_found(exc)
            if not (gone and not current):  # withdrawn from a deleted one: done
                cfg = self._configuration
                log.warning("could not write the discovery warnings of %s/%s: %s",
                            cfg.namespace, cfg.name, exc)
                return
        self._warned = current

    async def _report(self, verdict: _Verdict, *, event: bool) -> None:
        if verdict == self._last:
            return
        if self._last is None or self._last.ok != verdict.ok:
            self._since = datetime.now(UTC)
        self._last = verdict
        cfg = self._configuration
        log.log(
            logging.INFO if verdict.ok else logging.WARNING,
            "discovery %s: %s",
            verdict.reason,
            verdict.message,
            extra={"configuration": f"{cfg.namespace}/{cfg.name}", "reason": verdict.reason,
                   "node": self._node},
        )
        try:
            if event:
                await self._emit_event(verdict)
            await self._write_condition(verdict)
        except Exception as exc:  # the Configuration going away, the API server unreachable
            # (httpx's errors): never fail the run over its report
            log.warning("could not report on %s/%s: %s", cfg.namespace, cfg.name,
                        watching.describe(exc))

    async def _write_condition(self, verdict: _Verdict) -> None:
        if verdict.ok:
            # Details valid; this node's own condition is withdrawn by leaving it out.
            condition = {"type": CONDITION_DISCOVERY_DETAILS_VALID, "status": "True",
                         "reason": REASON_VALID, "message": "discoveryDetails accepted"}
        else:
            condition = {"type": condition_type_for(verdict.reason, self._node),
                         "status": "False", "reason": verdict.reason,
                         "message": verdict.message}
        await self._apply_conditions([condition], self._since)

    async def _apply_conditions(self, conditions: list[dict[str, str]], since: datetime, *,
                                manager_suffix: str = "") -> None:
        """Server-side apply of this node's ``conditions`` (none: withdraw what the field
        manager ``field_manager(node) + manager_suffix`` applied before)."""
        cfg = self._configuration
        stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": API_VERSION,
            "kind": CONFIGURATION_KIND,
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "status": {"conditions": [
                {**c, "lastTransitionTime": stamp, "observedGeneration": cfg.generation}
                for c in conditions
            ]} if conditions else {},
        }
        await self._client.patch(
            ConfigurationResource.Status,
            cfg.name,
            body,
            namespace=cfg.namespace,
            patch_type=PatchType.APPLY,
            field_manager=field_manager(self._node) + manager_suffix,
            force=True,
        )

    async def _emit_event(self, verdict: _Verdict) -> None:
        cfg = self._configuration
        await emit_event(
            self._client, node=self._node, kind=CONFIGURATION_KIND, name=cfg.name,
            namespace=cfg.namespace, uid=cfg.uid, reason=verdict.reason,
            message=verdict.message, warning=True,
        )


async def emit_event(
    client: AsyncClient,
    *,
    node: str,
    kind: str,
    name: str,
    namespace: str,
    uid: str,
    reason: str,
    message: str,
    warning: bool,
) -> None:
    """One core/v1 Event about an edgeplug object, reported by this node's agent."""
    now = datetime.now(UTC)
    event = Event(
        metadata=ObjectMeta(generateName=f"{name}.", namespace=namespace),
        involvedObject=ObjectReference(
            apiVersion=API_VERSION, kind=kind, name=name, namespace=namespace, uid=uid or None,
        ),
        reason=reason,
        message=message[:MAX_MESSAGE_LENGTH],
        type="Warning" if warning else "Normal",
        source=EventSource(component=EVENT_COMPONENT, host=node),
        reportingComponent=EVENT_COMPONENT,
        reportingInstance=node,
        firstTimestamp=now,
        lastTimestamp=now,
        count=1,
    )
    await client.create(event)
