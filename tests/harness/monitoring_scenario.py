"""The monitoring scenario: a real agent and controller, scraped by a real Prometheus, taken
through the stages every alert and dashboard panel needs.

Tests/integration/test_prometheus.py checks the alerts and the dashboard's
queries against what the processes export, and tests/harness/dashboard_picture.py draws the
dashboard from the same run; both take this one scenario through its stages in order:

- ``quiet``: a shared debugEcho Configuration (two healthy cameras) and a node-local one (two
  "NPUs", served by the agent's device plugins to the kubelet's own device manager,
  ``DeviceNode``), and a pod holding one NPU slot through the Configuration's resource (one
  Allocate);
- ``unplug``: a camera goes offline (shared: it stays, unhealthy, for its grace);
- ``missing_handler``: a Configuration names a handler that does not exist;
- ``refused_broker``: the API server refuses a broker pod (requests above limits), on an
  Instance of a node without an agent;
- ``failing_webhook``: a validating webhook whose server is down (failurePolicy Fail) makes the
  API server answer the agent's Instance writes of one Configuration with HTTP 500, until it
  is removed;
- ``apiserver_restart``: the API server restarts: every watch starts over;
- ``stop_controller`` and ``stop_agent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from tests.harness import agent_process as agents
from tests.harness import controller_process as controllers
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import running, wait_pod, wait_service_account
from tests.harness.prometheus import Prometheus, alert_exprs
from tests.harness.stand_ins import node_dirs, running_node

#: The Configuration whose Instance writes the failing webhook refuses.
BLOCKED = "blocked"
#: The node-local Configuration served by device plugins, and its pod.
NPUS, NPU_POD = "npus", "npu-user"


@dataclass
class Stand:
    """What the scenario runs on."""

    cp: ControlPlane
    namespace: str
    node: DeviceNode
    lonely: str  # a Node that Instances list, without an agent
    offline: Path  # the cameras' availability file
    prometheus: Prometheus
    agent: agents.AgentSubprocess
    controller: controllers.ControllerProcess
    kube: AsyncClient

    @property
    def node_name(self) -> str:
        return self.node.node_name

    def q(self, expr: str) -> list[dict[str, Any]]:
        return self.prometheus.query(expr)

    async def until(self, what: str, expr: str) -> list[dict[str, Any]]:
        """``expr``'s result once Prometheus gives a non-empty one."""
        found: list[dict[str, Any]] = await self.prometheus.until(what, lambda: self.q(expr))
        return found

    # -- the stages -----------------------------------------------------------------------

    async def quiet(self) -> None:
        ns = self.namespace
        agents.apply(self.cp, ns, agents.debug_echo_configuration(
            "cams", descriptions=["cam0", "cam1"], availability_file=self.offline, grace=3600))
        agents.apply(self.cp, ns, agents.debug_echo_configuration(
            NPUS, descriptions=["npu0", "npu1"], shared=False))
        await self.until("two healthy devices of each Configuration", (
            f'count(edgeplug_devices{{namespace="{ns}",health="healthy"}} == 2) == 2'))
        await self.until("the controller active", "edgeplug_controller_active == 1")
        await self.until("the node's Instances counted",
                         f'edgeplug_node_instances{{node="{self.node_name}"}} == 4')
        await wait_service_account(self.kube, ns)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": NPU_POD},
               "spec": {"nodeSelector": {"kubernetes.io/hostname": self.node_name},
                        "containers": [{
                   "name": "main", "image": "registry.invalid/npu-user:1",
                   "resources": {"limits": {f"edgeplug.io/{NPUS}": "1"}}}]}}
        await self.until("the NPUs' device plugins serving",
                         f'edgeplug_slots_capacity{{configuration="{NPUS}"}} == 2')
        agents.apply(self.cp, ns, pod)
        await wait_pod(self.kube, ns, NPU_POD, running, "Running on an NPU slot")
        await self.until("one NPU slot used", f'edgeplug_slots_used{{configuration="{NPUS}"}} == 1')

    async def unplug(self) -> list[dict[str, Any]]:
        staged = self.offline.with_name("offline.new")
        staged.write_text("cam1\n")
        staged.replace(self.offline)
        return await self.until("EdgeplugDeviceUnhealthy", alert_exprs()["EdgeplugDeviceUnhealthy"])

    async def missing_handler(self) -> list[dict[str, Any]]:
        bad = agents.debug_echo_configuration("nohandler", descriptions=["x"])
        bad["spec"]["discoveryHandler"]["name"] = "noSuchHandler"
        agents.apply(self.cp, self.namespace, bad)
        return await self.until("EdgeplugDiscoveryFailing",
                                alert_exprs()["EdgeplugDiscoveryFailing"])

    async def refused_broker(self) -> list[dict[str, Any]]:
        ns = self.namespace
        pod_spec = controllers.broker_pod_spec()
        pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "2"},
                                                  "limits": {"cpu": "1"}}
        controllers.apply(self.cp, controllers.configuration(ns, "refused", pod_spec=pod_spec))
        controllers.apply(self.cp, controllers.instance(
            ns, "refused-abcdef", configuration_name="refused", nodes=[self.lonely]))
        without = await self.until("EdgeplugConfigurationWithoutBrokers",
                                   alert_exprs()["EdgeplugConfigurationWithoutBrokers"])
        await self.until("a refusal counted", (
            f'edgeplug_broker_refusals_total{{configuration="refused",namespace="{ns}"}} > 0'))
        return without

    async def failing_webhook(self) -> list[dict[str, Any]]:
        """The agent's Instance writes of ``BLOCKED`` answered 500 by the API server, counted
        (a rising count: ``increase`` sees it), then the webhook removed."""
        name = f"edgeplug-down-{self.namespace}"
        webhook = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "down.monitoring.edgeplug.test",
                # Nothing listens there: the call fails, and failurePolicy Fail refuses.
                "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/validate"},
                "rules": [{"apiGroups": ["edgeplug.io"], "apiVersions": ["*"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["instances"],
                           "scope": "Namespaced"}],
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                "matchConditions": [{"name": "blocked-configuration", "expression": (
                    "has(object.spec) && has(object.spec.configurationName) && "
                    f"object.spec.configurationName == '{BLOCKED}'")}],
                "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 2,
            }],
        }
        self.cp.kubectl("apply", "-f", "-", stdin=json.dumps(webhook))
        try:
            agents.apply(self.cp, self.namespace, agents.debug_echo_configuration(
                BLOCKED, descriptions=["b0"], shared=False))
            return await self.until("the agent's refused writes counted, rising", (
                'sum by (code) (increase(edgeplug_api_errors_total{job="agent",code="500"}'
                '[5m])) > 0'))
        finally:
            self.cp.kubectl("delete", "validatingwebhookconfiguration", name)

    async def apiserver_restart(self) -> list[dict[str, Any]]:
        await asyncio.to_thread(self.cp.restart, "kube-apiserver")
        return await self.until("the agent's watches started over", (
            'sum by (kind) (increase(edgeplug_watch_restarts_total{job="agent"}[5m])) > 0'))

    async def stop_controller(self) -> list[dict[str, Any]]:
        self.controller.stop()
        return await self.until("EdgeplugNoActiveController",
                                alert_exprs()["EdgeplugNoActiveController"])

    async def stop_agent(self) -> None:
        self.agent.stop()
        await self.until("the agent's scrape failing", 'up{job="agent"} == 0')


