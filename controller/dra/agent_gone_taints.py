"""The local pools of nodes whose agent is gone, tainted so the scheduler stops choosing them.

``AgentGoneTaints`` keeps one DeviceTaintRule ``edgeplug.io/agent-gone=<node>:NoSchedule`` per
local pool of each node ``set_gone`` names, deleted when the agent is back; where the API server
serves no DeviceTaintRule it says so once and does nothing. Why: docs/architecture.md, "The
controller's DRA side"."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any, Final

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from controller.dra.agent_liveness import taint_value
from controller.kube.rest import Rest
from controller.settings import DraSettings
from crds import agent_liveness, dra, dra_slices
from crds.resources import ResourceSliceResource

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "edgeplug-controller/agent-gone"
#: The API versions tried, newest first.
VERSIONS: Final = ("v1", "v1beta2")
PLURAL: Final = "devicetaintrules"
HTTP_OK: Final = 200
HTTP_NOT_FOUND: Final = 404
#: The label naming the node (``crds.dra_slices.node_label``) a rule was made for.
LABEL_NODE: Final = dra_slices.LABEL_NODE


def rule_name(pool: str) -> str:
    return f"{dra.DRIVER}-agent-gone-{dra.digest(pool)}"


def rule_body(api_version: str, node: str, pool: str) -> dict[str, Any]:
    """The DeviceTaintRule tainting every device of ``pool`` while ``node``'s agent is gone."""
    return {
        "apiVersion": f"resource.k8s.io/{api_version}", "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(pool), "labels": {
            dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER, LABEL_NODE: dra_slices.node_label(node)}},
        "spec": {"deviceSelector": {"driver": dra.DRIVER, "pool": pool},
                 "taint": {"key": agent_liveness.TAINT_AGENT_GONE, "value": taint_value(node),
                           "effect": "NoSchedule"}},
    }


def local_pools(node: str, slices: Iterable[dict[str, Any]]) -> set[str]:
    """The local pools of ``node`` among ``slices`` (the driver's, bound to the node)."""
    return {str(s["spec"]["pool"]["name"]) for s in slices
            if s["spec"].get("driver") == dra.DRIVER and s["spec"].get("nodeName") == node
            and not dra_slices.is_shared_pool(str(s["spec"]["pool"]["name"]))}


class AgentGoneTaints:
    """Keeps one DeviceTaintRule per local pool of every node in the set ``set_gone`` was
    last given, and none else of its own; ``run`` until cancelled."""

    def __init__(self, client: AsyncClient, http: Rest, *,
                 settings: DraSettings | None = None) -> None:
        self._retry_s = (settings or DraSettings()).gone_taints_retry_s
        self._client = client
        self._http = http
        self._gone: frozenset[str] = frozenset()
        #: rule name → the node label it was made for (adopted at start, then kept).
        self._rules: dict[str, str] = {}
        #: Nodes whose pools have been tainted since they went.
        self._tainted: set[str] = set()
        self._wake = asyncio.Event()
        self._resource: Any = None
        self.version: str | None = None  # the API version used; None: not served
        self.writes = 0  # applies and deletes, for tests

    def set_gone(self, gone: frozenset[str]) -> None:
        self._gone = gone
        self._wake.set()

    async def _served(self) -> str | None:
        for version in VERSIONS:
            code, body = await self._http.request("GET", f"/apis/resource.k8s.io/{version}")
            if code == HTTP_OK and PLURAL in {
                    r.get("name") for r in json.loads(body).get("resources") or ()}:
                return version
            if code not in (HTTP_OK, HTTP_NOT_FOUND):
                raise RuntimeError(f"resource.k8s.io/{version} discovery answered {code}")
        return None

    async def run(self) -> None:
        while True:
            try:
                self.version = await self._served()
                break
            except Exception as error:  # API away: wait it out
                log.warning("agent-gone taints: API discovery failed (%s); retrying", error)
                await asyncio.sleep(self._retry_s)
        if self.version is None:
            log.warning("the API server serves no DeviceTaintRule (DRADeviceTaints): a node "
                        "whose agent is gone keeps its local devices offered to the "
                        "scheduler; its shared devices are still withdrawn from it")
            return
        self._resource = create_global_resource(
            "resource.k8s.io", self.version, "DeviceTaintRule", PLURAL)
        failing = ""
        adopted = False
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if not adopted:
                    await self._adopt()
                    adopted = True
                await self.reconcile()
                failing = ""
            except Exception as error:  # API error or away: the pass is retried
                if str(error) != failing:
                    log.warning("agent-gone taints: pass failed (%s); retrying", error)
                failing = str(error)
                self._wake.set()
                await asyncio.sleep(self._retry_s)

    async def _adopt(self) -> None:
        async for obj in self._client.list(
                self._resource, labels={dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}):
            body = obj if isinstance(obj, dict) else obj.to_dict()
            taint = (body.get("spec") or {}).get("taint") or {}
            if taint.get("key") == agent_liveness.TAINT_AGENT_GONE:
                labels = body["metadata"].get("labels") or {}
                self._rules[str(body["metadata"]["name"])] = str(labels.get(LABEL_NODE, ""))

    async def reconcile(self) -> None:
        """Taint the pools of nodes gone since the last pass, untaint those of nodes back."""
        gone = self._gone
        self._tainted &= gone
        for node in sorted(gone - self._tainted):
            slices = [s if isinstance(s, dict) else s.to_dict() async for s in self._client.list(
                ResourceSliceResource, labels={LABEL_NODE: dra_slices.node_label(node)})]
            for pool in sorted(local_pools(node, slices)):
                body = rule_body(self.version or VERSIONS[0], node, pool)
                await self._client.patch(self._resource, body["metadata"]["name"], body,
                                         patch_type=PatchType.APPLY,
                                         field_manager=FIELD_MANAGER, force=True)
                self.writes += 1
                self._rules[body["metadata"]["name"]] = dra_slices.node_label(node)
            self._tainted.add(node)
            log.info("local pools of node %s tainted %s", node, agent_liveness.TAINT_AGENT_GONE)
        labels = {dra_slices.node_label(n) for n in gone}
        for name, label in sorted(self._rules.items()):
            if label in labels:
                continue
            try:
                await self._client.delete(self._resource, name)
                self.writes += 1
            except ApiError as error:
                if error.status.code != HTTP_NOT_FOUND:
                    raise
            del self._rules[name]
