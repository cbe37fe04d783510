"""The chart's monitoring (deploy/helm/edgeplug/templates/monitoring.yaml and the scrape
annotations), rendered by the real Helm: the Prometheus Operator's objects appear only when
their value is on and the cluster serves monitoring.coreos.com/v1; the PrometheusRule holds
deploy/monitoring/alerts.yaml as it is, the dashboard ConfigMap deploy/monitoring/dashboard.json.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness import helmbin
from tests.harness.controlplane import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
MONITORING = REPO_ROOT / "deploy" / "monitoring"
ALL_ON = ("--set", "monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,"
          "monitoring.grafanaDashboard.enabled=true")
OPERATOR = ("--api-versions", "monitoring.coreos.com/v1")


def _render(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    env = {"HELM_CONFIG_HOME": str(tmp_path / "c"), "HELM_CACHE_HOME": str(tmp_path / "k"),
           "HELM_DATA_HOME": str(tmp_path / "d"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(helmbin.resolve()), "template", "r", str(CHART), "--namespace",
                           "edgeplug-system", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def _kinds(objects: list[dict[str, object]]) -> set[str]:
    return {str(o["kind"]) for o in objects}


@pytest.mark.parametrize("args", [(), ALL_ON, OPERATOR])
def test_operator_objects_need_their_value_and_the_operators_api(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    kinds = _kinds(_render(tmp_path, *args))
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert ("ConfigMap" in kinds) == (args == ALL_ON)  # the dashboard needs no operator


def test_with_the_operator_the_rules_and_dashboard_are_the_files_as_they_are(
    tmp_path: Path,
) -> None:
    objects = _render(tmp_path, *ALL_ON, *OPERATOR)
    by_kind = {str(o["kind"]): o for o in objects
               if o["kind"] in ("PodMonitor", "PrometheusRule", "ConfigMap")}
    assert by_kind["PrometheusRule"]["spec"] == yaml.safe_load(
        (MONITORING / "alerts.yaml").read_text())
    dashboard = by_kind["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # type: ignore[index]
    assert json.loads(dashboard["data"]["edgeplug.json"]) == json.loads(  # type: ignore[index]
        (MONITORING / "dashboard.json").read_text())
    endpoints = by_kind["PodMonitor"]["spec"]["podMetricsEndpoints"]  # type: ignore[index]
    assert [e["port"] for e in endpoints] == ["metrics"]


def _pod_annotations(objects: list[dict[str, object]], kind: str, name: str) -> dict[str, str]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]  # type: ignore[index]
    meta = found["spec"]["template"]["metadata"]  # type: ignore[index]
    return dict(meta.get("annotations") or {})


def test_pods_carry_scrape_annotations_for_their_metrics_ports(tmp_path: Path) -> None:
    objects = _render(tmp_path)
    assert _pod_annotations(objects, "DaemonSet", "edgeplug-agent") == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics"}
    assert _pod_annotations(objects, "Deployment", "edgeplug-controller")[
        "prometheus.io/port"] == "9465"
    quiet = _render(tmp_path, "--set", "controller.metricsPort=0")
    assert _pod_annotations(quiet, "Deployment", "edgeplug-controller") == {}
    off = _render(tmp_path, "--set", "monitoring.scrapeAnnotations=false")
    assert _pod_annotations(off, "DaemonSet", "edgeplug-agent") == {}
