"""The controller's settings: one tree, each setting declared once, with its flag if it has one;
``--help`` and docs/controller-settings.md are made from it.

These tests fail when a field of the tree is not declared as a setting, when a flag's default is
not its field's, when ``--help`` or the docs page and the tree differ, and when a flag the
manifests or the chart pass is not one the controller declares.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from controller.options import flags, reference, walk
from controller.settings import ControllerSettings
from tests.harness.controlplane import REPO_ROOT

DOCS_PAGE = REPO_ROOT / "docs" / "controller-settings.md"


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        ControllerSettings.from_args(["--help"])
    return capsys.readouterr().out


def _fields(cls: type[object], prefix: str = "") -> set[str]:
    """Every leaf field of the tree under ``cls``, by dotted path."""
    found = set()
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if dataclasses.is_dataclass(f.default_factory):
            found |= _fields(f.default_factory, f"{prefix}{f.name}.")
        else:
            found.add(f"{prefix}{f.name}")
    return found


def test_every_setting_is_declared_with_its_doc() -> None:
    declared = {path for path, _, _ in walk(ControllerSettings)}
    assert declared == _fields(ControllerSettings)
    for path, _, option in walk(ControllerSettings):
        assert option.help.strip(), f"{path} says nothing of what it is"


def test_no_flags_give_the_fields_defaults() -> None:
    parsed = dataclasses.asdict(ControllerSettings.from_args([]))
    defaults = dataclasses.asdict(ControllerSettings())
    assert 1 <= parsed["peering"].pop("priority") <= 2**31 - 1  # random, drawn per replica
    defaults["peering"].pop("priority")
    assert parsed == defaults


@pytest.mark.parametrize(("argv", "path", "value"), [
    (["--namespace", "a", "--namespace", "b"], "namespaces", ("a", "b")),
    (["--standalone"], "peering.name", None),
    (["--peering-name", "p"], "peering.name", "p"),
    (["--priority", "7"], "peering.priority", 7),
    (["--resync-interval", "2.5"], "engine.resync_interval_s", 2.5),
    (["--dra", "--dra-extended-resources"], "dra.extended_resources", True),
    (["--webhook-cert-check-interval", "60"], "webhook.cert_check_interval_s", 60.0),
    (["--webhook-namespace", "w"], "webhook.namespace", "w"),
])
def test_a_flag_sets_its_field(argv: list[str], path: str, value: object) -> None:
    found: object = ControllerSettings.from_args(argv)
    for name in path.split("."):
        found = getattr(found, name)
    assert found == value


def test_kubeconfig_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/env/config")
    assert str(ControllerSettings.from_args([]).kubeconfig) == "/env/config"
    assert str(ControllerSettings.from_args(["--kubeconfig", "/k"]).kubeconfig) == "/k"
    monkeypatch.delenv("KUBECONFIG")
    assert ControllerSettings.from_args([]).kubeconfig is None


def test_help_lists_the_trees_flags(capsys: pytest.CaptureFixture[str]) -> None:
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", _help(capsys))) - {"--help"}
    assert shown == flags(ControllerSettings)


def test_the_docs_page_lists_the_tree() -> None:
    page = DOCS_PAGE.read_text()
    assert reference(ControllerSettings) in page, (
        "docs/controller-settings.md differs from the tree: its table is the output of"
        " `python -m controller.settings`")


def test_every_flag_the_deployments_pass_is_declared(capsys: pytest.CaptureFixture[str]) -> None:
    flags_shown = set(re.findall(r"(--[a-z][a-z-]+)", _help(capsys)))
    passed = set()
    for path in [REPO_ROOT / "deploy" / "manifests" / "controller-deployment.yaml",
                 REPO_ROOT / "deploy" / "helm" / "edgeplug" / "templates"
                 / "controller-deployment.yaml"]:
        code = re.sub(r"#.*", "", path.read_text())
        passed |= set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", code))
    assert passed, "no controller flags found in the Deployments"
    assert passed <= flags_shown, passed - flags_shown
