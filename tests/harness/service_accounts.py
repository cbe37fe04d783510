"""ServiceAccount identities for tests: a token minted through the TokenRequest API, in a
kubeconfig of its own, optionally bound to a pod on a node as a DaemonSet pod's token is; and
a node's kubelet client certificate, which the agent beside that kubelet reads its node's pods
and claims with (``kubelet_certificate``).

Tests that prove RBAC (tests/integration/test_rbac.py), and any test that wants
a part to run as it does in a cluster, need the part's own token rather than the admin's.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.realnode_config import node_credentials

TOKEN_DURATION = "2h"
KUBECTL_TIMEOUT_S = 60
#: The plain manifests (RBAC, admission policies) and the accounts they name.
MANIFESTS = REPO_ROOT / "deploy" / "manifests"
#: The compatibility mode's rights (pods watch, nodes/status), apart from the default install.
COMPAT = REPO_ROOT / "deploy" / "compat"
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
CONTROLLER_ACCOUNT = "edgeplug-controller"


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount's token, in a kubeconfig of its own."""

    account: str
    kubeconfig: Path

    def kubectl(self, cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cp.binaries.command("kubectl", f"--kubeconfig={self.kubeconfig}", *args),
            capture_output=True, text=True, check=False, timeout=KUBECTL_TIMEOUT_S,
        )

    def can(self, cp: ControlPlane, verb: str, resource: str, *, namespace: str | None = None,
            subresource: str | None = None) -> bool:
        """``kubectl auth can-i`` as this account; ``namespace`` None asks cluster-wide."""
        args = ["auth", "can-i", verb, resource]
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        if subresource:
            args.append(f"--subresource={subresource}")
        answer = self.kubectl(cp, *args).stdout.strip()
        assert answer in ("yes", "no"), f"kubectl auth can-i said {answer!r}"
        return answer == "yes"


def token_kubeconfig(cp: ControlPlane, token: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cp.server, "certificate-authority": str(cp.ca_cert)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def mint(cp: ControlPlane, *, namespace: str, account: str, path: Path,
         bound: tuple[str, ...] = ()) -> Identity:
    """A token for ``account`` (``kubectl create token``) written to a kubeconfig at ``path``."""
    token = cp.kubectl("create", "token", account, "-n", namespace,
                       f"--duration={TOKEN_DURATION}", *bound).stdout.strip()
    assert token, f"no token minted for {namespace}/{account}"
    return Identity(account, token_kubeconfig(cp, token, path))


def pod_bound(cp: ControlPlane, *, namespace: str, account: str, node: str,
              folder: Path) -> Identity:
    """The token a DaemonSet pod of ``account`` on ``node`` gets: bound to a pod there, so the
    API server writes the node's name into it (``authentication.kubernetes.io/node-name``).
    The pod (``<account>-<node>``) is created if missing; delete it when done."""
    pod = f"{account}-{node}"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "main", "image": "registry.invalid/pause:1"}]},
    }))
    uid = cp.kubectl("get", "pod", pod, "-n", namespace,
                     "-o", "jsonpath={.metadata.uid}").stdout.strip()
    return mint(cp, namespace=namespace, account=account, path=folder / pod,
                bound=("--bound-object-kind=Pod", f"--bound-object-name={pod}",
                       f"--bound-object-uid={uid}"))


def apply_manifests(cp: ControlPlane, names: tuple[str, ...]) -> None:
    """Apply these files of deploy/manifests (RBAC, admission policies), in this order."""
    for name in names:
        cp.kubectl("apply", "-f", str(MANIFESTS / name))


def apply_compat(cp: ControlPlane) -> None:
    """``kubectl apply -k deploy/compat``: the compatibility mode's rights, for tests whose
    agents serve shared devices through device plugins with their own token."""
    cp.kubectl("apply", "-k", str(COMPAT))


def agent_on(cp: ControlPlane, node: str, folder: Path) -> Identity:
    """The agent's token as its DaemonSet pod on ``node`` gets it (the node policies read it);
    ``release_agent_pod`` when done."""
    return pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=AGENT_ACCOUNT, node=node,
                     folder=folder)


def kubelet_certificate(cp: ControlPlane, node: str, folder: Path) -> Path:
    """Node ``node``'s kubelet client certificate (``system:node:<node>`` in ``system:nodes``,
    signed by the cluster CA) and its key in one PEM file, as a rotating kubelet keeps
    ``kubelet-client-current.pem``."""
    creds = node_credentials(cp.ca_cert, cp.ca_cert.parent / "ca.key", node, folder / node)
    pem = folder / f"kubelet-client-{node}.pem"
    pem.write_bytes(creds.client_cert.read_bytes() + creds.client_key.read_bytes())
    pem.chmod(0o600)
    return pem


def kubelet_kubeconfig(cp: ControlPlane, node: str, folder: Path) -> Path:
    """A kubeconfig holding node ``node``'s kubelet client certificate (``kubelet_certificate``)."""
    pem = kubelet_certificate(cp, node, folder)
    path = folder / f"kubelet-{node}.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": cp.server, "certificate-authority": str(cp.ca_cert)}}],
        "users": [{"name": "kubelet", "user": {"client-certificate": str(pem),
                                               "client-key": str(pem)}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "local", "user": "kubelet"}}],
        "current-context": "kubelet"}))
    return path


def release_agent_pod(cp: ControlPlane, node: str) -> None:
    """Delete the stand-in for the agent's DaemonSet pod on ``node`` that its token is bound to."""
    cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
               f"{AGENT_ACCOUNT}-{node}", check=False)
