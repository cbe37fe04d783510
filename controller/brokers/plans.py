"""Plans: diffs of the objects the controller wants against the ones that exist. Pure.

``plan_pods`` decides which broker pods to create and delete (rollouts, backoffs, Pending graces,
admission rejections; ``BrokerPolicy`` holds the timings), ``plan_objects`` the same for Jobs and
Services. The rules: docs/architecture.md, "The controller's modules".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from controller import naming
from controller.state import admission
from controller.state.records import ObservedPod

#: Rejections at admission of one broker in a row that are recreated at once (see above).
ADMISSION_IMMEDIATE_MAX: Final = 5

REASON_NODE_GONE: Final = "NodeRemoved"
REASON_SPEC_CHANGED: Final = "SpecChanged"
REASON_FAILED: Final = "BrokerFailed"
REASON_ADMISSION: Final = "BrokerRejectedAtAdmission"
REASON_FINISHED: Final = "BrokerFinished"
REASON_PENDING: Final = "PendingTooLong"
REASON_NOT_WANTED: Final = "NotWanted"


@dataclass(frozen=True, kw_only=True)
class BrokerPolicy:
    """The timings a plan decides by (``controller.settings.BrokerSettings`` declares them)."""

    pending_grace_s: float
    restart_backoff_base_s: float
    restart_backoff_max_s: float

    def backoff_s(self, restarts: int) -> float:
        """Delay before recreating a broker that has been recreated ``restarts`` times."""
        exponent = min(max(restarts, 0), 30)
        return float(min(self.restart_backoff_base_s * 2**exponent, self.restart_backoff_max_s))


@dataclass(frozen=True)
class Deletion:
    name: str
    reason: str
    message: str
    uid: str = ""  # of the pod deleted, where its Events name it


@dataclass
class Plan:
    """What to do. ``retry_after_s`` is when a waiting decision (backoff, grace) comes due."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[Deletion] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)
    retry_after_s: float | None = None

    @property
    def empty(self) -> bool:
        return not (self.create or self.delete or self.update)

    def wait(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.retry_after_s is None or seconds < self.retry_after_s:
            self.retry_after_s = seconds

    def extend(self, other: Plan) -> None:
        self.create += other.create
        self.delete += other.delete
        self.update += other.update
        if other.retry_after_s is not None:
            self.wait(other.retry_after_s)


def _desired_hash(obj: Mapping[str, Any]) -> str:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(naming.ANNOTATION_SPEC_HASH, ""))


def plan_pods(
    *,
    desired: Mapping[str, Mapping[str, Any]],
    actual: Iterable[ObservedPod],
    now: datetime,
    policy: BrokerPolicy,
    restarts: Mapping[str, int],
    admissions: Mapping[str, int] | None = None,
) -> Plan:
    """The plan that turns ``actual`` broker pods (of one Instance) into ``desired`` ones.
    ``restarts`` and ``admissions`` count, per pod name, its recreations after a failure and
    after a rejection at admission since it was last Ready."""
    plan = Plan()
    existing: dict[str, ObservedPod] = {}
    for pod in actual:
        existing[pod.name] = pod
        if pod.deleting:
            continue
        want = desired.get(pod.name)
        if want is None:
            plan.delete.append(Deletion(
                pod.name, REASON_NODE_GONE,
                "not wanted any more: its node left the Instance, or the Configuration has no"
                " broker pod spec now",
            ))
            continue
        if pod.spec_hash != _desired_hash(want):
            plan.delete.append(
                Deletion(pod.name, REASON_SPEC_CHANGED, "the Configuration's broker spec changed")
            )
            continue
        rejected = admission.rejected_at_admission(
            phase=pod.phase, reason=pod.reason, message=pod.message
        )
        if rejected and (admissions or {}).get(pod.name, 0) < ADMISSION_IMMEDIATE_MAX:
            plan.delete.append(Deletion(
                pod.name, REASON_ADMISSION, rejection_message(pod, "at once"), uid=pod.uid
            ))
        elif pod.phase in ("Failed", "Succeeded"):
            _plan_restart(plan, pod, now=now, policy=policy, restarts=restarts.get(pod.name, 0),
                          rejected=rejected)
        elif pod.phase == "Pending" and pod.created_at is not None:
            age = (now - pod.created_at).total_seconds()
            if age >= policy.pending_grace_s:
                plan.delete.append(
                    Deletion(
                        pod.name, REASON_PENDING, f"still Pending after {age:.0f}s; recreating"
                    )
                )
            else:
                plan.wait(policy.pending_grace_s - age)
    for name, want in desired.items():
        if name not in existing:
            plan.create.append(dict(want))
    return plan


def rejection_message(pod: ObservedPod, when: str) -> str:
    """What the kubelet said when it rejected ``pod``, and when the controller recreates it."""
    where = f" on node {pod.node}" if pod.node else ""
    return (f"rejected at admission by the kubelet{where}: {pod.reason}: {pod.message};"
            f" recreating it {when}")


def _plan_restart(
    plan: Plan, pod: ObservedPod, *, now: datetime, policy: BrokerPolicy, restarts: int,
    rejected: bool = False,
) -> None:
    delay = policy.backoff_s(restarts)
    since = pod.finished_at or pod.created_at or now
    waited = (now - since).total_seconds()
    if waited < delay:
        plan.wait(delay - waited)
        return
    if rejected:  # rejected too often in a row for "at once": still counted and reported
        when = f"after a backoff (restart {restarts + 1})"
        plan.delete.append(Deletion(pod.name, REASON_ADMISSION, rejection_message(pod, when),
                                    uid=pod.uid))
        return
    reason = REASON_FAILED if pod.phase == "Failed" else REASON_FINISHED
    message = f"broker {pod.phase.lower()}; recreating (restart {restarts + 1})"
    plan.delete.append(Deletion(pod.name, reason, message))


def plan_objects(
    *,
    desired: Mapping[str, Mapping[str, Any]],
    actual: Mapping[str, str],
    update_in_place: bool,
) -> Plan:
    """Jobs and services: ``actual`` maps existing names to their spec-hash annotation.

    Missing objects are created, unwanted ones deleted; one whose hash differs is updated in
    place (services) or deleted to be created anew once gone (jobs, whose pod template is
    immutable).
    """
    plan = Plan()
    for name, current_hash in actual.items():
        want = desired.get(name)
        if want is None:
            plan.delete.append(Deletion(name, REASON_NOT_WANTED, "no longer wanted"))
        elif current_hash != _desired_hash(want):
            if update_in_place:
                plan.update.append(dict(want))
            else:
                plan.delete.append(
                    Deletion(name, REASON_SPEC_CHANGED, "the Configuration's broker spec changed")
                )
    for name, want in desired.items():
        if name not in actual:
            plan.create.append(dict(want))
    return plan
