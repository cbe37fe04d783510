"""A stolen controller token, tried as an attacker would: each attempt refused by the API server.

The controller's ServiceAccount token lives in one Deployment, and whoever steals it holds
whatever the controller holds. Here deploy/manifests (RBAC, the controller's admission policies,
the Configuration policies) are applied to the real API server, a token is minted for the
controller's own ServiceAccount, and with nothing but that token these attacks are tried: read
Secrets, hand its rights to another account, grant the agent more than named Secrets or a
kube-system Secret, widen its webhook, change its own RBAC, mint tokens through a Secret,
re-image a Configuration's brokers, run privileged, host-path or other-account pods, and (as a
user who may write Configurations in one namespace) ask the controller for a privileged broker
or another namespace's Secret. Each is refused by the API server, with the policy's message
where a policy refuses it. Beside each, the write the controller really makes (its own code, on
the same token) still succeeds: the agent's named-Secret Role, its webhook's TLS Secret and
caBundle, a Configuration's finalizers, a broker pod, Job and Service. deploy/README.md, "What
the controller can do", says the same.

The Configuration policies bind to every namespace in a cluster; on this control plane, shared
by the whole test session, their bindings are copies scoped to namespaces this module labels
(the policies themselves are the shipped ones), so other tests' Configurations meet none of it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import functools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod, Secret, Service
from lightkube.resources.rbac_authorization_v1 import (
    ClusterRole,
    ClusterRoleBinding,
    Role,
    RoleBinding,
)
from lightkube.types import PatchType

from controller.brokers.eventbatch import event_object
from controller.dra.instance_classes import DeviceClassResource
from controller.grants.agent_access import ROLE_NAME, AgentAccess
from controller.kube.client import Kube
from controller.kube.rest import Rest
from controller.main import REPORTING_COMPONENT
from controller.settings import WebhookSettings
from controller.webhook.certs import plan
from controller.webhook.server import CertificateKeeper
from crds import dra
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration, eventually, new_node
from tests.harness.aio_process import task_running
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import (
    Identity,
    apply_manifests,
    kubelet_kubeconfig,
    mint,
)

pytestmark = pytest.mark.timeout(300)

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
EXAMPLES = REPO_ROOT / "crds" / "examples"
SYSTEM_NAMESPACE = "edgeplug-system"
AGENT_ACCOUNT = "edgeplug-agent"
CONTROLLER_ACCOUNT = "edgeplug-controller"
FILES = ("namespace.yaml", "agent-rbac.yaml", "controller-rbac.yaml",
         "controller-node-policy.yaml", "controller-policy.yaml")
WEBHOOK_CONFIGURATION = "edgeplug-configurations"
TLS_SECRET = "edgeplug-controller-webhook-tls"
#: The label that puts a test namespace under this module's copies of the Configuration
#: policies' bindings.
SCOPE_LABEL = "edgeplug.test/configuration-policy"
#: Generous: the machine is shared; no deadline here is a pass/fail timing.
WAIT_S = 60.0
POLL_S = 0.2

ConfigurationResource = create_namespaced_resource(
    "edgeplug.io", "v1alpha1", "Configuration", "configurations")


# -- setup -----------------------------------------------------------------------------------


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


@pytest.fixture(scope="module")
def scope() -> str:
    """The value of SCOPE_LABEL this module's namespaces carry."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, scope: str) -> Iterator[ControlPlane]:
    """The manifests as a user applies them; the Configuration policies with bindings scoped to
    this module's namespaces."""
    cp = control_plane
    apply_manifests(cp, FILES)
    bindings = []
    for doc in _docs("configuration-policy.yaml"):
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc = copy.deepcopy(doc)
            doc["metadata"]["name"] += f"-{scope}"
            doc["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {SCOPE_LABEL: scope}}}
            bindings.append(doc["metadata"]["name"])
        cp.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
    yield cp
    for name in bindings:
        cp.kubectl("delete", "validatingadmissionpolicybinding", name, check=False)


@pytest.fixture(scope="module")
def controller_identity(installed: ControlPlane,
                        tmp_path_factory: pytest.TempPathFactory) -> Identity:
    return mint(installed, namespace=SYSTEM_NAMESPACE, account=CONTROLLER_ACCOUNT,
                path=tmp_path_factory.mktemp("ctl") / "controller")


@pytest.fixture(scope="module")
def node_identity(installed: ControlPlane,
                  tmp_path_factory: pytest.TempPathFactory) -> Identity:
    """A node's own account (agent/kube/node_account.py), as which its agent reads Secrets."""
    namespace = f"{SYSTEM_NAMESPACE}-nodes"
    installed.kubectl("create", "serviceaccount", "node-attacks", "-n", namespace, check=False)
    return mint(installed, namespace=namespace, account="node-attacks",
                path=tmp_path_factory.mktemp("node") / "node")


@pytest.fixture
def ctl(controller_identity: Identity) -> Iterator[Client]:
    """A client holding nothing but the controller's token."""
    client = Client(KubeConfig.from_file(str(controller_identity.kubeconfig)),
                    field_manager="attacker")
    yield client
    client.close()


@pytest.fixture
def tenant_namespace(installed: ControlPlane, namespace: str, scope: str) -> str:
    """The test's namespace under the Configuration policies."""
    installed.kubectl("label", "namespace", namespace, f"{SCOPE_LABEL}={scope}")
    return namespace


# -- helpers ---------------------------------------------------------------------------------


def _message(error: ApiError) -> str:
    return str(error.status.message or error)


def refused(attempt: Callable[[bool], object], *, because: str) -> str:
    """``attempt(dry_run)`` is refused, with ``because`` in the message. A policy takes effect
    shortly after it is written: dry runs (which admission judges like real writes) are
    retried until one is refused; then the real write is refused too."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            attempt(True)
        except ApiError as error:
            message = _message(error)
            break
        assert time.monotonic() < deadline, f"still admitted after {WAIT_S:.0f}s ({because})"
        time.sleep(POLL_S)
    assert because in message, message
    with pytest.raises(ApiError) as caught:
        attempt(False)
    assert because in _message(caught.value), _message(caught.value)
    return message


def forbidden_by_rbac(attempt: Callable[[], object]) -> None:
    """RBAC refuses at once (no policy involved): 403, before any admission."""
    with pytest.raises(ApiError) as caught:
        attempt()
    assert caught.value.status.code == 403, _message(caught.value)
    assert "cannot" in _message(caught.value), _message(caught.value)


def watch_forbidden(client: Client, kind: type[Secret] | type[ConfigMap]) -> None:
    """A cluster-wide watch is refused (lightkube raises the HTTP error of a watch as is)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - httpx's error or lightkube's
        next(iter(client.watch(kind, namespace="*")))
    error = caught.value
    code = (error.status.code if isinstance(error, ApiError)
            else getattr(getattr(error, "response", None), "status_code", None))
    assert code == 403, repr(error)


def admitted_eventually(attempt: Callable[[], object], *, what: str) -> None:
    """``attempt()`` is admitted once a namespace change (label, annotation) has reached the
    policies' view of the namespace; dry runs only."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            attempt()
            return
        except ApiError as error:
            last = _message(error)
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still refused: {last}")
        time.sleep(POLL_S)


def _secret(name: str, namespace: str, **values: str) -> Secret:
    return cast(Secret, Secret.from_dict({
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}))


def _role(namespace: str, rules: list[dict[str, Any]], name: str = ROLE_NAME) -> Role:
    return cast(Role, Role.from_dict({"metadata": {"name": name, "namespace": namespace},
                                      "rules": rules}))


def _binding(namespace: str, role_ref: dict[str, str], subjects: list[dict[str, str]],
             name: str = ROLE_NAME) -> RoleBinding:
    return cast(RoleBinding, RoleBinding.from_dict({
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **role_ref},
        "subjects": subjects}))


def _create(client: Client, obj: Any, dry: bool) -> object:
    return client.create(obj, dry_run=dry)


def _apply(client: Client, obj: Any, dry: bool) -> object:
    return client.apply(obj, force=True, dry_run=dry)


def _create_configuration(client: Client, cfg: dict[str, Any], namespace: str,
                          dry: bool) -> object:
    return client.create(ConfigurationResource.from_dict(cfg), namespace=namespace, dry_run=dry)


def _agent_subject() -> list[dict[str, str]]:
    return [{"kind": "ServiceAccount", "name": AGENT_ACCOUNT, "namespace": SYSTEM_NAMESPACE}]


def _node_subjects() -> list[dict[str, str]]:
    """What controller/grants/agent_access.py binds a namespace's named reads to: nodes'
    accounts."""
    return [{"kind": "ServiceAccount", "name": "node-a", "namespace": f"{SYSTEM_NAMESPACE}-nodes"}]


def _broker_configuration(name: str, pod_spec: dict[str, Any],
                          **spec: Any) -> dict[str, Any]:
    cfg = debug_echo_configuration(name, descriptions=["cam0"])
    cfg["spec"]["brokerSpec"] = {"brokerPodSpec": pod_spec}
    cfg["spec"].update(spec)
    return cfg


def _container(**extra: Any) -> dict[str, Any]:
    return {"name": "broker", "image": "registry.invalid/broker:1",
            "resources": {"limits": {"{{PLACEHOLDER}}": "1"}}, **extra}


# -- Secrets ---------------------------------------------------------------------------------


def test_controller_token_reads_no_secret_and_no_configmap(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    cp = installed
    cp.kubectl("create", "secret", "generic", "db-password", "-n", namespace,
               "--from-literal=password=hunter2")
    forbidden_by_rbac(lambda: list(ctl.list(Secret, namespace="*")))
    forbidden_by_rbac(lambda: list(ctl.list(Secret, namespace=namespace)))
    watch_forbidden(ctl, Secret)
    forbidden_by_rbac(lambda: list(ctl.list(ConfigMap, namespace="*")))
    forbidden_by_rbac(lambda: list(ctl.list(ConfigMap, namespace=namespace)))
    watch_forbidden(ctl, ConfigMap)
    forbidden_by_rbac(lambda: ctl.get(Secret, "db-password", namespace=namespace))
    forbidden_by_rbac(lambda: ctl.get(Secret, "db-password", namespace="kube-system"))
    # Not even by the name the agent's Role carries, nor through the one Secret it keeps.
    forbidden_by_rbac(lambda: list(ctl.list(Secret, namespace=namespace,
                                            fields={"metadata.name": "db-password"})))
    forbidden_by_rbac(lambda: list(ctl.list(Secret, namespace=SYSTEM_NAMESPACE)))


def test_controller_cannot_mint_tokens_through_a_secret(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    """Secret create cannot be limited by name: a token Secret would be filled in with the
    agent's token. The policy lets the controller write its TLS Secret and nothing else."""
    for name in ("stolen-agent-token", TLS_SECRET):
        token = cast(Secret, Secret.from_dict({
            "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE,
                         "annotations": {"kubernetes.io/service-account.name": AGENT_ACCOUNT}},
            "type": "kubernetes.io/service-account-token"}))
        refused(functools.partial(_create, ctl, token),
                because="may write only its webhook's TLS Secret")
    forbidden_by_rbac(lambda: ctl.create(_secret("x", namespace, a="b")))