@contextlib.asynccontextmanager
async def stand(cp: ControlPlane, namespace: str, workdir: Path) -> AsyncIterator[Stand]:
    """Everything started (Prometheus, a DeviceNode with its agent, the controller); all of it
    stopped on the way out."""
    lonely = agents.new_node(cp)
    agent_port, controller_port = free_port(), free_port()
    offline = workdir / "offline"
    offline.write_text("")
    controllers.install_peering_crds(cp)
    kube = agents.api_client(cp)
    prometheus = Prometheus(workdir, {"agent": agent_port, "controller": controller_port})
    try:
        with node_dirs() as dirs:
            async with running_node(DeviceNode, cp.kubeconfig, dirs) as node:
                agent = agents.AgentSubprocess(
                    cp, node_name=node.node_name, namespace=namespace,
                    serve_device_plugins=True, plugin_dir=dirs.plugin_dir,
                    log_path=workdir / "agent.log",
                    extra_env={"METRICS_PORT": str(agent_port), "METRICS_ADDRESS": "127.0.0.1",
                               "POD_RESOURCES_SOCKET": str(dirs.pod_resources_socket)})
                controller = controllers.ControllerProcess(
                    cp, namespaces=[namespace], log_path=workdir / "controller.log",
                    extra_args=(*controllers.FAST_ARGS, "--metrics-port", str(controller_port),
                                "--metrics-address", "127.0.0.1"))
                agent.start()
                controller.start()
                try:
                    yield Stand(cp, namespace, node, lonely, offline, prometheus, agent,
                                controller, kube)
                finally:
                    agent.stop()
                    controller.stop()
    finally:
        prometheus.stop()
        await kube.close()
