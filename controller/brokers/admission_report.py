"""Events and metrics for pods the kubelet rejected at admission: brokers and users' pods.

``AdmissionReporter.broker_rejected`` and ``user_pod`` post one Event per pod, once across replicas
and restarts (docs/architecture.md, "The controller's modules").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from controller.brokers.eventbatch import event_object
from controller.kube.client import Kube, Refused
from controller.metrics import ControllerMetrics
from controller.naming import MANAGED_BY
from controller.state import admission
from controller.state.records import RejectedPod
from controller.state.view import ClusterView
from crds.api import API_VERSION, CONFIGURATION_KIND, INSTANCE_KIND
from crds.instance import Instance

log = logging.getLogger(__name__)

REASON_BROKER_REJECTED: Final = "BrokerAdmissionFailed"
REASON_POD_REJECTED: Final = "AdmissionFailed"
#: Uids of reported pods remembered at most (they are forgotten when the pod goes; this bounds
#: the set should deletions be missed across a relist).
REPORTED_MAX: Final = 100_000


def instance_body(instance: Instance) -> dict[str, Any]:
    """What an Event needs of the Instance it is about."""
    return {"apiVersion": API_VERSION, "kind": INSTANCE_KIND, "metadata": {
        "name": instance.name, "namespace": instance.namespace, "uid": instance.uid}}


def pod_message(pod: RejectedPod, resource: str) -> str:
    where = f" on node {pod.node}" if pod.node else ""
    return (f"pod {pod.namespace}/{pod.name} was rejected at admission{where} for {resource}:"
            f" {pod.reason}: {pod.message}. A pod rejected at admission stays Failed: delete it"
            " (or let its Deployment or Job replace it) to try again")


class AdmissionReporter:
    def __init__(self, *, kube: Kube, metrics: ControllerMetrics,
                 component: str = MANAGED_BY) -> None:
        self.kube = kube
        self.metrics = metrics
        self.component = component
        self.reported: set[str] = set()

    async def _post(
        self, body: Mapping[str, Any], *, reason: str, message: str, pod_uid: str
    ) -> bool:
        """Posts the Event about pod ``pod_uid`` on ``body``; True when this call created it,
        False when it existed already. Raises when the API refused or failed."""
        event = event_object(body, warning=True, reason=reason, message=message,
                             component=self.component)
        meta = body["metadata"]
        event["metadata"] = {"namespace": meta["namespace"],
                             "name": admission.event_name(str(meta["name"]), pod_uid)}
        return await self.kube.create(event)

    async def broker_rejected(
        self, *, instance: Instance, configuration: str, pod: str, pod_uid: str, message: str
    ) -> None:
        """Counts a broker pod deleted after a rejection at admission and posts the Event on
        its Instance (best effort: a lost Event is logged, the broker is recreated anyway)."""
        self.metrics.broker_admission_failures.labels(instance.namespace, configuration).inc()
        try:
            await self._post(instance_body(instance), reason=REASON_BROKER_REJECTED,
                             message=f"broker pod {pod} {message}", pod_uid=pod_uid or pod)
        except Exception as error:
            log.warning("Event %s on Instance %s/%s not posted: %s", REASON_BROKER_REJECTED,
                        instance.namespace, instance.name, error)

    def targets(
        self, view: ClusterView, pod: RejectedPod
    ) -> list[tuple[str, Mapping[str, Any], str]]:
        """(resource, involved object's body, its Configuration) for each resource blamed."""
        blamed = admission.blamed_resources(
            reason=pod.reason, message=pod.message, requested=pod.resources
        )
        targets: list[tuple[str, Mapping[str, Any], str]] = []
        for resource in blamed:
            owners = view.resource_owners(resource)  # none: another vendor's resource
            here = [o for o in owners if o[1] == pod.namespace]
            for kind, namespace, name in here or owners:
                if kind == INSTANCE_KIND:
                    record = view.instance(namespace, name)
                    if record is not None:
                        inst = record.instance
                        targets.append((resource, instance_body(inst),
                                        inst.spec.configuration_name))
                elif kind == CONFIGURATION_KIND:
                    config = view.configuration(namespace, name)
                    if config is not None:
                        targets.append((resource, config.body, name))
        return targets

    async def user_pod(self, view: ClusterView, pod: RejectedPod) -> None:
        """Reports a user's pod rejected at admission for an edgeplug resource, once."""
        if pod.uid in self.reported:
            return
        created = False
        targets = self.targets(view, pod)
        for resource, body, _ in targets:
            try:
                created |= await self._post(body, reason=REASON_POD_REJECTED,
                                            message=pod_message(pod, resource),
                                            pod_uid=pod.uid)
            except Refused as refused:  # would be refused again: no retry (an outage retries)
                log.warning("Event %s about pod %s/%s refused: %s", REASON_POD_REJECTED,
                            pod.namespace, pod.name, refused.message)
        if created:
            namespace = str(targets[0][1]["metadata"]["namespace"])
            self.metrics.pod_admission_failures.labels(namespace, targets[0][2]).inc()
            log.warning("%s", pod_message(pod, ", ".join(sorted({t[0] for t in targets}))))
        if len(self.reported) >= REPORTED_MAX:
            self.reported.clear()
        self.reported.add(pod.uid)

    def forget(self, pod_uid: str) -> None:
        """The pod is gone: its uid will never be seen again."""
        self.reported.discard(pod_uid)