@pytest.fixture
def webhook(installed: ControlPlane) -> Iterator[str]:
    """The shipped ValidatingWebhookConfiguration, called for no namespace (this control plane
    is shared and no webhook server runs for it)."""
    config = next(d for d in _docs("controller-webhook.yaml")
                  if d["kind"] == "ValidatingWebhookConfiguration")
    config["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"edgeplug.test/never": "x"}}
    installed.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    yield WEBHOOK_CONFIGURATION
    installed.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION,
                      check=False)


async def test_controller_still_keeps_its_webhooks_tls_secret_and_ca_bundle(
    installed: ControlPlane, controller_identity: Identity, webhook: str
) -> None:
    """The control: webhook.py's own writes, on the controller's token, under the policies."""
    cp = installed
    client = AsyncClient(KubeConfig.from_file(str(controller_identity.kubeconfig)))
    keeper = CertificateKeeper(WebhookSettings(enabled=True, namespace=SYSTEM_NAMESPACE), client)
    try:
        async def current() -> bool:
            state = await keeper.ensure_secret()
            return await keeper.ensure_ca_bundle(state)

        await eventually(current, what="the TLS Secret and caBundle written", deadline=WAIT_S)
        stored = cp.get_json("/apis/admissionregistration.k8s.io/v1/"
                             f"validatingwebhookconfigurations/{webhook}")
        assert stored is not None
        assert cast(list[dict[str, Any]], stored["webhooks"])[0]["clientConfig"]["caBundle"]
        # A renewal (a new CA beside the old one) is a caBundle change too: still allowed.
        now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=500)
        renewed = plan(await keeper.ensure_secret(), keeper.names, now)
        assert await keeper.ensure_ca_bundle(renewed)
    finally:
        keeper.close()
        await client.close()
        cp.kubectl("delete", "secret", TLS_SECRET, "-n", SYSTEM_NAMESPACE, check=False)


# -- its webhook and its own RBAC ------------------------------------------------------------


