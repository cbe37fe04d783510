"""The controller's rights and policies as written: what the files must keep saying.

The controller's RBAC and its admission policies are facts spread over several files
(deploy/manifests/controller-rbac.yaml, controller-policy.yaml, configuration-policy.yaml, the
controller's Deployment and the Helm chart's copies). What they do is shown against the real API
server in tests/integration/test_attacks_controller.py; here, without a cluster, that they stay
consistent: the broker pod policy says the same for Configurations and for the controller's own
pods, the ClusterRole holds no Secret rule and no RBAC right beyond its one Role name, and the
chart installs the same files and placement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from controller.grants.agent_access import ROLE_NAME, SYSTEM_NAMESPACES, VERBS
from controller.grants.offer_grants import ROLE_NAME as OFFER_ROLE
from crds.offers import OFFER_GROUP, OFFER_RESOURCE, OFFER_VERB
from tests.harness.controlplane import REPO_ROOT

MANIFESTS = REPO_ROOT / "deploy" / "manifests"
CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
CONTROLLER_USER = "system:serviceaccount:edgeplug-system:edgeplug-controller"
#: The variables only the broker policy's two copies differ in: which pod specs are checked.
SUBJECT_VARIABLES = {"pods", "services"}


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _one(name: str, kind: str, object_name: str) -> dict[str, Any]:
    [found] = [d for d in _docs(name)
               if d["kind"] == kind and d["metadata"]["name"] == object_name]
    return found


def _policies(name: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"] for d in _docs(name)
            if d["kind"] == "ValidatingAdmissionPolicy"}


def test_the_broker_pod_policy_is_the_same_for_configurations_and_the_controllers_pods() -> None:
    configurations = _policies("configuration-policy.yaml")["edgeplug-broker-pod-policy"]
    workloads = _policies("controller-policy.yaml")["edgeplug-controller-workloads"]
    # The controller's own first rule: no pod, Job or Service in a system namespace.
    assert workloads["validations"][1:] == configurations["validations"]

    def helpers(spec: dict[str, Any]) -> list[dict[str, Any]]:
        return [v for v in spec["variables"] if v["name"] not in SUBJECT_VARIABLES]

    assert helpers(workloads) == helpers(configurations)
    assert {v["name"] for v in configurations["variables"]} >= SUBJECT_VARIABLES


def test_every_policy_is_bound_to_deny_and_fails_closed() -> None:
    for name in ("controller-policy.yaml", "configuration-policy.yaml"):
        policies = _policies(name)
        bindings = {d["spec"]["policyName"]: d["spec"] for d in _docs(name)
                    if d["kind"] == "ValidatingAdmissionPolicyBinding"}
        assert set(bindings) == set(policies), name
        for policy, spec in policies.items():
            assert spec["failurePolicy"] == "Fail", policy
            assert bindings[policy]["validationActions"] == ["Deny"], policy
            assert "matchResources" not in bindings[policy], f"{policy} bound to a subset"


def test_controller_policies_match_the_controllers_own_account_alone() -> None:
    for policy, spec in _policies("controller-policy.yaml").items():
        [condition] = spec["matchConditions"]
        assert condition["expression"].strip() == (
            f'request.userInfo.username == "{CONTROLLER_USER}"'), policy


def test_controller_holds_no_secret_read_and_no_rbac_right_beyond_its_role_name() -> None:
    role = _one("controller-rbac.yaml", "ClusterRole", "edgeplug-controller")
    for rule in role["rules"]:
        resources = set(rule["resources"])
        assert not resources & {"secrets", "configmaps"}, rule
        assert not resources & {"clusterroles", "clusterrolebindings"}, rule
        assert "*" not in rule["verbs"], rule
        assert "*" not in resources, rule
        if "rbac.authorization.k8s.io" in rule["apiGroups"]:
            assert rule["resourceNames"] == [ROLE_NAME, OFFER_ROLE], rule
        if {"escalate", "bind", "impersonate"} & set(rule["verbs"]):
            assert rule.get("resourceNames") == [ROLE_NAME, OFFER_ROLE], rule
        if "admissionregistration.k8s.io" in rule["apiGroups"]:
            assert rule["verbs"] == ["get", "update"], rule
            assert rule["resourceNames"], rule
    webhook_role = _one("controller-rbac.yaml", "Role", "edgeplug-controller-webhook")
    assert [r["resourceNames"] for r in webhook_role["rules"] if "resourceNames" in r] == [
        ["edgeplug-controller-webhook-tls"]]


def test_the_agent_access_policy_allows_exactly_what_agent_access_writes() -> None:
    spec = _policies("controller-policy.yaml")["edgeplug-controller-agent-access"]
    [system] = [v["expression"] for v in spec["variables"] if v["name"] == "systemNamespaces"]
    assert set(yaml.safe_load(system)) == SYSTEM_NAMESPACES | {"edgeplug-system"}
    text = yaml.safe_dump(spec["validations"]) + yaml.safe_dump(spec["variables"])
    assert f"'{ROLE_NAME}'" in text
    assert all(f"v == '{verb}'" in text for verb in VERBS)
    assert f"'{OFFER_ROLE}'" in text
    assert f"['{OFFER_GROUP}']" in text
    assert f"['{OFFER_RESOURCE}']" in text
    assert f"['{OFFER_VERB}']" in text


def test_controller_is_kept_off_edge_nodes_and_the_chart_defaults_agree() -> None:
    deployment = _one("controller-deployment.yaml", "Deployment", "edgeplug-controller")
    pod = deployment["spec"]["template"]["spec"]
    node_affinity = pod["affinity"]["nodeAffinity"]
    [term] = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {(e["key"], e["operator"]) for e in term["matchExpressions"]} >= {
        ("node-role.kubernetes.io/edge", "DoesNotExist")}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["controller"]
    assert values["nodeAffinity"] == node_affinity
    assert values["tolerations"] == pod["tolerations"]
    assert values["nodeSelector"] == pod.get("nodeSelector", {})


def test_chart_installs_the_controller_policies_from_links() -> None:
    template = (CHART / "templates" / "controller-policies.yaml").read_text()
    for name in ("controller-policy.yaml", "configuration-policy.yaml"):
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} is a copy, not a link (copies drift)"
        assert link.resolve() == (MANIFESTS / name).resolve()
        assert f'"files/{name}"' in template


def test_no_other_chart_template_carries_the_policies_twice() -> None:
    others = [p for p in (CHART / "templates").glob("*.yaml")
              if p.name != "controller-policies.yaml"]
    for path in others:
        text = Path(path).read_text()
        assert "files/controller-policy.yaml" not in text, path
        assert "files/configuration-policy.yaml" not in text, path
