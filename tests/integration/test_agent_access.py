"""The controller's agent-access Roles let the agent read exactly the referenced Secrets.

Controller/grants/agent_access.py is what would let the agent's ClusterRole drop
its cluster-wide Secret and ConfigMap reads (deploy/README.md, "What a node's agent can do"). Here
it runs against the real API server, granting two nodes' own accounts (agent/kube/node_account.py:
``node-<node>`` in a node-accounts namespace of the test's own, with no other grant, so that
every answer comes from these Roles alone): the Secret and the ConfigMap a Configuration names
become readable and watchable by name with each account's own token while the Configuration
selects every node, and with node A's alone once its nodeSelector selects only A; an unnamed
Secret next to them stays refused, a ConfigMap the Configuration names in another namespace
(here the accounts' own) stays refused too (a Configuration references its own namespace
only), and when the Configuration goes, so do the reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.rbac_authorization_v1 import Role

from controller.grants.agent_access import ROLE_NAME, AgentAccess
from tests.harness.agent_process import api_client, apply, debug_echo_configuration, eventually
from tests.harness.aio_process import task_running
from tests.harness.controlplane import ControlPlane
from tests.harness.service_accounts import Identity, mint

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60.0


def _reads(who: Identity, cp: ControlPlane, kind: str, name: str, namespace: str) -> bool:
    result = who.kubectl(cp, "get", kind, name, "-n", namespace, "-o", "name")
    if result.returncode == 0:
        return True
    assert "forbidden" in result.stderr.lower(), result.stderr
    return False




async def test_agent_reads_only_what_a_configuration_names(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    other = f"{namespace}-cm"
    cp.kubectl("create", "namespace", other)
    suffix = namespace[-6:]
    node_a, node_b = f"access-a-{suffix}", f"access-b-{suffix}"
    for node in (node_a, node_b):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"site": node}}}))
    try:
        # The nodes' accounts live in a namespace of their own, as edgeplug-system-nodes:
        # nothing is ever granted there.
        readers = {}
        for node in (node_a, node_b):
            cp.kubectl("create", "serviceaccount", f"node-{node}", "-n", other)
            readers[node] = mint(cp, namespace=other, account=f"node-{node}",
                                 path=tmp_path / node)
        reader, reader_b = readers[node_a], readers[node_b]
        cp.kubectl("create", "secret", "generic", "cam-login", "-n", namespace,
                   "--from-literal=password=s3cret")
        cp.kubectl("create", "secret", "generic", "unnamed", "-n", namespace,
                   "--from-literal=token=other")
        cp.kubectl("create", "configmap", "cam-cfg", "-n", namespace, "--from-literal=port=554")
        cp.kubectl("create", "configmap", "elsewhere", "-n", other, "--from-literal=port=554")
        cfg = debug_echo_configuration("access-cam", descriptions=["cam0"], discovery_properties=[
            {"name": "password",
             "valueFrom": {"secretKeyRef": {"name": "cam-login", "key": "password"}}},
            {"name": "port", "valueFrom": {"configMapKeyRef": {"name": "cam-cfg", "key": "port"}}},
            {"name": "other", "valueFrom": {"configMapKeyRef": {
                "name": "elsewhere", "key": "port", "namespace": other}}},
        ])
        assert not _reads(reader, cp, "secret", "cam-login", namespace)
        client = api_client(cp)
        try:
            access = AgentAccess(client, account=(other, "agent"), node_accounts=other)
            async with task_running(access.run(), name="agent-access") as task:
                apply(cp, namespace, cfg)

                async def granted() -> bool:
                    assert not task.done(), "agent access stopped"
                    return all(_reads(r, cp, "secret", "cam-login", namespace)
                               and _reads(r, cp, "configmap", "cam-cfg", namespace)
                               for r in (reader, reader_b))

                await eventually(granted, what="reads of the named Secret and ConfigMap",
                                 deadline=WAIT_S)
                assert reader.can(cp, "watch", "secrets/cam-login", namespace=namespace)
                assert not _reads(reader, cp, "secret", "unnamed", namespace)
                assert not reader.can(cp, "list", "secrets", namespace=namespace)
                assert not reader.can(cp, "watch", "secrets", namespace=namespace)
                assert not _reads(reader, cp, "configmap", "kube-root-ca.crt", namespace)
                assert not _reads(reader, cp, "configmap", "elsewhere", other)
                with pytest.raises(ApiError):
                    await client.get(Role, ROLE_NAME, namespace=other)
                role = await client.get(Role, ROLE_NAME, namespace=namespace)
                assert [r.resourceNames for r in role.rules or []] == [["cam-cfg"],
                                                                        ["cam-login"]]

                # Only node A selected: only A's account reads them.
                cfg["spec"]["nodeSelector"] = {"matchLabels": {"site": node_a}}
                apply(cp, namespace, cfg)

                async def narrowed() -> bool:
                    assert not task.done(), "agent access stopped"
                    return not _reads(reader_b, cp, "secret", "cam-login", namespace)

                await eventually(narrowed, what="node B's read withdrawn", deadline=WAIT_S)
                assert _reads(reader, cp, "secret", "cam-login", namespace)
                assert not _reads(reader_b, cp, "configmap", "cam-cfg", namespace)

                cp.kubectl("delete", "configuration", "access-cam", "-n", namespace)

                async def revoked() -> bool:
                    assert not task.done(), "agent access stopped"
                    return not (_reads(reader, cp, "secret", "cam-login", namespace)
                                or _reads(reader, cp, "configmap", "cam-cfg", namespace))

                await eventually(revoked, what="reads revoked with the Configuration",
                                 deadline=WAIT_S)
                with pytest.raises(ApiError):
                    await client.get(Role, ROLE_NAME, namespace=namespace)
        finally:
            await client.close()
    finally:
        cp.kubectl("delete", "namespace", other, "--wait=false", check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)