def _widened(change: Callable[[dict[str, Any]], None]) -> Callable[[Client], Any]:
    def make(ctl: Client) -> Any:
        found = ctl.get(ValidatingWebhookConfiguration, WEBHOOK_CONFIGURATION).to_dict()
        change(found)
        return ValidatingWebhookConfiguration.from_dict(found)
    return make


WIDENINGS: dict[str, Callable[[dict[str, Any]], None]] = {
    "every namespace": lambda c: c["webhooks"][0].update(namespaceSelector={}),
    "Secrets and pods too": lambda c: c["webhooks"][0]["rules"].append(
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["secrets", "pods"], "scope": "*"}),
    "calls elsewhere": lambda c: c["webhooks"][0].update(
        clientConfig={"url": "https://attacker.example/validate",
                      "caBundle": c["webhooks"][0]["clientConfig"].get("caBundle", "")}),
    "fail closed": lambda c: c["webhooks"][0].update(failurePolicy="Fail"),
    "no match conditions": lambda c: c["webhooks"][0].pop("matchConditions"),
    "a second webhook": lambda c: c["webhooks"].append(
        {**copy.deepcopy(c["webhooks"][0]), "name": "more.edgeplug.io"}),
    "its labels": lambda c: c["metadata"].setdefault("labels", {}).update(x="y"),
}


@pytest.mark.parametrize("widening", sorted(WIDENINGS))
def test_controller_cannot_widen_its_webhook(ctl: Client, webhook: str, widening: str) -> None:
    make = _widened(WIDENINGS[widening])
    refused(lambda dry: ctl.replace(make(ctl), dry_run=dry),
            because="may change only the caBundle of its webhook configuration")


def test_controller_cannot_delete_or_add_webhooks(ctl: Client, webhook: str) -> None:
    forbidden_by_rbac(lambda: ctl.delete(ValidatingWebhookConfiguration, webhook))
    other = ctl.get(ValidatingWebhookConfiguration, webhook).to_dict()
    other["metadata"] = {"name": "edgeplug-more"}
    forbidden_by_rbac(lambda: ctl.create(cast(
        ValidatingWebhookConfiguration, ValidatingWebhookConfiguration.from_dict(other))))
    forbidden_by_rbac(lambda: ctl.create(cast(
        MutatingWebhookConfiguration, MutatingWebhookConfiguration.from_dict(
            {"metadata": {"name": "edgeplug-mutate"}, "webhooks": []}))))


def test_controller_cannot_change_its_own_rbac(installed: ControlPlane, ctl: Client) -> None:
    more = {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]}
    forbidden_by_rbac(lambda: ctl.patch(ClusterRole, "edgeplug-controller", more,
                                        patch_type=PatchType.MERGE))
    forbidden_by_rbac(lambda: ctl.patch(
        ClusterRoleBinding, "edgeplug-controller",
        {"subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]},
        patch_type=PatchType.MERGE))
    forbidden_by_rbac(lambda: ctl.create(cast(ClusterRoleBinding, ClusterRoleBinding.from_dict({
        "metadata": {"name": "edgeplug-controller-more"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT,
                      "namespace": SYSTEM_NAMESPACE}]}))))
    forbidden_by_rbac(lambda: ctl.patch(Role, "edgeplug-controller-webhook", more,
                                        namespace=SYSTEM_NAMESPACE, patch_type=PatchType.MERGE))
    forbidden_by_rbac(lambda: ctl.delete(RoleBinding, "edgeplug-controller-webhook",
                                         namespace=SYSTEM_NAMESPACE))
    # Its one Role name, in its own namespace, to read the TLS Secret's neighbours.
    refused(lambda dry: ctl.apply(_role(SYSTEM_NAMESPACE, [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
         "resourceNames": [TLS_SECRET]}]), force=True, dry_run=dry),
        because="may grant no reads in kube-system, kube-public, kube-node-lease or its own")


# -- the agent's Roles -----------------------------------------------------------------------


def test_controller_cannot_hand_its_rights_to_another_account(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    own_rights = {"kind": "ClusterRole", "name": "edgeplug-controller"}
    anyone = [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]
    # A binding of another name: RBAC refuses the create outright.
    forbidden_by_rbac(lambda: ctl.create(_binding(namespace, own_rights, anyone,
                                                  name="steal")))
    forbidden_by_rbac(lambda: ctl.apply(_binding(namespace, own_rights, anyone, name="steal"),
                                        force=True))
    # Its one name: RBAC lets it bind a role whose rights it holds; the policy does not.
    refused(lambda dry: ctl.apply(_binding(namespace, own_rights, anyone), force=True,
                                  dry_run=dry),
            because="may bind only its Role of the same name")
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": ROLE_NAME},
        [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT, "namespace": SYSTEM_NAMESPACE}]),
        force=True, dry_run=dry), because="may bind only nodes' own accounts")
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": ROLE_NAME},
        [*_node_subjects(), {"kind": "User", "name": "mallory"}]),
        force=True, dry_run=dry), because="may bind only nodes' own accounts")
    # Every agent's account: the named reads go to each node's own (agent/kube/node_account.py).
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": ROLE_NAME}, _agent_subject()),
        force=True, dry_run=dry), because="may bind only nodes' own accounts")
    # A group wider than the nodes' accounts (the controller's own namespace's, say).
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": ROLE_NAME},
        [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
          "name": f"system:serviceaccounts:{SYSTEM_NAMESPACE}"}]),
        force=True, dry_run=dry), because="may bind only nodes' own accounts")


ROLE_WIDENINGS: dict[str, list[dict[str, Any]]] = {
    "everything": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    "every Secret": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    "a list": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"],
                "resourceNames": ["cam-login"]}],
    "pods": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"],
              "resourceNames": ["x"]}],
    "an update": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["update"],
                   "resourceNames": ["cam-login"]}],
}


@pytest.mark.parametrize("widening", sorted(ROLE_WIDENINGS))
def test_controller_cannot_grant_more_than_named_reads(
    installed: ControlPlane, ctl: Client, namespace: str, widening: str
) -> None:
    refused(lambda dry: ctl.apply(_role(namespace, ROLE_WIDENINGS[widening]), force=True,
                                  dry_run=dry),
            because="may grant only get and watch on Secrets and ConfigMaps named")


OFFER_WIDENINGS: dict[str, list[dict[str, Any]]] = {
    "named Secrets": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                       "resourceNames": ["cam-login"]}],
    "every offer": [{"apiGroups": ["edgeplug.io"], "resources": ["nodeoffers"],
                     "verbs": ["offer"]}],
    "another verb": [{"apiGroups": ["edgeplug.io"], "resources": ["nodeoffers"],
                      "verbs": ["offer", "get"], "resourceNames": ["cam/*"]}],
    "Instances": [{"apiGroups": ["edgeplug.io"], "resources": ["instances"],
                   "verbs": ["offer"], "resourceNames": ["cam/*"]}],
}


