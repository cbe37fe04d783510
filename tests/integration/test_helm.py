"""The Helm chart, with the real Helm, against the real API server.

A chart is templates, and templates break in ways only rendering and applying
show (an indentation, a value that renders to the wrong type, a field the API server refuses).
Helm v3.22 is built from its Go module (tests/harness/helmbin.py). Here the chart is linted,
rendered with its default and with non-default values and applied with
``kubectl apply --dry-run=server`` to the real API server, and, on a control plane of its own,
installed, upgraded to changed values and uninstalled, with the real agent and controller
started from what the chart rendered (the DaemonSet's environment, the Deployment's arguments,
each on its own ServiceAccount's token) in between. What the test sees at upgrade and uninstall
is what deploy/README.md tells a cluster admin.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from crds import dra
from discovery_handlers.debug_echo import DESCRIPTION_PROPERTY
from tests.harness import helmbin, hermetic
from tests.harness.agent_process import apply, create_node, debug_echo_configuration
from tests.harness.aio_process import stop_popen
from tests.harness.controlplane import REPO_ROOT, ControlPlane, free_port, running
from tests.harness.service_accounts import mint, pod_bound

pytestmark = pytest.mark.timeout(300)

CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
RELEASE = "edgeplug"
SYSTEM_NAMESPACE = "edgeplug-system"
HELM_TIMEOUT_S = 120
#: Generous: the machine is shared; no deadline here is a pass/fail timing.
WAIT_S = 60.0
POLL_S = 0.2
CONTROLLER_STOP_S = 10.0
#: Short intervals so the controller resyncs and heartbeats while the test watches.
CONTROLLER_TEST_ARGS = ("--resync-interval", "1", "--peering-lifetime", "4")
CHART_CRDS = ("configurations.edgeplug.io", "instances.edgeplug.io",
              "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev")
NON_DEFAULT_VALUES: dict[str, Any] = {
    "image": {"registry": "registry.example.test/edge", "tag": "9.8.7", "pullPolicy": "Always"},
    "agent": {"pluginDir": "/var/lib/k0s/kubelet/device-plugins", "metricsPort": 9500,
              "cdiSpecDir": "", "hostNetwork": False},
    "controller": {"replicas": 1, "webhook": {"enabled": False},
                   "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [],
                   "nodeAffinity": None},
}
#: The controller's and the Configurations' admission policies (deploy/README.md, "What the
#: controller can do"), installed by default.
CONTROLLER_POLICIES = ("edgeplug-controller-agent-access", "edgeplug-controller-webhook",
                       "edgeplug-controller-secrets", "edgeplug-controller-configurations",
                       "edgeplug-controller-workloads", "edgeplug-controller-events",
                       "edgeplug-configuration-references", "edgeplug-broker-pod-policy")

T = TypeVar("T")


def _poll(probe: Callable[[], T | None], *, what: str) -> T:
    """Poll ``probe`` until it returns something other than None or False."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")
        time.sleep(POLL_S)


