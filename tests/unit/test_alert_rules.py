"""The alert rules (deploy/monitoring/alerts.yaml) pass Prometheus' own checks: ``promtool check
rules`` (syntax, valid PromQL, templates) and ``promtool test rules`` on
deploy/monitoring/alerts-test.yaml, whose input series make every alert fire where it should,
at the time its ``for`` allows, with its labels and annotations, and stay silent in a quiet fleet.

promtool comes with Debian's ``prometheus`` package (.ci/apt/monitoring.txt).
"""

from __future__ import annotations

import shutil
import subprocess

import yaml

from tests.harness.controlplane import REPO_ROOT

MONITORING = REPO_ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yaml"
RULE_TESTS = MONITORING / "alerts-test.yaml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: install Debian's prometheus (.ci/apt)"
    return subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_checks_the_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_promtool_rule_tests_pass() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook() -> None:
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c["exp_alerts"]}
    assert set(alerts) == fired == quiet
    runbook = (REPO_ROOT / "docs" / "operations.md").read_text()
    for alert in alerts:
        assert f"### {alert}" in runbook, alert
