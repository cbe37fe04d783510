"""What the controller grants the agent to read, from Configurations
(controller/grants/agent_access.py).

A wrong Role here is either an agent that cannot start discovery or one that
reads Secrets nobody named; the second is silent, so the tables below pin the rules down.
"""

from __future__ import annotations

from typing import Any, cast

from lightkube import AsyncClient

from controller.grants.agent_access import VERBS, AgentAccess, merged, references_of, role_body


def _configuration(namespace: str, *refs: dict[str, Any]) -> dict[str, Any]:
    props = [{"name": f"p{i}", "valueFrom": ref} for i, ref in enumerate(refs)]
    return {"metadata": {"name": "cam", "namespace": namespace},
            "spec": {"discoveryHandler": {"name": "debugEcho", "discoveryDetails": "",
                                          "discoveryProperties": [
                                              *props, {"name": "plain", "value": "1"}]}}}


def test_references_land_in_the_configurations_namespace_and_no_other() -> None:
    """A reference naming another namespace (kube-system, another tenant's) grants nothing:
    whoever may write Configurations in one namespace must not make the agents read a Secret
    elsewhere; naming the Configuration's own namespace is the same as leaving it out."""
    cfg = _configuration(
        "cams",
        {"secretKeyRef": {"name": "login", "key": "password"}},
        {"configMapKeyRef": {"name": "ports", "key": "rtsp", "namespace": "shared"}},
        {"secretKeyRef": {"name": "admin-token", "key": "token", "namespace": "kube-system"}},
        {"secretKeyRef": {"name": "login", "key": "user", "namespace": "cams"}},
    )
    assert references_of(cfg) == {"cams": {"secrets": {"login"}}}


def test_a_configuration_that_does_not_parse_grants_nothing() -> None:
    assert references_of({"metadata": {"name": "x", "namespace": "n"}, "spec": {}}) == {}


def test_references_of_several_configurations_are_merged() -> None:
    a = {"n": {"secrets": {"a"}}}
    b = {"n": {"secrets": {"b"}, "configmaps": {"c"}}, "m": {"secrets": {"d"}}}
    assert merged([a, b]) == {"n": {"secrets": {"a", "b"}, "configmaps": {"c"}},
                              "m": {"secrets": {"d"}}}


def test_roles_never_carry_a_rule_without_names() -> None:
    """An empty resourceNames grants every object of the kind: a kind nobody names is left
    out of the Role entirely."""
    body = role_body("ns", {"secrets": set(), "configmaps": {"b", "a"}})
    assert body["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": list(VERBS), "resourceNames": ["a", "b"]}]
    assert role_body("ns", {"secrets": set()})["rules"] == []
    assert "list" not in VERBS


def test_nothing_is_granted_in_a_system_namespace() -> None:
    """kube-system, kube-public, kube-node-lease and the agent's own namespace get no Role
    (the controller's policy refuses one there too); other namespaces keep theirs."""
    access = AgentAccess(cast(AsyncClient, None), account=("edgeplug-system", "edgeplug-agent"))
    ref = {"secretKeyRef": {"name": "login", "key": "password"}}
    wanted = merged(references_of(_configuration(ns, ref)) for ns in (
        "kube-system", "kube-public", "kube-node-lease", "edgeplug-system", "cams"))
    assert access._grantable(wanted) == {"cams": {"secrets": {"login"}}}