@pytest.fixture(scope="module")
def helm(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real helm with its config, cache and data in a folder of the test's own."""
    binary = str(helmbin.resolve())
    home = tmp_path_factory.mktemp("helm-home")
    env = {"HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_DATA_HOME": str(home / "data"), "PATH": "/usr/bin:/bin", "HOME": str(home)}

    def run(*args: str, kubeconfig: Path | None = None, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        extra = {"KUBECONFIG": str(kubeconfig)} if kubeconfig else {}
        done = subprocess.run([binary, *args], env={**env, **extra}, capture_output=True,
                              text=True, input=stdin, timeout=HELM_TIMEOUT_S, check=False)
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
        return done

    return run


def _values_file(folder: Path, values: dict[str, Any]) -> Path:
    path = folder / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _objects(manifest: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


# -- lint -----------------------------------------------------------------------------------


def test_lint_passes_strict_with_default_and_non_default_values(
    helm: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    default = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in default.stdout
    other = helm("lint", "--strict", str(CHART), "-f", _values_file(tmp_path, NON_DEFAULT_VALUES)
                 .as_posix(), "--set", "watchNamespace=apps")
    assert "0 chart(s) failed" in other.stdout


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("controller.replicas=two", "/controller/replicas"),
        ("agent.metricsPort=0", "/agent/metricsPort"),
        ("agent.pluginDir=relative/dir", "/agent/pluginDir"),
        ("watchNamespace=Not_A_Name", "/watchNamespace"),
        ("agent.pluginDirectory=/x", "pluginDirectory"),
        ("dra.pluginsDir=relative/dir", "/dra/pluginsDir"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(
    helm: Callable[..., subprocess.CompletedProcess[str]], setting: str, field: str
) -> None:
    done = helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert done.returncode != 0
    assert field in done.stderr, done.stderr


# -- template, applied to the real API server ----------------------------------------------


def _dry_run(cp: ControlPlane, manifest: str) -> list[dict[str, Any]]:
    """``kubectl apply --dry-run=server``: the objects as the API server would store them. A
    dry run creates nothing, so the Namespaces the manifest makes (the nodes' accounts') are
    made for real first, for the objects inside them, and deleted after."""
    made = [o["metadata"]["name"] for o in _objects(manifest) if o["kind"] == "Namespace"]
    for name in made:
        cp.kubectl("create", "namespace", name, check=False)
    try:
        done = cp.kubectl("apply", "--dry-run=server", "--validate=strict", "-o", "json",
                          "-f", "-", stdin=manifest, check=False)
    finally:
        if made:
            cp.kubectl("delete", "namespace", *made, "--wait=false", check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return list(answer["items"]) if answer.get("kind") == "List" else [answer]


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment; the API server stores an empty value as no value."""
    return {var["name"]: "<from field>" if "valueFrom" in var else var.get("value", "")
            for var in container.get("env", [])}


def test_default_values_render_what_the_api_server_accepts(
    helm: Callable[..., subprocess.CompletedProcess[str]], control_plane: ControlPlane,
    namespace: str,
) -> None:
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace,
                    "--include-crds").stdout
    rendered = _objects(manifest)
    stored = _dry_run(control_plane, manifest)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in stored) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in rendered)
    kinds = {o["kind"] for o in stored}
    assert {"CustomResourceDefinition", "DaemonSet", "Deployment", "ServiceAccount",
            "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"} <= kinds
    controller = _find(stored, "Deployment", "edgeplug-controller")
    assert controller["metadata"]["namespace"] == namespace
    assert controller["spec"]["replicas"] == 2
    # Two replicas elect a leader (no --standalone); both serve the admission webhook; DRA is
    # on (the scheduler allocates shared devices where the cluster maps extended resources).
    assert _container(controller)["args"] == ["--webhook", "--metrics-port=9465", "--dra"]
    assert _find(stored, "ValidatingWebhookConfiguration", "edgeplug-configurations")
    assert _find(stored, "Service", "edgeplug-controller-webhook")["metadata"]["namespace"] == (
        namespace)
    assert _container(controller)["image"] == "ghcr.io/edgeplug/controller:0.1.0"
    agent = _find(stored, "DaemonSet", "edgeplug-agent")
    env = _env(_container(agent))
    assert env["PLUGIN_DIR"] == "/var/lib/kubelet/device-plugins"
    assert env["CDI_SPEC_DIR"] == "/var/run/cdi"
    assert "WATCH_NAMESPACE" not in env
    # The node's network, for ONVIF multicast and udev's netlink events; cluster DNS kept.
    pod_spec = agent["spec"]["template"]["spec"]
    assert (pod_spec["hostNetwork"], pod_spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    for binding in (o for o in stored if o["kind"] == "ClusterRoleBinding"):
        assert {s["namespace"] for s in binding["subjects"]} == {namespace}, binding
    # The controller's policies name the release's accounts and namespace; it runs only on a
    # node an admin labelled for it, never on an edge node.
    for name in CONTROLLER_POLICIES:
        policy = _find(stored, "ValidatingAdmissionPolicy", name)
        assert _find(stored, "ValidatingAdmissionPolicyBinding", name)
        assert "edgeplug-system" not in json.dumps(policy), name
    access = _find(stored, "ValidatingAdmissionPolicy", "edgeplug-controller-agent-access")
    assert f"system:serviceaccount:{namespace}:edgeplug-controller" in json.dumps(access)
    placement = controller["spec"]["template"]["spec"]
    node_affinity = placement["affinity"]["nodeAffinity"]
    required = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    [term] = required["nodeSelectorTerms"]
    assert {"key": "node-role.kubernetes.io/edge", "operator": "DoesNotExist"} in (
        term["matchExpressions"])
    assert {"key": "node-restriction.kubernetes.io/edgeplug-controller",
            "operator": "Exists"} in term["matchExpressions"]
    assert placement["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"


def test_non_default_values_render_what_the_api_server_accepts(
    helm: Callable[..., subprocess.CompletedProcess[str]], control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:
    values = _values_file(tmp_path, {**NON_DEFAULT_VALUES, "watchNamespace": namespace})
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace,
                    "-f", str(values)).stdout
    stored = _dry_run(control_plane, manifest)
    controller = _container(_find(stored, "Deployment", "edgeplug-controller"))
    assert controller["args"] == [f"--namespace={namespace}", "--standalone",
                                  "--metrics-port=9465", "--dra"]
    assert controller["image"] == "registry.example.test/edge/controller:9.8.7"
    assert controller["imagePullPolicy"] == "Always"
    placement = _find(stored, "Deployment", "edgeplug-controller")["spec"]["template"]["spec"]
    assert placement["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "tolerations" not in placement
    assert "nodeAffinity" not in placement["affinity"]
    daemonset = _find(stored, "DaemonSet", "edgeplug-agent")
    agent = _container(daemonset)
    env = _env(agent)
    assert env["WATCH_NAMESPACE"] == namespace
    assert env["PLUGIN_DIR"] == "/var/lib/k0s/kubelet/device-plugins"
    assert env["METRICS_PORT"] == "9500"
    assert env["CDI_SPEC_DIR"] == ""
    assert agent["ports"][0]["containerPort"] == 9500
    pod_spec = daemonset["spec"]["template"]["spec"]
    assert not pod_spec.get("hostNetwork"), "hostNetwork: false keeps the pod's own network"
    assert pod_spec["dnsPolicy"] == "ClusterFirst"
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert "cdi" not in volumes, "no CDI spec directory: nothing mounted for it"
    assert volumes["device-plugins"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/device-plugins"


def test_dra_values_render_the_agents_plugin_the_controllers_flags_and_the_rights(
    helm: Callable[..., subprocess.CompletedProcess[str]], control_plane: ControlPlane,
    namespace: str,
) -> None:
    """dra.enabled: the agent serves DRA with the kubelet's plugin directories mounted, the
    controller runs with --dra, and deploy/dra's rights and ResourceSlice policy come along
    (bound to the release's namespace); all of it by default, and none of it with
    dra.enabled=false."""
    for name in ("dra-rbac.yaml", "agent-resourceslice-policy.yaml",
                 "controller-resourceslice-policy.yaml", "agent-liveness-policy.yaml",
                 "controller-devicetaintrule-policy.yaml"):  # links: no drift
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} is a copy, not a link"
        assert link.resolve() == (REPO_ROOT / "deploy" / "dra" / name).resolve()
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace,
                    "--set", "dra.enabled=true", "--set", "dra.extendedResources=true").stdout
    stored = _dry_run(control_plane, manifest)
    daemonset = _find(stored, "DaemonSet", "edgeplug-agent")
    agent = _container(daemonset)
    env = _env(agent)
    assert (env["DRA"], env["DRA_PLUGINS_DIR"], env["DRA_REGISTRY_DIR"]) == (
        "on", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry")
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"]
               for v in daemonset["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    # Only the driver's own folder of the plugins directory; the registry the kubelet watches;
    # CDI specs for claims where containerd reads them.
    for name, path in (("dra-plugin", "/var/lib/kubelet/plugins/edgeplug.io"),
                       ("dra-registry", "/var/lib/kubelet/plugins_registry"),
                       ("cdi", "/var/run/cdi")):
        assert (mounts[name], volumes[name]) == (path, path), name
    # Claims are read as the kubelet (test_the_kubelets_certificate_makes_the_nodes_reads).
    assert not _read_rules(stored)
    controller = _container(_find(stored, "Deployment", "edgeplug-controller"))
    assert controller["args"][-2:] == ["--dra", "--dra-extended-resources"]
    for kind, name in (("ClusterRole", "edgeplug-agent-dra"),
                       ("ClusterRole", "edgeplug-controller-dra"),
                       ("ValidatingAdmissionPolicy", "edgeplug-agent-own-resourceslices"),
                       ("ValidatingAdmissionPolicy",
                        "edgeplug-controller-shared-resourceslices"),
                       ("ValidatingAdmissionPolicy", "edgeplug-controller-device-classes"),
                       ("ValidatingAdmissionPolicy", "edgeplug-controller-claim-templates"),
                       ("ValidatingAdmissionPolicy", "edgeplug-agent-liveness"),
                       ("ValidatingAdmissionPolicy", "edgeplug-controller-devicetaintrules")):
        assert _find(stored, kind, name)
    # The liveness Lease in the release's namespace, where the agent may write it.
    assert env["LIVENESS_LEASE_NAMESPACE"] == namespace
    assert _find(stored, "Role", "edgeplug-agent-liveness")["metadata"]["namespace"] == namespace
    for name in ("edgeplug-controller-device-classes", "edgeplug-controller-claim-templates"):
        (condition,) = _find(stored, "ValidatingAdmissionPolicy", name)["spec"]["matchConditions"]
        assert f"system:serviceaccount:{namespace}:edgeplug-controller" in condition["expression"]
    for binding in (o for o in stored if o["kind"] == "ClusterRoleBinding"):
        assert {s["namespace"] for s in binding["subjects"]} == {namespace}, binding
    policy = _find(stored, "ValidatingAdmissionPolicy", "edgeplug-agent-own-resourceslices")
    (condition,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{namespace}:edgeplug-agent" in condition["expression"]
    ours = _find(stored, "ValidatingAdmissionPolicy", "edgeplug-controller-shared-resourceslices")
    (condition,) = ours["spec"]["matchConditions"]
    assert f"system:serviceaccount:{namespace}:edgeplug-controller" in condition["expression"]

    default = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace).stdout)
    assert _env(_container(_find(default, "DaemonSet", "edgeplug-agent")))["DRA"] == "on"
    assert "--dra" in _container(_find(default, "Deployment", "edgeplug-controller"))["args"]
    off = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                        "--set", "dra.enabled=false").stdout)
    assert not [o for o in off if "dra" in o["metadata"]["name"]]
    assert "DRA" not in _env(_container(_find(off, "DaemonSet", "edgeplug-agent")))

    # The compatibility mode's rights (deploy/compat): not in the DRA default, with
    # dra.enabled=false (shared devices then go through device plugins) and with
    # compat.crossNode=true.
    link = CHART / "files" / "agent-compat-rbac.yaml"
    assert link.is_symlink(), f"{link} is a copy, not a link"
    assert link.resolve() == (REPO_ROOT / "deploy" / "compat" / link.name).resolve()
    assert not _compat_rules(default)
    crossed = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                            "--set", "compat.crossNode=true").stdout)
    for rendered in (off, crossed):
        assert _compat_rules(rendered) == [(["pods"], ["watch"]), (["nodes/status"], ["patch"])]
        (binding,) = [o for o in rendered if o["kind"] == "ClusterRoleBinding"
                      and o["metadata"]["name"] == "edgeplug-agent-compat"]
        assert binding["subjects"][0]["namespace"] == namespace


def _read_rules(objects: list[dict[str, Any]]) -> list[tuple[list[str], list[str]]]:
    """The agent's rules on ResourceClaims and its pods ``list``, whichever of its ClusterRoles
    holds them (the reads the kubelet's certificate makes)."""
    return [(rule["resources"], rule["verbs"]) for o in objects if o["kind"] == "ClusterRole"
            and o["metadata"]["name"].startswith("edgeplug-agent") for rule in o["rules"]
            if "resourceclaims" in rule["resources"]
            or ("pods" in rule["resources"] and "list" in rule["verbs"])]


def test_the_kubelets_certificate_makes_the_nodes_reads(
    helm: Callable[..., subprocess.CompletedProcess[str]], namespace: str,
) -> None:
    """Both agent DaemonSets mount the kubelet's certificate directory read-only at its own path
    (the rotated file is a link there) and name the file; the token gets no pods list and no
    claim read. Without the directory (a kubelet with no certificate), deploy/token-reads'
    grant comes instead."""
    link = CHART / "files" / "agent-token-reads.yaml"
    assert link.is_symlink(), f"{link} is a copy, not a link"
    assert link.resolve() == (REPO_ROOT / "deploy" / "token-reads" / link.name).resolve()
    default = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                            "--set", "ascend.enabled=true").stdout)
    for name in ("edgeplug-agent", "edgeplug-agent-npu"):
        daemonset = _find(default, "DaemonSet", name)
        agent = _container(daemonset)
        env = _env(agent)
        assert env["KUBELET_CLIENT_CERT"] == "/var/lib/kubelet/pki/kubelet-client-current.pem"
        assert "KUBELET_CLIENT_KEY" not in env
        (pki,) = [m for m in agent["volumeMounts"] if m["name"] == "kubelet-pki"]
        (volume,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "kubelet-pki"]
        assert (pki["mountPath"], pki.get("readOnly"), volume["hostPath"]["path"]) == (
            "/var/lib/kubelet/pki", True, "/var/lib/kubelet/pki"), name
    assert not _read_rules(default)
    keyed = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                          "--set", "agent.kubeletClientCert=kubelet.crt",
                          "--set", "agent.kubeletClientKey=kubelet.key").stdout)
    env = _env(_container(_find(keyed, "DaemonSet", "edgeplug-agent")))
    assert (env["KUBELET_CLIENT_CERT"], env["KUBELET_CLIENT_KEY"]) == (
        "/var/lib/kubelet/pki/kubelet.crt", "/var/lib/kubelet/pki/kubelet.key")
    by_token = _objects(helm("template", RELEASE, str(CHART), "--namespace", namespace,
                             "--set", "agent.kubeletCertDir=").stdout)
    agent = _container(_find(by_token, "DaemonSet", "edgeplug-agent"))
    assert _env(agent)["KUBELET_CLIENT_CERT"] == ""
    assert "kubelet-pki" not in {m["name"] for m in agent["volumeMounts"]}
    assert _read_rules(by_token) == [(["pods"], ["list"]), (["resourceclaims"], ["get"])]


def _compat_rules(objects: list[dict[str, Any]]) -> list[tuple[list[str], list[str]]]:
    """The agent's pods-watch and nodes/status rules, whichever of its ClusterRoles holds them."""
    return [(rule["resources"], rule["verbs"]) for o in objects if o["kind"] == "ClusterRole"
            and o["metadata"]["name"].startswith("edgeplug-agent") for rule in o["rules"]
            if rule["resources"] == ["nodes/status"] or ("watch" in rule["verbs"]
            and rule["resources"] == ["pods"])]


# -- install, upgrade, uninstall -------------------------------------------------------------


@pytest.fixture(scope="module")
def own_plane() -> Iterator[ControlPlane]:
    """A control plane of the chart's own, without CRDs: the release installs them, and its
    cluster-wide objects (ClusterRoles, the node policy) meet no one else's."""
    with running(install_crds=False) as plane:
        yield plane


def _get(cp: ControlPlane, *args: str) -> dict[str, Any] | None:
    done = cp.kubectl("get", *args, "-o", "json", check=False)
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    found: dict[str, Any] = json.loads(done.stdout)
    return found


class _Part:
    """A real part (controller or agent) started as its rendered workload says: its
    container's arguments and environment, and nothing but its ServiceAccount's own token."""

    def __init__(self, cp: ControlPlane, kind: str, name: str, folder: Path) -> None:
        workload = _get(cp, kind, name, "-n", SYSTEM_NAMESPACE)
        assert workload is not None, f"{kind}/{name} not rendered"
        self.container = _container(workload)
        self.account = workload["spec"]["template"]["spec"]["serviceAccountName"]
        self.log = folder / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, cp: ControlPlane, kubeconfig: Path, argv: list[str],
              env: dict[str, str]) -> None:
        full = {**cp.env(), "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1", **env}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, *argv], cwd=REPO_ROOT, env=full,
                                            stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        stop_popen(self.process, grace_s=CONTROLLER_STOP_S)


def _controller(cp: ControlPlane, folder: Path) -> _Part:
    """``controller.main`` with the Deployment's arguments and environment."""
    part = _Part(cp, "deployment", "edgeplug-controller", folder)
    token = mint(cp, namespace=SYSTEM_NAMESPACE, account=part.account,
                 path=folder / f"token-{uuid.uuid4().hex[:6]}")
    args = list(part.container.get("args", []))
    if "--webhook" in args:  # served on loopback here: no Service network on this machine
        args += ["--webhook-address", "127.0.0.1", "--webhook-port", str(free_port())]
    env = {**_env(part.container), "POD_NAMESPACE": SYSTEM_NAMESPACE}  # the downward API's
    part.start(cp, token.kubeconfig,
               ["-m", "controller.main", "--kubeconfig", str(token.kubeconfig),
                *args, *CONTROLLER_TEST_ARGS], env)
    return part


def _agent(cp: ControlPlane, node: str, folder: Path, root: Path) -> _Part:
    """``agent.main`` with the DaemonSet's environment on ``node``, its token bound to a pod
    there as a DaemonSet pod's is. Where no kubelet is, the harness sets what a node would: the
    node's name (the downward API), the host paths the DaemonSet mounts under ``root`` (the
    node's own directories, never this machine's: its /var/lib/akri may hold another process's
    handler registrations), a free metrics port, and no device-plugin serving."""
    part = _Part(cp, "daemonset", "edgeplug-agent", folder)
    token = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account=part.account, node=node,
                      folder=folder)
    env = hermetic.own_paths(_env(part.container), root)
    env.update({"NODE_NAME": node, "METRICS_PORT": str(free_port()), "DEVICE_PLUGINS": "off"})
    hermetic.refuse_host_environment({**cp.env(), **env}, what=f"the chart's agent on {node}")
    part.start(cp, token.kubeconfig, ["-m", "agent.main"], env)
    return part


def _configure(cp: ControlPlane, namespace: str) -> str:
    """A debugEcho Configuration with a broker; returns its name."""
    configuration = debug_echo_configuration("cam", descriptions=["cam0"])
    configuration["spec"]["brokerSpec"] = {"brokerPodSpec": {"containers": [
        {"name": "broker", "image": "registry.example.test/broker:1"}]}}
    apply(cp, namespace, configuration)
    return "cam"


def _instance_on(cp: ControlPlane, namespace: str, configuration: str,
                 node: str) -> dict[str, Any] | None:
    """The Instance of ``configuration`` that lists ``node``."""
    found = _get(cp, "instances", "-n", namespace)
    assert found is not None
    for item in found["items"]:
        spec = item["spec"]  # nodes: absent between the agent's create and its apply
        if spec["configurationName"] == configuration and node in spec.get("nodes", []):
            return dict(item)
    return None


def _broker_pod(cp: ControlPlane, namespace: str, instance: str) -> dict[str, Any] | None:
    pods = _get(cp, "pods", "-n", namespace)
    assert pods is not None
    for pod in pods["items"]:
        owners = pod["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "Instance" and o["name"] == instance for o in owners):
            return dict(pod)
    return None


def _deleted_or_going(pod: dict[str, Any] | None) -> bool:
    """Gone, or being deleted (a pod bound to a node waits for that node's kubelet)."""
    return pod is None or "deletionTimestamp" in pod["metadata"]


def _observed(cp: ControlPlane, namespace: str, configuration: str) -> bool:
    found = _get(cp, "configuration", configuration, "-n", namespace)
    assert found is not None
    status = found.get("status") or {}
    return bool(status.get("observedGeneration") == found["metadata"]["generation"])


@pytest.fixture
def node_root() -> Iterator[Path]:
    """The node's own root for the paths the DaemonSet mounts (short: socket paths)."""
    path = Path(tempfile.mkdtemp(prefix="ep-helm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_install_upgrade_uninstall_on_the_local_control_plane(
    helm: Callable[..., subprocess.CompletedProcess[str]], own_plane: ControlPlane,
    tmp_path: Path, node_root: Path,
) -> None:
    cp = own_plane
    kube = {"kubeconfig": cp.kubeconfig}

    # install: CRDs from the chart's crds/, the parts, their RBAC and the node policy.
    helm("install", RELEASE, str(CHART), "--namespace", SYSTEM_NAMESPACE, "--create-namespace",
         **kube)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               *(f"crd/{crd}" for crd in CHART_CRDS))
    status = json.loads(helm("status", RELEASE, "-n", SYSTEM_NAMESPACE, "-o", "json",
                             **kube).stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 1)
    for kind, name in [("clusterrole", "edgeplug-agent"), ("clusterrole", "edgeplug-controller"),
                       ("validatingadmissionpolicy", "edgeplug-agent-own-node-labels"),
                       ("validatingadmissionpolicy", "edgeplug-agent-own-node-instances"),
                       *(("validatingadmissionpolicy", p) for p in CONTROLLER_POLICIES)]:
        assert _get(cp, kind, name) is not None, f"{kind}/{name} not installed"
    assert _get(cp, "daemonset", "edgeplug-agent", "-n", SYSTEM_NAMESPACE) is not None
    # The controller-manager acts on the Deployment: two controller pods (no node runs them).
    _poll(lambda: (pods := _get(cp, "pods", "-n", SYSTEM_NAMESPACE, "-l",
                                "app.kubernetes.io/name=edgeplug-controller"))
          and len(pods["items"]) == 2, what="the Deployment's two controller pods")

    # the parts as rendered, on their own tokens: the agent publishes the device's Instance,
    # the controller creates its broker pod and writes the Configuration's status.
    workload = f"apps-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", workload)
    create_node(cp, "node-a")
    configuration = _configure(cp, workload)
    agent, controller = _agent(cp, "node-a", tmp_path, node_root), _controller(cp, tmp_path)
    try:
        published = _poll(lambda: _instance_on(cp, workload, configuration, "node-a"),
                          what=f"the agent's Instance (log: {agent.log})")
        # cam0's, found by the built-in debugEcho: no handler that registered with some other
        # agent on this machine took debugEcho over.
        assert published["spec"]["brokerProperties"].get(DESCRIPTION_PROPERTY) == "cam0", (
            f"the Instance is not cam0's: {published['spec']} (log: {agent.log})")
        # The chart's handler registration, served in the node's own /var/lib/akri.
        _poll(lambda: (node_root / "var/lib/akri/agent-registration.sock").is_socket(),
              what=f"the agent's registration socket under {node_root}")
        instance = published["metadata"]["name"]
        broker = _poll(lambda: _broker_pod(cp, workload, instance),
                       what=f"the controller's broker pod for {instance} (log: {controller.log})")
        _poll(lambda: _observed(cp, workload, configuration), what="the Configuration's status")
        # Its DeviceClass (--dra), written on its own token under the chart's DeviceClass
        # policy (dra/controller-deviceclass-policy.yaml).
        _poll(lambda: _get(cp, "deviceclass", dra.device_class_name(workload, configuration)),
              what=f"the Configuration's DeviceClass (log: {controller.log})")
        # The chart's node policy lets the agent label its own node.
        _poll(lambda: ((_get(cp, "node", "node-a") or {})["metadata"].get("labels") or {}).get(
            f"edgeplug.io/{configuration}") == "true", what="the agent's label on its node")
    finally:
        agent.stop()
        controller.stop()

    # upgrade to changed values: the parts change, CRDs and what users made stay as they were.
    values = _values_file(tmp_path, {**NON_DEFAULT_VALUES, "watchNamespace": workload})
    helm("upgrade", RELEASE, str(CHART), "--namespace", SYSTEM_NAMESPACE, "-f", str(values),
         **kube)
    status = json.loads(helm("status", RELEASE, "-n", SYSTEM_NAMESPACE, "-o", "json",
                             **kube).stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)
    deployment = _get(cp, "deployment", "edgeplug-controller", "-n", SYSTEM_NAMESPACE)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 1
    assert _container(deployment)["args"] == [f"--namespace={workload}", "--standalone",
                                              "--metrics-port=9465", "--dra"]
    daemonset = _get(cp, "daemonset", "edgeplug-agent", "-n", SYSTEM_NAMESPACE)
    assert daemonset is not None
    assert _env(_container(daemonset))["WATCH_NAMESPACE"] == workload
    kept = _broker_pod(cp, workload, instance)
    assert kept is not None
    assert kept["metadata"]["uid"] == broker["metadata"]["uid"], "the broker pod was replaced"
    # the upgraded parts (one namespace; the controller standalone) take up where they left off.
    cp.kubectl("patch", "configuration", configuration, "-n", workload, "--type=merge",
               "-p", '{"spec": {"capacity": 2}}')
    agent, controller = _agent(cp, "node-a", tmp_path, node_root), _controller(cp, tmp_path)
    try:
        _poll(lambda: (found := _instance_on(cp, workload, configuration, "node-a"))
              and found["spec"]["capacity"] == 2,
              what=f"the upgraded agent applying the new capacity (log: {agent.log})")
        _poll(lambda: _observed(cp, workload, configuration),
              what=f"the upgraded controller observing the change (log: {controller.log})")
    finally:
        agent.stop()
        controller.stop()
    adopted = _instance_on(cp, workload, configuration, "node-a")
    assert adopted is not None
    assert adopted["metadata"]["uid"] == published["metadata"]["uid"], "Instance re-created"

    # uninstall: the release's objects go; CRDs, Configurations, Instances and brokers stay.
    helm("uninstall", RELEASE, "--namespace", SYSTEM_NAMESPACE, "--wait", **kube)
    for kind, name, ns in [("daemonset", "edgeplug-agent", SYSTEM_NAMESPACE),
                           ("deployment", "edgeplug-controller", SYSTEM_NAMESPACE),
                           ("serviceaccount", "edgeplug-agent", SYSTEM_NAMESPACE),
                           ("clusterrole", "edgeplug-agent", None),
                           ("clusterrolebinding", "edgeplug-controller", None),
                           ("validatingadmissionpolicy", "edgeplug-agent-own-node-labels", None),
                           ("validatingadmissionpolicy", "edgeplug-agent-own-node-instances",
                            None),
                           *(("validatingadmissionpolicy", p, None)
                             for p in CONTROLLER_POLICIES)]:
        where = ("-n", ns) if ns else ()
        assert _get(cp, kind, name, *where) is None, f"{kind}/{name} left after uninstall"
    assert json.loads(helm("list", "-A", "-o", "json", **kube).stdout) == []
    for crd in CHART_CRDS:
        assert _get(cp, "crd", crd) is not None, f"uninstall removed CRD {crd}"
    assert _get(cp, "configuration", configuration, "-n", workload) is not None
    assert _get(cp, "instance", instance, "-n", workload) is not None
    assert _broker_pod(cp, workload, instance) is not None
    # with the parts gone, deleting a Configuration still cleans up (no finalizer waits for a
    # controller): the garbage collector takes its Instance, then the Instance's broker pod.
    cp.kubectl("delete", "configuration", configuration, "-n", workload, "--timeout=60s")
    _poll(lambda: _get(cp, "instance", instance, "-n", workload) is None
          and _deleted_or_going(_broker_pod(cp, workload, instance)),
          what="the Instance and broker of a deleted Configuration collected")
