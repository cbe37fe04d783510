"""deploy/ agrees with the code: the DaemonSet gives the agent the settings it reads, the images
start the console scripts pyproject declares, the Helm chart serves the same files.

Manifests are copies of facts the code owns (environment names, paths, ports);
these tests read the facts from the code (``AgentSettings.from_env``, its defaults, pyproject)
so a rename on either side fails here, not on a node. The RBAC itself is tested against the
real API server in tests/integration/test_rbac.py.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.settings import (
    DEFAULT_CDI_SPEC_DIR,
    DEFAULT_DISCOVERY_HANDLERS_DIR,
    DEFAULT_KUBELET_CLIENT_CERT,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    AgentSettings,
    SettingsError,
)
from controller.settings import ControllerSettings
from tests.harness.controlplane import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
MANIFESTS = DEPLOY / "manifests"
PEERING_CRDS = DEPLOY / "kopf-peering.yaml"
CHART = DEPLOY / "helm" / "edgeplug"
IMAGES = DEPLOY / "images"
SYSTEM_NAMESPACE = "edgeplug-system"
NODE_ACCOUNTS = f"{SYSTEM_NAMESPACE}-nodes"
#: The agent's resident-memory target; its limit must leave a margin above it.
AGENT_TARGET_MIB = 79
AGENT_MIN_MARGIN_MIB = 16
NODE_NAME_PLACEHOLDER = "node-from-downward-api"
#: What the downward API gives each field the DaemonSets read (the pod's node, its namespace).
FIELD_PLACEHOLDERS = {"spec.nodeName": NODE_NAME_PLACEHOLDER,
                      "metadata.namespace": "namespace-from-downward-api"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "ValidatingWebhookConfiguration"}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _all_manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in [*sorted(MANIFESTS.glob("*.yaml")), PEERING_CRDS]:
        if path.name == "kustomization.yaml":
            continue
        for doc in _documents(path):
            yield path, doc


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in _all_manifests()
             if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _agent_container() -> dict[str, Any]:
    [container] = _one("DaemonSet", "edgeplug-agent")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _agent_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the agent sees it on a node."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert field in FIELD_PLACEHOLDERS, var
            env[var["name"]] = FIELD_PLACEHOLDERS[field]
    return env


def _mebibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert match, f"memory quantity {quantity!r} is not in Mi or Gi"
    return int(match[1]) * (1024 if match[2] == "Gi" else 1)


# -- every file ----------------------------------------------------------------------------


def test_every_document_parses_and_names_its_kind_and_api_version() -> None:
    seen = 0
    for path, doc in _all_manifests():
        assert doc.get("apiVersion"), f"{path.name}: no apiVersion in {doc}"
        assert doc.get("kind"), f"{path.name}: no kind in {doc}"
        assert doc["metadata"].get("name"), f"{path.name}: a {doc['kind']} without a name"
        if doc["kind"] not in CLUSTER_SCOPED:
            # The nodes' own accounts (agent/kube/node_account.py) live beside the install's.
            assert doc["metadata"].get("namespace") in (SYSTEM_NAMESPACE, NODE_ACCOUNTS), (
                f"{path.name}: {doc['kind']} {doc['metadata']['name']} outside {SYSTEM_NAMESPACE}"
            )
        seen += 1
    assert seen >= 10
    assert _one("Namespace", SYSTEM_NAMESPACE)


def test_kustomization_lists_every_manifest_in_its_folder() -> None:
    [kustomization] = _documents(MANIFESTS / "kustomization.yaml")
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)


# -- the agent DaemonSet and the agent's settings -------------------------------------------


def test_daemonset_environment_gives_the_agent_the_node_defaults() -> None:
    container = _agent_container()
    settings = AgentSettings.from_env(_agent_env(container))
    [metrics] = [p for p in container["ports"] if p["name"] == "metrics"]
    assert settings == AgentSettings(
        node_name=NODE_NAME_PLACEHOLDER,
        kubeconfig=None,  # in-cluster: the ServiceAccount's token
        plugin_dir=DEFAULT_PLUGIN_DIR,
        pod_resources_socket=DEFAULT_POD_RESOURCES_SOCKET,
        metrics_port=metrics["containerPort"],
        namespace=None,  # every namespace: the RBAC is cluster-wide
        serve_device_plugins=True,
        cdi_spec_dir=DEFAULT_CDI_SPEC_DIR,
        discovery_handlers_dir=DEFAULT_DISCOVERY_HANDLERS_DIR,
        kubelet_client_cert=DEFAULT_KUBELET_CLIENT_CERT,  # read only with the DRA plugin
        node_accounts_namespace=NODE_ACCOUNTS,
        liveness_namespace=FIELD_PLACEHOLDERS["metadata.namespace"],  # the install's
    )


def test_every_daemonset_variable_is_one_the_agent_reads() -> None:
    """Dropping any variable changes the settings (or, for the node name, is refused)."""
    env = _agent_env(_agent_container())
    full = AgentSettings.from_env(env)
    required = []
    for name in env:
        rest = {k: v for k, v in env.items() if k != name}
        try:
            reduced = AgentSettings.from_env(rest)
        except SettingsError:
            required.append(name)
            continue
        if name in ("PLUGIN_DIR", "POD_RESOURCES_SOCKET", "DISCOVERY_HANDLERS_DIRECTORY",
                    "KUBELET_CLIENT_CERT"):
            # These restate the defaults (explicit for operators); the value is what is read.
            changed = AgentSettings.from_env({**rest, name: "/elsewhere/x.sock"})
            assert changed != full, f"{name} is not read by AgentSettings.from_env"
        else:
            assert reduced != full, f"{name} is not read by AgentSettings.from_env"
    assert len(required) == 1
    [node_var] = [v for v in _agent_container()["env"] if v["name"] == required[0]]
    assert node_var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_daemonset_mounts_the_kubelet_paths_the_settings_name() -> None:
    pod = _one("DaemonSet", "edgeplug-agent")["spec"]["template"]["spec"]
    settings = AgentSettings.from_env(_agent_env(pod["containers"][0]))
    assert settings.pod_resources_socket is not None
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}

    plugin_mount = mounts[str(settings.plugin_dir)]
    assert host_paths[plugin_mount["name"]] == str(settings.plugin_dir)
    assert not plugin_mount.get("readOnly"), "the agent creates its sockets there"

    resources_dir = str(settings.pod_resources_socket.parent)
    assert host_paths[mounts[resources_dir]["name"]] == resources_dir
    for path in ("/sys", "/dev", resources_dir):
        assert mounts[path].get("readOnly") is True, f"{path} should be mounted read-only"
    assert settings.cdi_spec_dir is not None
    cdi_dir = str(settings.cdi_spec_dir)
    assert host_paths[mounts[cdi_dir]["name"]] == cdi_dir
    writable_host = [m["mountPath"] for m in mounts.values()
                     if m["name"] in host_paths and not m.get("readOnly")]
    assert settings.discovery_handlers_dir is not None
    handlers_dir = str(settings.discovery_handlers_dir)
    assert host_paths[mounts[handlers_dir]["name"]] == handlers_dir
    assert sorted(writable_host) == sorted([str(settings.plugin_dir), cdi_dir, handlers_dir])
    # The kubelet's certificate: its directory, read-only at its own path (a rotation's link).
    assert settings.kubelet_client_cert is not None
    pki = str(settings.kubelet_client_cert.parent)
    assert host_paths[mounts[pki]["name"]] == pki
    assert mounts[pki].get("readOnly") is True


def test_agent_memory_limit_leaves_a_margin_above_its_target() -> None:
    resources = _agent_container()["resources"]
    limit = _mebibytes(resources["limits"]["memory"])
    assert limit >= AGENT_TARGET_MIB + AGENT_MIN_MARGIN_MIB
    assert _mebibytes(resources["requests"]["memory"]) <= limit


# -- the controller Deployment ---------------------------------------------------------------


def test_controller_runs_two_replicas_apart_with_peering_resources_installed() -> None:
    deployment = _one("Deployment", "edgeplug-controller")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == (
        deployment["spec"]["selector"]["matchLabels"]
    )
    # The controller peers by default (cluster-wide: ClusterKopfPeering); the CRDs it needs:
    assert ControllerSettings(namespaces=()).peering.name is not None
    crds = {doc["spec"]["names"]["kind"] for doc in _documents(PEERING_CRDS)}
    assert crds == {"KopfPeering", "ClusterKopfPeering"}
    # Cluster-wide (no --namespace), serving the webhook on the port the Service targets.
    container = pod["containers"][0]
    settings = ControllerSettings.from_args(container["args"])
    assert settings.namespaces == ()
    assert settings.webhook.enabled
    [port] = [p for p in container["ports"] if p["name"] == "webhook"]
    assert port["containerPort"] == settings.webhook.port


@pytest.mark.parametrize(("kind", "name"), [("DaemonSet", "edgeplug-agent"),
                                            ("Deployment", "edgeplug-controller")])
def test_workload_runs_as_its_own_bound_service_account(kind: str, name: str) -> None:
    account = _one(kind, name)["spec"]["template"]["spec"]["serviceAccountName"]
    assert _one("ServiceAccount", account)["metadata"]["namespace"] == SYSTEM_NAMESPACE
    binding = _one("ClusterRoleBinding", account)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NAMESPACE}
    ]
    assert _one("ClusterRole", binding["roleRef"]["name"])


# -- images ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("image", "module"), [("agent", "agent.main"),
                                               ("controller", "controller.main")])
def test_image_starts_the_console_script_of_its_part(image: str, module: str) -> None:
    text = (IMAGES / f"{image}.Dockerfile").read_text()
    [entrypoint] = re.findall(r'^ENTRYPOINT \["([^"]+)"\]$', text, flags=re.MULTILINE)
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[entrypoint] == f"{module}:main"
    copied = set(re.findall(r"^COPY (\w+) ", text, flags=re.MULTILINE))
    other = {"agent": "controller", "controller": "agent"}[image]
    assert image in copied, f"the {image} image lacks its own package"
    assert other not in copied, f"the {image} image carries {other}/ too"


def test_agent_image_leaves_out_the_controllers_libraries() -> None:
    text = (IMAGES / "agent.Dockerfile").read_text()
    assert "controller" not in re.sub(r"#.*", "", text)
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [default] = re.findall(r"^ARG HANDLER_EXTRAS=(.*)$", text, flags=re.MULTILINE)
    for extra in default.split(","):
        assert extra in extras, f"HANDLER_EXTRAS names an unknown extra {extra!r}"
        assert not any("kopf" in dep or "kubernetes" in dep for dep in extras[extra])


# -- the Helm chart --------------------------------------------------------------------------


def test_chart_links_to_the_repositorys_own_crds_and_rbac() -> None:
    for name in ("Chart.yaml", "values.yaml"):
        assert yaml.safe_load((CHART / name).read_text())
    linked = {p.name: p for p in (CHART / "crds").iterdir()}
    for link in linked.values():
        assert link.is_symlink(), f"{link} is a copy, not a link (copies drift)"
        assert link.resolve().is_file(), f"{link} is a dangling link"
    expected = {p.name for p in (REPO_ROOT / "crds" / "manifests").glob("*.yaml")}
    assert expected | {PEERING_CRDS.name} == set(linked)
    for name in ("agent-rbac.yaml", "agent-node-policy.yaml", "agent-instance-policy.yaml",
                 "agent-pod-policy.yaml", "controller-rbac.yaml", "controller-node-policy.yaml"):
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} is a copy, not a link (copies drift)"
        assert link.resolve() == (MANIFESTS / name).resolve()
        assert f'"files/{name}"' in (CHART / "templates" / "rbac.yaml").read_text()


def test_chart_defaults_match_the_plain_manifests() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    container = _agent_container()
    settings = AgentSettings.from_env(_agent_env(container))
    assert settings.pod_resources_socket is not None
    assert values["agent"]["pluginDir"] == str(settings.plugin_dir)
    assert values["agent"]["podResourcesDir"] == str(settings.pod_resources_socket.parent)
    assert values["agent"]["metricsPort"] == settings.metrics_port
    assert values["agent"]["resources"] == container["resources"]
    deployment = _one("Deployment", "edgeplug-controller")
    assert values["controller"]["replicas"] == deployment["spec"]["replicas"]
    [controller] = deployment["spec"]["template"]["spec"]["containers"]
    assert values["controller"]["resources"] == controller["resources"]
    assert values["watchNamespace"] == ""


@pytest.mark.parametrize("image", ["agent", "controller"])
def test_engine_free_build_makes_the_dockerfiles_image(image: str) -> None:
    """deploy/images/build-oci.sh (``make images``) builds what the Dockerfile says: the same
    entrypoint, user and default extras."""
    dockerfile = (IMAGES / f"{image}.Dockerfile").read_text()
    [entrypoint] = re.findall(r'^ENTRYPOINT \["([^"]+)"\]$', dockerfile, flags=re.MULTILINE)
    [user] = re.findall(r"^USER (\S+)$", dockerfile, flags=re.MULTILINE)
    extras = (re.findall(r"^ARG HANDLER_EXTRAS=(.*)$", dockerfile, flags=re.MULTILINE)
              or re.findall(r'pip wheel .*"\.\[(\w+)\]"', dockerfile))
    script = (IMAGES / "build-oci.sh").read_text()
    [built] = re.findall(rf"^\s*(?:all\) )?image edgeplug-{image} {image} (\S+) (\S+) (\S+)",
                         script, flags=re.MULTILINE)
    assert (built[0], built[1]) == (extras[0], entrypoint)
    assert built[2] in (user, f"{user}:{user}")


# -- the agent's admission policies ------------------------------------------------------------

#: RBAC verb → the admission operation it arrives as (patch is an UPDATE).
_OPERATION = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}


@pytest.mark.parametrize("policy", ["edgeplug-agent-own-node-labels",
                                    "edgeplug-agent-own-node-instances",
                                    "edgeplug-agent-own-node-pods"])
def test_agent_policy_judges_the_agents_own_account_and_denies(policy: str) -> None:
    account = _one("ServiceAccount", "edgeplug-agent")["metadata"]
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    [condition] = _one("ValidatingAdmissionPolicy", policy)["spec"]["matchConditions"]
    assert f'"{username}"' in condition["expression"]
    binding = _one("ValidatingAdmissionPolicyBinding", policy)["spec"]
    assert binding["policyName"] == policy
    assert binding["validationActions"] == ["Deny"]


@pytest.mark.parametrize(("group", "kind", "policy"), [
    ("edgeplug.io", "instances", "edgeplug-agent-own-node-instances"),
    ("", "pods", "edgeplug-agent-own-node-pods"),
])
def test_policy_covers_every_write_the_agent_may_make(group: str, kind: str, policy: str
                                                      ) -> None:
    """A write verb the ClusterRole grants on Instances (pods) that the policy does not see
    would be a way around it."""
    rules = _one("ClusterRole", "edgeplug-agent")["rules"]
    granted = {(resource, _OPERATION[verb]) for rule in rules if group in rule["apiGroups"]
               for resource in rule["resources"] if resource.startswith(kind)
               for verb in rule["verbs"] if verb in _OPERATION}
    spec = _one("ValidatingAdmissionPolicy", policy)["spec"]
    assert spec["failurePolicy"] == "Fail"
    covered = {(resource, operation) for rule in spec["matchConstraints"]["resourceRules"]
               for resource in rule["resources"] for operation in rule["operations"]}
    assert granted, f"the ClusterRole grants no {kind} writes: this test reads the wrong rule"
    assert granted <= covered, f"{kind} writes the policy does not judge: {granted - covered}"


def _cel_list(policy: str, variable: str) -> set[str]:
    spec = _one("ValidatingAdmissionPolicy", policy)["spec"]
    [expression] = [v["expression"] for v in spec["variables"] if v["name"] == variable]
    return set(re.findall(r"'([^']+)'", expression))


def test_policies_allow_exactly_the_huawei_keys_the_agent_writes() -> None:
    """The agent's allow-lists, the handler's keys and the policies' lists are one list: a key
    the policy lacks would fail the agent's whole patch, a key it has beyond them widens it."""
    from agent.deviceplugins.pod_annotations import ANNOTATION_KEYS
    from agent.discovery.node_labels import FOREIGN_LABEL_KEYS
    from discovery_handlers.ascend import huawei

    assert set(huawei.LABEL_KEYS) == FOREIGN_LABEL_KEYS == _cel_list(
        "edgeplug-agent-own-node-labels", "huaweiLabels")
    assert set(huawei.ANNOTATION_KEYS) == ANNOTATION_KEYS == _cel_list(
        "edgeplug-agent-own-node-pods", "huaweiAnnotations")
