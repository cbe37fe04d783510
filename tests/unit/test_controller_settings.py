"""The controller's settings: each declared once, with its flag, and the flags give the defaults.

Why this exists: a setting's field, its ``add_argument`` and the copy of the parsed value were
three declarations; now the field's metadata is its flag (controller/options.py). These tests
fail when a field has no flag, when a flag's default is not its field's, and when a flag the
manifests or the chart pass is not one the controller declares.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from controller.options import add_options, option_values
from controller.settings import ControllerSettings
from tests.harness.controlplane import REPO_ROOT

#: Fields set by other means than a flag of their own.
NOT_A_FLAG = {"webhook": "controller.webhook.settings' flags"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser, ControllerSettings)
    return parser


def test_every_setting_is_declared_with_its_flag() -> None:
    declared = set(option_values(ControllerSettings, _parser().parse_args([])))
    every = {f.name for f in dataclasses.fields(ControllerSettings)}
    assert declared == every - set(NOT_A_FLAG)


def test_no_flags_give_the_fields_defaults() -> None:
    parsed = dataclasses.asdict(ControllerSettings.from_args([]))
    defaults = dataclasses.asdict(ControllerSettings())
    assert 1 <= parsed.pop("priority") <= 2**31 - 1  # random, drawn per replica
    defaults.pop("priority")
    assert parsed == defaults


@pytest.mark.parametrize(("argv", "field", "value"), [
    (["--namespace", "a", "--namespace", "b"], "namespaces", ("a", "b")),
    (["--standalone"], "peering_name", None),
    (["--peering-name", "p"], "peering_name", "p"),
    (["--priority", "7"], "priority", 7),
    (["--resync-interval", "2.5"], "resync_interval_s", 2.5),
    (["--dra", "--dra-extended-resources"], "dra_extended_resources", True),
])
def test_a_flag_sets_its_field(argv: list[str], field: str, value: object) -> None:
    assert getattr(ControllerSettings.from_args(argv), field) == value


def test_kubeconfig_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/env/config")
    assert str(ControllerSettings.from_args([]).kubeconfig) == "/env/config"
    assert str(ControllerSettings.from_args(["--kubeconfig", "/k"]).kubeconfig) == "/k"
    monkeypatch.delenv("KUBECONFIG")
    assert ControllerSettings.from_args([]).kubeconfig is None


def test_every_flag_the_deployments_pass_is_declared(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ControllerSettings.from_args(["--help"])
    flags = set(re.findall(r"(--[a-z][a-z-]+)", capsys.readouterr().out))
    passed = set()
    for path in [REPO_ROOT / "deploy" / "manifests" / "controller-deployment.yaml",
                 REPO_ROOT / "deploy" / "helm" / "edgeplug" / "templates"
                 / "controller-deployment.yaml"]:
        code = re.sub(r"#.*", "", path.read_text())
        passed |= set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", code))
    assert passed, "no controller flags found in the Deployments"
    assert passed <= flags, passed - flags