@pytest.mark.parametrize("widening", sorted(OFFER_WIDENINGS))
def test_controllers_offer_role_grants_nothing_but_named_offers(
    installed: ControlPlane, ctl: Client, namespace: str, widening: str
) -> None:
    """The Role controller/grants/offer_grants.py keeps names which nodes may offer which
    Configuration's devices; written with RBAC's escalate, it may say nothing else, in any
    namespace, and bind nobody but the agent."""
    offers = "edgeplug-agent-offers"
    refused(lambda dry: ctl.apply(_role(namespace, OFFER_WIDENINGS[widening], name=offers),
                                  force=True, dry_run=dry),
            because="may grant only the verb offer on nodeoffers.edgeplug.io named")
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": offers},
        [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT, "namespace": SYSTEM_NAMESPACE}],
        name=offers), force=True, dry_run=dry),
        because="may bind only the agent's ServiceAccount")
    refused(lambda dry: ctl.apply(_binding(
        namespace, {"kind": "Role", "name": ROLE_NAME}, _agent_subject(), name=offers),
        force=True, dry_run=dry), because="may bind only its Role of the same name")
    # Control: what offer_grants.py writes.
    allowed = [{"apiGroups": ["edgeplug.io"], "resources": ["nodeoffers"], "verbs": ["offer"],
                "resourceNames": ["cam/*", "cam2/node-a"]}]
    ctl.apply(_role(namespace, allowed, name=offers), force=True, dry_run=True)


def test_controller_writes_no_role_of_another_name(ctl: Client, namespace: str) -> None:
    named = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
              "resourceNames": ["cam-login"]}]
    forbidden_by_rbac(lambda: ctl.create(_role(namespace, named, name="other")))
    forbidden_by_rbac(lambda: ctl.apply(_role(namespace, named, name="other"), force=True))
    forbidden_by_rbac(lambda: ctl.delete(Role, "other", namespace=namespace))
    forbidden_by_rbac(lambda: list(ctl.list(Role, namespace="*")))


def test_controller_grants_no_kube_system_secret(
    installed: ControlPlane, ctl: Client
) -> None:
    named = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "watch"],
              "resourceNames": ["bootstrap-token-abcdef"]}]
    for system in ("kube-system", "kube-public", "kube-node-lease"):
        refused(functools.partial(_apply, ctl, _role(system, named)),
                because="may grant no reads in kube-system")
        refused(functools.partial(_apply, ctl, _binding(
            system, {"kind": "Role", "name": ROLE_NAME}, _node_subjects())),
            because="may grant no reads in kube-system")


async def test_agent_access_on_the_controllers_token_grants_exactly_the_named_secret(
    installed: ControlPlane, controller_identity: Identity, node_identity: Identity,
    namespace: str, tmp_path: Path,
) -> None:
    """The control, and the attack through the controller: controller/grants/agent_access.py on the
    controller's own token writes the agent's Role and RoleBinding (escalate and bind by name)
    for the Secret a Configuration names, and for the kube-system Secret another Configuration
    names (one admitted where no reference policy is bound, and one in kube-system itself)
    grants nothing."""
    cp = installed
    cp.kubectl("create", "secret", "generic", "cam-login", "-n", namespace,
               "--from-literal=password=s3cret")
    planted = f"planted-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "secret", "generic", planted, "-n", "kube-system",
               "--from-literal=token=admin")
    cfg = debug_echo_configuration("cams", descriptions=[], discovery_properties=[
        {"name": "password",
         "valueFrom": {"secretKeyRef": {"name": "cam-login", "key": "password"}}},
        {"name": "stolen", "valueFrom": {"secretKeyRef": {
            "name": planted, "key": "token", "namespace": "kube-system"}}}])
    inside = debug_echo_configuration(f"in-{planted}", descriptions=[], discovery_properties=[
        {"name": "stolen", "valueFrom": {"secretKeyRef": {"name": planted, "key": "token"}}}])
    cp.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cfg))
    cp.kubectl("apply", "-n", "kube-system", "-f", "-", stdin=json.dumps(inside))
    client = AsyncClient(KubeConfig.from_file(str(controller_identity.kubeconfig)))
    try:
        access = AgentAccess(client, account=(SYSTEM_NAMESPACE, AGENT_ACCOUNT))
        async with task_running(access.run(), name="agent-access") as task:
            async def granted() -> bool:
                assert not task.done(), "agent access stopped"
                return node_identity.kubectl(
                    cp, "get", "secret", "cam-login", "-n", namespace).returncode == 0

            await eventually(granted, what="the agent's read of the named Secret",
                             deadline=WAIT_S)
            stolen = node_identity.kubectl(cp, "get", "secret", planted, "-n", "kube-system")
            assert stolen.returncode != 0, "the agent reads a kube-system Secret"
            assert "forbidden" in stolen.stderr.lower(), stolen.stderr
            assert cp.kubectl("get", "role", ROLE_NAME, "-n", "kube-system",
                              check=False).returncode != 0, "a Role in kube-system"
            role = cp.get_json(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/"
                               f"roles/{ROLE_NAME}")
            assert role is not None
            rules = cast(list[dict[str, Any]], role["rules"])
            assert [r["resourceNames"] for r in rules] == [["cam-login"]]
            unnamed = node_identity.kubectl(cp, "get", "secrets", "-n", namespace)
            assert unnamed.returncode != 0, "the agent lists the namespace's Secrets"
            # The Configuration goes: the controller deletes both (by name).
            cp.kubectl("delete", "configuration", "cams", "-n", namespace)

            async def revoked() -> bool:
                assert not task.done(), "agent access stopped"
                return node_identity.kubectl(
                    cp, "get", "secret", "cam-login", "-n", namespace).returncode != 0

            await eventually(revoked, what="the read revoked", deadline=WAIT_S)
    finally:
        await client.close()
        cp.kubectl("delete", "configuration", f"in-{planted}", "-n", "kube-system",
                   check=False)
        cp.kubectl("delete", "secret", planted, "-n", "kube-system", check=False)


# -- Configurations: what a user may ask of the controller -----------------------------------


