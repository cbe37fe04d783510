"""The Helm chart, with the real Helm, against the real API server.

Why this exists: a chart is templates, and templates break in ways only rendering and applying
show (an indentation, a value that renders to the wrong type, a field the API server refuses).
Helm v3.22 is built from its Go module (tests/harness/helmbin.py). Here the chart is linted,
rendered with its default and with non-default values and applied with
``kubectl apply --dry-run=server`` to the real API server, and, on a control plane of its own,
installed, upgraded to changed values and uninstalled, with the real controller started from
what the chart rendered (its arguments, on its ServiceAccount's own token) in between. What the
test sees at upgrade and uninstall is what deploy/README.md tells a cluster admin.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.harness import helmbin
from tests.harness.agent_process import apply, create_node, debug_echo_configuration
from tests.harness.controlplane import REPO_ROOT, ControlPlane, running
from tests.harness.service_accounts import mint

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
              "cdiSpecDir": ""},
    "controller": {"replicas": 1},
}

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
    """``kubectl apply --dry-run=server``: the objects as the API server would store them."""
    done = cp.kubectl("apply", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-",
                      stdin=manifest, check=False)
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
    assert "args" not in _container(controller), "two replicas elect a leader: no --standalone"
    assert _container(controller)["image"] == "ghcr.io/edgeplug/controller:0.1.0"
    agent = _find(stored, "DaemonSet", "edgeplug-agent")
    env = _env(_container(agent))
    assert env["PLUGIN_DIR"] == "/var/lib/kubelet/device-plugins"
    assert env["CDI_SPEC_DIR"] == "/var/run/cdi"
    assert "WATCH_NAMESPACE" not in env
    for binding in (o for o in stored if o["kind"] == "ClusterRoleBinding"):
        assert {s["namespace"] for s in binding["subjects"]} == {namespace}, binding


def test_non_default_values_render_what_the_api_server_accepts(
    helm: Callable[..., subprocess.CompletedProcess[str]], control_plane: ControlPlane,
    namespace: str, tmp_path: Path,
) -> None:
    values = _values_file(tmp_path, {**NON_DEFAULT_VALUES, "watchNamespace": namespace})
    manifest = helm("template", RELEASE, str(CHART), "--namespace", namespace,
                    "-f", str(values)).stdout
    stored = _dry_run(control_plane, manifest)
    controller = _container(_find(stored, "Deployment", "edgeplug-controller"))
    assert controller["args"] == [f"--namespace={namespace}", "--standalone"]
    assert controller["image"] == "registry.example.test/edge/controller:9.8.7"
    assert controller["imagePullPolicy"] == "Always"
    daemonset = _find(stored, "DaemonSet", "edgeplug-agent")
    agent = _container(daemonset)
    env = _env(agent)
    assert env["WATCH_NAMESPACE"] == namespace
    assert env["PLUGIN_DIR"] == "/var/lib/k0s/kubelet/device-plugins"
    assert env["METRICS_PORT"] == "9500"
    assert env["CDI_SPEC_DIR"] == ""
    assert agent["ports"][0]["containerPort"] == 9500
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert "cdi" not in volumes, "no CDI spec directory: nothing mounted for it"
    assert volumes["device-plugins"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/device-plugins"


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


class _Controller:
    """The real controller, started with the arguments the chart rendered into its Deployment
    and nothing but its ServiceAccount's own token."""

    def __init__(self, cp: ControlPlane, folder: Path) -> None:
        deployment = _get(cp, "deployment", "edgeplug-controller", "-n", SYSTEM_NAMESPACE)
        assert deployment is not None
        container = _container(deployment)
        token = mint(cp, namespace=SYSTEM_NAMESPACE, account=deployment["spec"]["template"][
            "spec"]["serviceAccountName"], path=folder / f"token-{uuid.uuid4().hex[:6]}")
        self.log = folder / "controller.log"
        env = {**cp.env(), "KUBECONFIG": str(token.kubeconfig), "PYTHONUNBUFFERED": "1",
               **_env(container)}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "controller.main", "--kubeconfig", str(token.kubeconfig),
                 *container.get("args", []), *CONTROLLER_TEST_ARGS],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(CONTROLLER_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(CONTROLLER_STOP_S)


def _publish(cp: ControlPlane, namespace: str, node: str) -> tuple[str, str]:
    """A Configuration with a broker, and the Instance an agent on ``node`` would publish."""
    configuration = debug_echo_configuration("cam", descriptions=["cam0"])
    configuration["spec"]["brokerSpec"] = {"brokerPodSpec": {"containers": [
        {"name": "broker", "image": "registry.example.test/broker:1"}]}}
    apply(cp, namespace, configuration)
    created = _get(cp, "configuration", "cam", "-n", namespace)
    assert created is not None
    name = f"cam-{uuid.uuid4().hex[:6]}"
    apply(cp, namespace, {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": name, "labels": {"edgeplug.io/configuration": "cam"},
                     "ownerReferences": [{"apiVersion": "edgeplug.io/v1alpha1",
                                          "kind": "Configuration", "name": "cam",
                                          "uid": created["metadata"]["uid"]}]},
        "spec": {"configurationName": "cam", "cdiName": f"edgeplug.io/cam={name[-6:]}",
                 "capacity": 1, "shared": True, "nodes": [node],
                 "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": "cam0"},
                 "deviceUsage": {f"{name}-0": ""}},
    })
    return "cam", name


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


