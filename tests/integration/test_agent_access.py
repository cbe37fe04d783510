"""The controller's agent-access Roles let the agent read exactly the referenced Secrets.

Why this exists: controller/agent_access.py is what would let the agent's ClusterRole drop its
cluster-wide Secret and ConfigMap reads (deploy/README.md, "What a node's agent can do"). Here
it runs against the real API server, granting a ServiceAccount of the test's own (one with no
other grant, so that every answer comes from these Roles alone; in a namespace of its own, as
the agent's is): the Secret and the ConfigMap a Configuration names become readable and
watchable by name with that account's own token, an unnamed Secret next to them stays refused,
a ConfigMap the Configuration names in another namespace (here the account's own) stays refused
too (a Configuration references its own namespace only), and when the Configuration goes, so
do the reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.rbac_authorization_v1 import Role

from controller.agent_access import ROLE_NAME, AgentAccess
from tests.harness.agent_process import api_client, apply, debug_echo_configuration, eventually
from tests.harness.aio_process import task_running
from tests.harness.controlplane import ControlPlane
from tests.harness.service_accounts import Identity, mint

pytestmark = pytest.mark.timeout(120)

READER = "agent-stand-in"
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
    try:
        # The stand-in lives in a namespace of its own, as the agent does (edgeplug-system):
        # nothing is ever granted there.
        cp.kubectl("create", "serviceaccount", READER, "-n", other)
        reader = mint(cp, namespace=other, account=READER, path=tmp_path / "reader")
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
            async with task_running(AgentAccess(client, account=(other, READER)).run(),
                                    name="agent-access") as task:
                apply(cp, namespace, cfg)

                async def granted() -> bool:
                    assert not task.done(), "agent access stopped"
                    return (_reads(reader, cp, "secret", "cam-login", namespace)
                            and _reads(reader, cp, "configmap", "cam-cfg", namespace))

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