def _user_with_configurations_only(cp: ControlPlane, namespace: str, folder: Path) -> Identity:
    """A ServiceAccount that may write Configurations in ``namespace`` and nothing else."""
    cp.kubectl("create", "serviceaccount", "tenant", "-n", namespace)
    cp.kubectl("create", "role", "configurations", "-n", namespace,
               "--verb=get,list,create,update,patch", "--resource=configurations.edgeplug.io")
    cp.kubectl("create", "rolebinding", "configurations", "-n", namespace,
               "--role=configurations", f"--serviceaccount={namespace}:tenant")
    return mint(cp, namespace=namespace, account="tenant", path=folder / "tenant")


def test_a_tenant_cannot_make_the_agents_read_a_kube_system_secret(
    installed: ControlPlane, tenant_namespace: str, tmp_path: Path
) -> None:
    cp, namespace = installed, tenant_namespace
    tenant = Client(KubeConfig.from_file(str(
        _user_with_configurations_only(cp, namespace, tmp_path).kubeconfig)))
    try:
        for ref in ("secretKeyRef", "configMapKeyRef"):
            cfg = debug_echo_configuration(f"steal-{ref.lower()}", descriptions=[],
                                           discovery_properties=[{"name": "token", "valueFrom": {
                                               ref: {"name": "x", "key": "token",
                                                     "namespace": "kube-system"}}}])
            refused(functools.partial(_create_configuration, tenant, cfg, namespace),
                    because="only in the Configuration's own namespace")
        # Its own namespace, named or not, is fine.
        own = debug_echo_configuration("own", descriptions=[], discovery_properties=[
            {"name": "a", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}},
            {"name": "b", "valueFrom": {"secretKeyRef": {
                "name": "x", "key": "k", "namespace": namespace}}}])
        _create_configuration(tenant, own, namespace, False)
    finally:
        tenant.close()


POD_ATTACKS: dict[str, tuple[dict[str, Any], str]] = {
    "privileged": ({"containers": [_container(securityContext={"privileged": True})]},
                   "no privileged containers"),
    "privileged init container": ({"containers": [_container()], "initContainers": [
        {"name": "init", "image": "registry.invalid/x:1",
         "securityContext": {"privileged": True}}]}, "no privileged containers"),
    "host root": ({"containers": [_container(volumeMounts=[{"name": "root",
                                                            "mountPath": "/host"}])],
                   "volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                  "no hostPath volumes"),
    "host network": ({"hostNetwork": True, "containers": [_container()]},
                     "no hostNetwork, hostPID or hostIPC"),
    "host PID": ({"hostPID": True, "containers": [_container()]},
                 "no hostNetwork, hostPID or hostIPC"),
    "host port": ({"containers": [_container(ports=[{"containerPort": 80, "hostPort": 80}])]},
                  "no hostPort"),
    "SYS_ADMIN": ({"containers": [_container(securityContext={
        "capabilities": {"add": ["SYS_ADMIN"]}})]}, "no added capabilities"),
    "another account": ({"serviceAccountName": "deployer", "containers": [_container()]},
                        "run as the namespace's default ServiceAccount"),
    "unconfined seccomp": ({"securityContext": {"seccompProfile": {"type": "Unconfined"}},
                            "containers": [_container()]}, "no Unconfined seccomp"),
    "unsafe sysctl": ({"securityContext": {"sysctls": [{"name": "kernel.msgmax",
                                                        "value": "1"}]},
                       "containers": [_container()]}, "only Pod Security's safe sysctls"),
    "SELinux spc_t": ({"containers": [_container(securityContext={
        "seLinuxOptions": {"type": "spc_t"}})]}, "SELinux type only"),
    # What a broker never needs.
    "another workload's claim": ({"resourceClaims": [{"name": "gpu",
                                                      "resourceClaimName": "their-gpu"}],
                                  "containers": [_container()]},
                                 "never another workload's ResourceClaim"),
    "token Secret volume": ({"containers": [_container(volumeMounts=[
        {"name": "t", "mountPath": "/t"}])], "volumes": [
        {"name": "t", "secret": {"secretName": "admin-token"}}]}, "no Secret"),
    "token Secret projected": ({"containers": [_container()], "volumes": [
        {"name": "t", "projected": {"sources": [{"secret": {"name": "admin-token"}}]}}]},
        "no Secret"),
    "token Secret env": ({"containers": [_container(env=[{"name": "T", "valueFrom": {
        "secretKeyRef": {"name": "admin-token", "key": "token"}}}])]}, "no Secret"),
    "token Secret envFrom": ({"containers": [_container(envFrom=[
        {"secretRef": {"name": "admin-token"}}])]}, "no Secret"),
}


@pytest.mark.parametrize("attack", sorted(POD_ATTACKS))
def test_a_broker_beyond_the_namespaces_policy_is_refused_at_apply(
    installed: ControlPlane, tenant_namespace: str, attack: str
) -> None:
    """As kubectl shows it: refused at apply, the message naming the rule and the opt-in."""
    cp, namespace = installed, tenant_namespace
    pod_spec, because = POD_ATTACKS[attack]
    cfg = _broker_configuration("broker", pod_spec)
    job = debug_echo_configuration("job-broker", descriptions=["cam0"])
    job["spec"]["brokerSpec"] = {"brokerJobSpec": {"template": {"spec": {
        **pod_spec, "restartPolicy": "Never"}}}}
    admin = Client(KubeConfig.from_file(str(cp.kubeconfig)))
    try:
        for obj in (cfg, job):
            refused(functools.partial(_create_configuration, admin, obj, namespace),
                    because=because)
    finally:
        admin.close()
    shown = cp.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cfg), check=False)
    assert shown.returncode != 0
    assert "edgeplug-broker-pod-policy" in shown.stderr, shown.stderr
    assert because in shown.stderr, shown.stderr


def test_a_service_with_external_ips_is_refused_at_apply(
    installed: ControlPlane, tenant_namespace: str
) -> None:
    cfg = _broker_configuration("svc", {"containers": [_container()]}, instanceServiceSpec={
        "type": "ClusterIP", "externalIPs": ["10.0.0.1"], "ports": [{"port": 80}]})
    admin = Client(KubeConfig.from_file(str(installed.kubeconfig)))
    try:
        refused(functools.partial(_create_configuration, admin, cfg, tenant_namespace),
                because="no Service externalIPs")
    finally:
        admin.close()