@pytest.mark.slow
def test_install_upgrade_uninstall_on_the_local_control_plane(
    helm: Callable[..., subprocess.CompletedProcess[str]], own_plane: ControlPlane,
    tmp_path: Path,
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
                       ("validatingadmissionpolicy", "edgeplug-agent-own-node-labels")]:
        assert _get(cp, kind, name) is not None, f"{kind}/{name} not installed"
    assert _get(cp, "daemonset", "edgeplug-agent", "-n", SYSTEM_NAMESPACE) is not None
    # The controller-manager acts on the Deployment: two controller pods (no node runs them).
    _poll(lambda: (pods := _get(cp, "pods", "-n", SYSTEM_NAMESPACE, "-l",
                                "app.kubernetes.io/name=edgeplug-controller"))
          and len(pods["items"]) == 2, what="the Deployment's two controller pods")

    # the controller as rendered serves a Configuration: status observed, broker pod created.
    workload = f"apps-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", workload)
    create_node(cp, "node-a")
    configuration, instance = _publish(cp, workload, "node-a")
    controller = _Controller(cp, tmp_path)
    try:
        broker = _poll(lambda: _broker_pod(cp, workload, instance),
                       what=f"the controller's broker pod for {instance}")
        _poll(lambda: _observed(cp, workload, configuration), what="the Configuration's status")
    finally:
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
    assert _container(deployment)["args"] == [f"--namespace={workload}", "--standalone"]
    daemonset = _get(cp, "daemonset", "edgeplug-agent", "-n", SYSTEM_NAMESPACE)
    assert daemonset is not None
    assert _env(_container(daemonset))["METRICS_PORT"] == "9500"
    kept = _broker_pod(cp, workload, instance)
    assert kept is not None
    assert kept["metadata"]["uid"] == broker["metadata"]["uid"], "the broker pod was replaced"
    assert _get(cp, "instance", instance, "-n", workload) is not None
    # the upgraded controller (one replica, standalone, one namespace) still serves.
    cp.kubectl("patch", "configuration", configuration, "-n", workload, "--type=merge",
               "-p", '{"spec": {"capacity": 2}}')
    controller = _Controller(cp, tmp_path)
    try:
        _poll(lambda: _observed(cp, workload, configuration),
              what="the upgraded controller observing the changed Configuration")
    finally:
        controller.stop()

    # uninstall: the release's objects go; CRDs, Configurations, Instances and brokers stay.
    helm("uninstall", RELEASE, "--namespace", SYSTEM_NAMESPACE, "--wait", **kube)
    for kind, name, ns in [("daemonset", "edgeplug-agent", SYSTEM_NAMESPACE),
                           ("deployment", "edgeplug-controller", SYSTEM_NAMESPACE),
                           ("serviceaccount", "edgeplug-agent", SYSTEM_NAMESPACE),
                           ("clusterrole", "edgeplug-agent", None),
                           ("clusterrolebinding", "edgeplug-controller", None),
                           ("validatingadmissionpolicy", "edgeplug-agent-own-node-labels", None)]:
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