def test_a_cluster_admin_widens_the_broker_policy_per_namespace(
    installed: ControlPlane, tenant_namespace: str
) -> None:
    cp, namespace = installed, tenant_namespace
    admin = Client(KubeConfig.from_file(str(cp.kubeconfig)))

    def create(cfg: dict[str, Any], dry: bool = True) -> object:
        return _create_configuration(admin, cfg, namespace, dry)

    usb = _broker_configuration("usb", {"containers": [_container(volumeMounts=[
        {"name": "usb", "mountPath": "/dev/bus/usb/001"}])], "volumes": [
        {"name": "usb", "hostPath": {"path": "/dev/bus/usb/001"}}]})
    beside = copy.deepcopy(usb)
    beside["spec"]["brokerSpec"]["brokerPodSpec"]["volumes"][0]["hostPath"]["path"] = (
        "/dev/bus/usbx")
    climbing = copy.deepcopy(usb)
    climbing["spec"]["brokerSpec"]["brokerPodSpec"]["volumes"][0]["hostPath"]["path"] = (
        "/dev/bus/usb/../../../etc")
    account = _broker_configuration("account", {"serviceAccountName": "camera-broker",
                                                "containers": [_container()]})
    net_admin = _broker_configuration("net-admin", {"containers": [_container(
        securityContext={"capabilities": {"add": ["NET_ADMIN"]}})]})
    privileged = _broker_configuration("privileged", POD_ATTACKS["privileged"][0])

    def secret_volume(name: str) -> dict[str, Any]:
        return _broker_configuration(f"secret-{name}", {"containers": [_container()],
                                                        "volumes": [{"name": "s", "secret": {
                                                            "secretName": name}}]})

    try:
        refused(lambda dry: create(usb, dry), because="no hostPath volumes")
        refused(lambda dry: create(secret_volume("cam-login"), dry), because="no Secret")
        cp.kubectl("annotate", "namespace", namespace,
                   "edgeplug.io/broker-host-paths=/dev/bus/usb, /dev/serial/by-id",
                   "edgeplug.io/broker-service-accounts=camera-broker",
                   "edgeplug.io/broker-capabilities=NET_ADMIN",
                   "edgeplug.io/broker-secrets=cam-login")
        admitted_eventually(lambda: create(usb), what="a host path under an allowed one")
        admitted_eventually(lambda: create(secret_volume("cam-login")),
                            what="a Secret the namespace names")
        refused(functools.partial(create, secret_volume("admin-token")), because="no Secret")
        admitted_eventually(lambda: create(account), what="an allowed ServiceAccount")
        admitted_eventually(lambda: create(net_admin), what="an allowed capability")
        for wrong in (beside, climbing):
            refused(functools.partial(create, wrong), because="no hostPath volumes")
        refused(lambda dry: create(privileged, dry), because="no privileged containers")
        cp.kubectl("label", "namespace", namespace, "edgeplug.io/broker-pod-security=privileged")
        admitted_eventually(lambda: create(privileged), what="privileged, once opted in")
    finally:
        admin.close()


def test_every_example_configuration_passes_the_default_policy(
    installed: ControlPlane, tenant_namespace: str
) -> None:
    """Device brokers get their device through the device plugin (or CDI, or a DRA claim),
    not privilege: every shipped example is admitted as it is."""
    cp = installed
    probe = _broker_configuration("probe", POD_ATTACKS["privileged"][0])
    admin = Client(KubeConfig.from_file(str(cp.kubeconfig)))
    try:  # the policy is active in this namespace
        refused(functools.partial(_create_configuration, admin, probe, tenant_namespace),
                because="no privileged containers")
    finally:
        admin.close()
    paths = sorted(EXAMPLES.rglob("*.yaml"))
    configurations = [p for p in paths
                      if any(d and d.get("kind") == "Configuration"
                             for d in yaml.safe_load_all(p.read_text()))]
    assert len(configurations) >= 8, configurations
    for path in configurations:
        done = cp.kubectl("apply", "--dry-run=server", "-n", tenant_namespace, "-f", str(path),
                          check=False)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


# -- what the controller makes ---------------------------------------------------------------


def _pod(namespace: str, name: str, **spec: Any) -> Pod:
    return cast(Pod, Pod.from_dict({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "broker", "image": "registry.invalid/broker:1"}],
                 **spec}}))


CONTROLLER_POD_ATTACKS: dict[str, tuple[dict[str, Any], str]] = {
    "privileged": ({"containers": [{"name": "b", "image": "registry.invalid/b:1",
                                    "securityContext": {"privileged": True}}]},
                   "no privileged containers"),
    "host root": ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                  "no hostPath volumes"),
    "host network": ({"hostNetwork": True}, "no hostNetwork, hostPID or hostIPC"),
    "another account": ({"serviceAccountName": "deployer"},
                        "run as the namespace's default ServiceAccount"),
    "another workload's claim": ({"resourceClaims": [{"name": "gpu",
                                                      "resourceClaimName": "their-gpu"}]},
                                 "never another workload's ResourceClaim"),
    "token Secret volume": ({"volumes": [{"name": "t",
                                          "secret": {"secretName": "admin-token"}}]},
                            "no Secret"),
}


@pytest.mark.parametrize("attack", sorted(CONTROLLER_POD_ATTACKS))
def test_controller_token_makes_no_pod_beyond_the_broker_policy(
    installed: ControlPlane, ctl: Client, namespace: str, attack: str
) -> None:
    """Even a Configuration admitted before the policy existed (or a forged write) gets no such
    pod or Job: the controller's own writes meet the same rules."""
    installed.kubectl("create", "serviceaccount", "deployer", "-n", namespace)
    spec, because = CONTROLLER_POD_ATTACKS[attack]
    refused(functools.partial(_create, ctl, _pod(namespace, "evil", **spec)), because=because)
    template = _pod(namespace, "x", restartPolicy="Never", **spec).to_dict()["spec"]
    job = cast(Job, Job.from_dict({"metadata": {"name": "evil", "namespace": namespace},
                                   "spec": {"template": {"spec": template}}}))
    refused(functools.partial(_create, ctl, job), because=because)


def test_controller_token_makes_nothing_in_a_system_namespace(
    installed: ControlPlane, ctl: Client
) -> None:
    for system in ("kube-system", SYSTEM_NAMESPACE):
        refused(functools.partial(_create, ctl, _pod(system, "evil")),
                because="may make no pod, Job or Service in kube-system")
        service = cast(Service, Service.from_dict({
            "metadata": {"name": "evil", "namespace": system},
            "spec": {"ports": [{"port": 80}]}}))
        refused(functools.partial(_create, ctl, service),
                because="may make no pod, Job or Service in kube-system")


def test_controller_token_makes_no_service_with_external_ips(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    service = cast(Service, Service.from_dict({
        "metadata": {"name": "evil", "namespace": namespace},
        "spec": {"externalIPs": ["10.0.0.1"], "ports": [{"port": 80}]}}))
    refused(functools.partial(_create, ctl, service), because="no Service externalIPs")


def test_controller_token_cannot_change_a_configurations_spec(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    """Re-imaging a Configuration's brokers: its merge-patch right (kopf's finalizer) keeps the
    spec."""
    cfg = _broker_configuration("cams", {"containers": [_container()]})
    installed.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cfg))
    reimage = {"spec": {"brokerSpec": {"brokerPodSpec": {"containers": [
        _container(image="registry.invalid/evil:1")]}}}}
    refused(lambda dry: ctl.patch(ConfigurationResource, "cams", reimage, namespace=namespace,
                                  patch_type=PatchType.MERGE, dry_run=dry),
            because="may not change a Configuration's spec")


async def test_controller_still_makes_brokers_services_and_finalizers(
    installed: ControlPlane, controller_identity: Identity, namespace: str
) -> None:
    """The control: the writes controller/kube/client.py really makes, on the controller's token."""
    cp = installed
    cfg = _broker_configuration("cams", {"containers": [_container()]})
    cp.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(cfg))
    config = KubeConfig.from_file(str(controller_identity.kubeconfig))
    client = AsyncClient(config)
    single = config.get()
    assert single is not None
    rest = Rest(single, connections=2)
    kube = Kube(client, rest)
    try:
        pod = _pod(namespace, "cams-broker").to_dict()
        service: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "cams-svc", "namespace": namespace},
                   "spec": {"type": "ClusterIP", "selector": {"a": "b"},
                            "ports": [{"name": "grpc", "port": 80}]}}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "cams-job", "namespace": namespace},
               "spec": {"template": {"spec": {**pod["spec"], "restartPolicy": "Never"}}}}
        for obj in ({"apiVersion": "v1", "kind": "Pod", **pod}, service, job):
            assert await kube.create(obj), obj["kind"]
        service["metadata"]["labels"] = {"edgeplug.io/instance": "cams"}
        await kube.merge_patch(service)
        await kube.set_configuration_finalizers(namespace, "cams", ["edgeplug.io/test"])
        await kube.set_configuration_finalizers(namespace, "cams", [])
    finally:
        await asyncio.gather(client.close(), rest.close(), return_exceptions=True)
    stored = cp.get_json(f"/apis/edgeplug.io/v1alpha1/namespaces/{namespace}/"
                         "configurations/cams")
    assert stored is not None
    assert not cast(dict[str, Any], stored["metadata"]).get("finalizers")



# -- Nodes, DRA objects, Events --------------------------------------------------------------


DRA_MANIFESTS = REPO_ROOT / "deploy" / "dra"
NODE_ONLY = "may change only the edgeplug.io/pinned-demand annotation"
ClaimTemplateResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates")


@pytest.fixture(scope="module")
def dra_installed(installed: ControlPlane) -> ControlPlane:
    """``kubectl apply -k deploy/dra`` beside deploy/manifests, as the DRA default installs."""
    installed.kubectl("apply", "-k", str(DRA_MANIFESTS))
    return installed


def test_controller_token_changes_nothing_on_a_node_but_its_annotation(
    installed: ControlPlane, ctl: Client
) -> None:
    """A dangling owner reference on a Node has the garbage collector delete it; a finalizer
    holds its deletion. The controller's Node patch (pinned_demand.py through
    Kube.annotate_node) sets one annotation and nothing else."""
    cp = installed
    node = f"ctl-attack-{uuid.uuid4().hex[:6]}"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))

    def patch(body: dict[str, Any]) -> Callable[[bool], object]:
        return lambda dry: ctl.patch(Node, node, body, patch_type=PatchType.MERGE, dry_run=dry)

    try:
        gone = {"apiVersion": "v1", "kind": "Namespace", "name": f"gone-{node}",
                "uid": str(uuid.uuid4())}
        refused(patch({"metadata": {"ownerReferences": [gone]}}), because=NODE_ONLY)
        refused(patch({"metadata": {"finalizers": ["example.com/hold"]}}), because=NODE_ONLY)
        refused(patch({"metadata": {"annotations": {"example.com/other": "x"}}}),
                because=NODE_ONLY)
        # The control: the patch Kube.annotate_node makes.
        patch({"metadata": {"annotations": {"edgeplug.io/pinned-demand": "{}"}}})(False)
        stored = cp.get_json(f"/api/v1/nodes/{node}")
        assert stored is not None
        meta = cast(dict[str, Any], stored["metadata"])
        assert not meta.get("ownerReferences"), meta
        assert not meta.get("finalizers"), meta
        assert meta["annotations"]["edgeplug.io/pinned-demand"] == "{}"
    finally:
        cp.kubectl("delete", "node", node, "--wait=false", check=False)


def _device_class(name: str, expression: str, **labels: str) -> Any:
    return DeviceClassResource.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selectors": [{"cel": {"expression": expression}}]}})


def test_controller_token_writes_only_its_own_device_classes(
    dra_installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    """Another vendor's class is neither rewritten (a selector ``true`` would hand its
    claims any device) nor deleted, no class of another name is created, and the controller's
    own classes select only edgeplug.io devices; the classes crds/dra.py writes (a
    Configuration's, an Instance's, the extended-resource probe's dry run) still pass."""
    cp = dra_installed
    s = uuid.uuid4().hex[:6]
    theirs = f"gpu-{s}.example.com"
    cp.kubectl("apply", "-f", "-", stdin=json.dumps(_device_class(
        theirs, 'device.driver == "gpu.example.com"').to_dict()))
    ours = {dra.LABEL_MANAGED_BY: dra.CLASS_MANAGER}
    only_ours = "only its own DeviceClasses"
    try:
        refused(lambda dry: ctl.patch(DeviceClassResource, theirs, {"spec": {"selectors": [
            {"cel": {"expression": "true"}}]}}, patch_type=PatchType.MERGE, dry_run=dry),
            because=only_ours)
        refused(lambda dry: ctl.delete(DeviceClassResource, theirs, dry_run=dry),
                because=only_ours)
        refused(lambda dry: ctl.create(_device_class(f"x-{s}.example.com", "true", **ours),
                                       dry_run=dry), because=only_ours)
        refused(lambda dry: ctl.create(_device_class(f"x-{s}.edgeplug.io",
                                                     dra.device_selector(namespace, "x")),
                                       dry_run=dry), because=only_ours)
        select_only = "select only devices of the driver edgeplug.io"
        for expression in ("true", dra.device_selector(namespace, "x") + " || true",
                           'device.driver == "gpu.example.com"'):
            forged = _device_class(f"x-{s}.edgeplug.io", expression, **ours)
            refused(functools.partial(_create, ctl, forged), because=select_only)
        # The controls: what controller/dra/device_classes.py and instance_classes.py apply.
        bodies = [dra.device_class(namespace, "cam", extended_resource="edgeplug.io/cam"),
                  dra.instance_class(namespace, "cam", "cam-0a0b0c",
                                     extended_resource="edgeplug.io/cam-0a0b0c")]
        probe = dra.device_class("", "probe", extended_resource=f"{dra.DRIVER}/probe")
        probe["metadata"]["name"] = "edgeplug-probe.edgeplug.io"
        ctl.patch(DeviceClassResource, probe["metadata"]["name"], probe,
                  patch_type=PatchType.APPLY, force=True, dry_run=True)
        for body in bodies:
            ctl.patch(DeviceClassResource, body["metadata"]["name"], body,
                      patch_type=PatchType.APPLY, force=True)
        for body in bodies:
            ctl.delete(DeviceClassResource, body["metadata"]["name"])
        assert cp.kubectl("get", "deviceclass", theirs, check=False).returncode == 0
    finally:
        cp.kubectl("delete", "deviceclass", theirs, check=False)


def _claim_template(namespace: str, name: str, exactly: dict[str, Any]) -> Any:
    return ClaimTemplateResource.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": dra.BROKER_CLAIM,
                                                    "exactly": exactly}]}}}})


def test_controller_token_makes_claim_templates_for_edgeplug_devices_only(
    dra_installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    """A broker's claim template (controller/brokers/broker_claims.py) asks for its Configuration's
    class and one Instance: never another vendor's class, never adminAccess."""
    cp = dra_installed
    cp.kubectl("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    ours = dra.device_class_name(namespace, "cam")
    refused(lambda dry: ctl.create(_claim_template(namespace, "admin", {
        "deviceClassName": ours, "adminAccess": True}), dry_run=dry),
        because="ask for no adminAccess")
    refused(lambda dry: ctl.create(_claim_template(namespace, "gpu", {
        "deviceClassName": "gpu.example.com"}), dry_run=dry),
        because="ask only for edgeplug DeviceClasses")
    refused(lambda dry: ctl.create(_claim_template("kube-system", "x", {
        "deviceClassName": ours}), dry_run=dry), because="no ResourceClaimTemplate in kube-system")
    # The control: the template broker_claims.render_claim_template writes.
    ctl.create(_claim_template(namespace, "cam-0a0b0c", {
        "deviceClassName": ours,
        "selectors": [{"cel": {"expression": dra.instance_selector("cam-0a0b0c")}}]}))


def test_controller_token_posts_events_only_about_its_own_objects(
    installed: ControlPlane, ctl: Client, namespace: str
) -> None:
    """Its Events (controller/brokers/eventbatch.py's event_object) are about Configurations and
    Instances, as edgeplug-controller; none about a Node or a pod, none in a node's name."""
    configuration = {"apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
                     "metadata": {"name": "cam", "namespace": namespace,
                                  "uid": str(uuid.uuid4())}}
    own = event_object(configuration, warning=True, reason="BrokerRefused", message="m",
                       component=REPORTING_COMPONENT)

    def event(change: Callable[[dict[str, Any]], None]) -> Callable[[bool], object]:
        body = copy.deepcopy(own)
        change(body)
        return functools.partial(_create, ctl, cast(Event, Event.from_dict(body)))

    def about_node(e: dict[str, Any]) -> None:
        e["metadata"]["namespace"] = "default"  # where a cluster-scoped object's Events go
        e["involvedObject"] = {"apiVersion": "v1", "kind": "Node", "name": "node-a",
                               "uid": str(uuid.uuid4())}

    def about_pod(e: dict[str, Any]) -> None:
        e["involvedObject"] = {"apiVersion": "v1", "kind": "Pod", "name": "victim",
                               "namespace": namespace, "uid": str(uuid.uuid4())}

    def as_kubelet(e: dict[str, Any]) -> None:
        e["source"] = {"component": "kubelet", "host": "node-a"}

    def in_a_nodes_name(e: dict[str, Any]) -> None:
        e["source"]["host"] = "node-a"

    own_objects = "only about a Configuration or an Instance"
    refused(event(about_node), because=own_objects)
    refused(event(about_pod), because=own_objects)
    refused(event(as_kubelet), because="only as itself")
    refused(event(in_a_nodes_name), because="only as itself")
    event(lambda e: None)(False)


# -- where the controller runs ---------------------------------------------------------------


CONTROLLER_NODE_LABEL = "node-restriction.kubernetes.io/edgeplug-controller"


def _placement_pod(namespace: str, name: str) -> dict[str, Any]:
    """A pod placed as the controller's Deployment places its replicas (its nodeSelector,
    tolerations and affinity as shipped), running as the namespace's default account."""
    deployment = _docs("controller-deployment.yaml")[0]
    template = deployment["spec"]["template"]["spec"]
    spec = {k: template[k] for k in ("nodeSelector", "tolerations", "affinity") if k in template}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {**spec, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.invalid/controller:1"}]}}


async def test_the_controllers_placement_fails_closed(
    installed: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """A controller replica on a node not meant for it would let that node's kubelet mint the
    controller's token, so the shipped placement requires a label only an admin can set: on a
    cluster of unlabelled Ready nodes the replica stays Pending; a node's own kubelet cannot give
    itself the label (NodeRestriction); labelled by the admin, the node gets the replica."""
    cp, ns = installed, pod_namespace
    nodes = sorted([new_node(cp), new_node(cp)])
    async with h.ready_nodes(kube, nodes):
        h.apply(cp, ns, _placement_pod(ns, "controller-0"))
        why = await eventually(lambda: h.unschedulable(kube, ns, "controller-0"),
                               what="the controller's replica unschedulable",
                               deadline=h.SCHEDULE_DEADLINE)
        assert "affinity" in why or "selector" in why, why
        pending = await kube.get(Pod, "controller-0", namespace=ns)
        assert pending.spec is not None
        assert not pending.spec.nodeName
        kubelet = kubelet_kubeconfig(cp, nodes[0], tmp_path)
        done = cp.kubectl(f"--kubeconfig={kubelet}", "label", "node", nodes[0],
                          f"{CONTROLLER_NODE_LABEL}=true", check=False)
        assert done.returncode != 0, "a kubelet gave its own node the controller's label"
        assert "node-restriction.kubernetes.io" in done.stderr, done.stderr
        cp.kubectl("label", "node", nodes[1], f"{CONTROLLER_NODE_LABEL}=true")

        async def placed() -> str | None:
            pod = await kube.get(Pod, "controller-0", namespace=ns)
            return pod.spec.nodeName if pod.spec else None

        assert await eventually(placed, what="the replica placed on the labelled node",
                                deadline=h.SCHEDULE_DEADLINE) == nodes[1]
