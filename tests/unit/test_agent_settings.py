"""The agent's settings: one declaration each, and the names and defaults users were told.

Every setting is declared once, as a field of the ``AgentSettings`` tree
(agent/settings.py), a variable in its metadata where the environment sets it; ``from_env`` and
docs/agent-settings.md are derived from those fields. The README, docs/ and the
DaemonSets (plain manifests, the NPU one, the Helm chart's templates) restate some of those
names and defaults; these tests read them from those files, so a rename or a changed default on
either side fails here, not on a node.
"""

from __future__ import annotations

import re
from dataclasses import Field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.environment import doc_of, is_read_from_environment
from agent.settings import (
    ENVIRONMENT,
    AgentSettings,
    SettingsError,
    leaves,
    reference,
    variable_of,
)
from tests.harness.controlplane import REPO_ROOT

VARIABLES = {v.name: v for v in ENVIRONMENT}
#: The settings the environment sets, as (dotted path, field).
READ: list[tuple[str, Field[Any]]] = [(p, f) for p, f in leaves() if is_read_from_environment(f)]
DOCS_PAGE = REPO_ROOT / "docs" / "agent-settings.md"
DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "deploy" / "README.md",
        *sorted((REPO_ROOT / "docs").rglob("*.md"))]
DAEMONSETS = [REPO_ROOT / "deploy" / "manifests" / "agent-daemonset.yaml",
              REPO_ROOT / "deploy" / "ascend" / "agent-npu-daemonset.yaml"]
CHART = REPO_ROOT / "deploy" / "helm" / "edgeplug"
CHART_DAEMONSETS = [CHART / "templates" / "agent-daemonset.yaml",
                    CHART / "templates" / "agent-daemonset-npu.yaml"]
#: Variables a DaemonSet sets to something else than the agent's default, on purpose.
CHOSEN = {"NODE_NAME": "from the downward API", "METRICS_PORT": "metrics are served",
          "DRA": "the chart's dra.enabled", "WATCH_NAMESPACE": "the chart's watchNamespace",
          "NODE_ACCOUNTS_NAMESPACE": "the install's namespace of the nodes' own accounts",
          "VOLCANO_DEVICE_INFO": "the NPU agent keeps Volcano's device-info ConfigMap"}
#: Variables a DaemonSet gives the agent's container that are not the agent's.
NOT_THE_AGENTS = {"LD_LIBRARY_PATH": "the dynamic loader's, for Ascend's libdcmi.so"}
#: "`NAME` (default `value`" or "(default value)" in prose.
PROSE_DEFAULT = re.compile(r"`([A-Z][A-Z0-9_]+)` \(default `?([^`;,) ]+)")
#: A row "| `NAME` | `value` | ..." of a docs table of agent settings.
TABLE_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)` \| `([^`]*)` \|", re.MULTILINE)
#: An env entry of a chart template: "- name: NAME" and its "value: ..." line.
TEMPLATE_ENV = re.compile(r"- name: ([A-Z][A-Z0-9_]+)\n\s+(?:value: (.*)|valueFrom:)")
TEMPLATE_VALUE = re.compile(
    r'\{\{ (?:printf "(?P<format>[^"]*)" )?(?P<refs>(?:\.Values\.[\w.]+ ?)+)\| quote \}\}')


def _get(settings: AgentSettings, path: str) -> Any:
    found: Any = settings
    for name in path.split("."):
        found = getattr(found, name)
    return found


def test_every_setting_is_read_from_one_variable_of_its_own() -> None:
    settings = [f for _, f in READ]
    names = [variable_of(f).name for f in settings]
    assert len(set(names)) == len(names) == len(settings)
    assert [v.name for v in ENVIRONMENT] == names
    for variable in ENVIRONMENT:
        assert variable.meaning, variable.name
        assert variable.default, variable.name


def test_the_environments_defaults_are_the_ones_help_shows() -> None:
    read = AgentSettings.from_env({"NODE_NAME": "n1"})
    shown = {path: variable_of(f).default for path, f in READ}
    for path, _ in READ:
        value = _get(read, path)
        if path == "node_name":
            continue
        if value is None:
            assert shown[path].startswith("("), f"{path}: unset reads as {shown[path]}"
        elif isinstance(value, bool):
            assert shown[path] == ("on" if value else "off"), path
        else:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            assert text == shown[path], path


@pytest.mark.parametrize(("env", "message"), [
    ({}, "NODE_NAME is required"),
    ({"NODE_NAME": "  "}, "NODE_NAME is required"),
    ({"NODE_NAME": "n", "METRICS_PORT": "x"}, "METRICS_PORT must be an integer"),
    ({"NODE_NAME": "n", "EXTERNAL_HANDLER_GRACE_SECONDS": "soon"},
     "EXTERNAL_HANDLER_GRACE_SECONDS must be a number"),
])
def test_a_garbled_setting_is_refused_naming_its_variable(env: dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        AgentSettings.from_env(env)


def test_empty_turns_a_path_off_or_keeps_the_default_as_its_meaning_says() -> None:
    empty = AgentSettings.from_env({"NODE_NAME": "n", **{name: "" for name in VARIABLES
                                                       if name != "NODE_NAME"}})
    for path, f in READ:
        variable = variable_of(f)
        if "empty: " in variable.meaning:
            assert _get(empty, path) is None, variable.name
    assert empty.plugin_dir == AgentSettings.from_env({"NODE_NAME": "n"}).plugin_dir


def test_every_setting_says_what_it_is() -> None:
    for path, f in leaves():
        assert doc_of(f), path


def test_the_docs_page_lists_the_tree() -> None:
    assert reference() in DOCS_PAGE.read_text(), (
        "docs/agent-settings.md differs from the tree: its table is the output of"
        " `python -m agent.settings`")


def _documented_defaults() -> list[tuple[Path, str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text()
        found += [(path, name, value) for name, value in PROSE_DEFAULT.findall(text)]
        for section in re.split(r"^## ", text, flags=re.MULTILINE):
            if section.startswith("Agent settings"):
                found += [(path, name, value) for name, value in TABLE_ROW.findall(section)]
    return found


def test_documented_defaults_are_the_agents() -> None:
    documented = _documented_defaults()
    assert {name for _, name, _ in documented} >= {
        "CDI_SPEC_DIR", "DRA_PLUGINS_DIR", "DRA_REGISTRY_DIR", "DISCOVERY_HANDLERS_DIRECTORY",
        "EXTERNAL_HANDLER_GRACE_SECONDS"}
    for path, name, value in documented:
        where = path.relative_to(REPO_ROOT)
        assert name in VARIABLES, f"{where} gives a default of {name}, which the agent never reads"
        assert value == VARIABLES[name].default, (
            f"{where}: {name} defaults to {value!r}; the agent's default is "
            f"{VARIABLES[name].default!r}")


def test_the_readmes_list_of_variables_names_the_agents() -> None:
    text = " ".join((REPO_ROOT / "README.md").read_text().split())
    match = re.search(r"`edgeplug-agent --help` lists them: ([^)]*)\)", text)
    assert match, "README no longer lists the agent's variables"
    listed = re.findall(r"`([A-Z][A-Z0-9_]+)`", match[1])
    assert listed
    assert set(listed) <= set(VARIABLES), set(listed) - set(VARIABLES)


def _agent_env(path: Path) -> list[dict[str, Any]]:
    [daemonset] = [d for d in yaml.safe_load_all(path.read_text())
                   if d and d["kind"] == "DaemonSet"]
    [agent] = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
               if c["name"] == "agent"]
    env: list[dict[str, Any]] = agent["env"]
    return env


def _check_daemonset_variable(where: str, name: str, value: str | None) -> None:
    if name in NOT_THE_AGENTS:
        return
    assert name in VARIABLES, f"{where} sets {name}, which the agent never reads"
    if name in CHOSEN or value is None:
        return
    assert value == VARIABLES[name].default, (
        f"{where} sets {name}={value!r}, not the agent's default {VARIABLES[name].default!r}")


@pytest.mark.parametrize("path", DAEMONSETS, ids=lambda p: p.name)
def test_daemonsets_set_only_the_agents_variables_and_restate_its_defaults(path: Path) -> None:
    env = _agent_env(path)
    assert {"NODE_NAME", "PLUGIN_DIR", "POD_RESOURCES_SOCKET"} <= {e["name"] for e in env}
    for entry in env:
        _check_daemonset_variable(str(path.relative_to(REPO_ROOT)), entry["name"],
                                  entry.get("value"))


def _chart_value(values: dict[str, Any], ref: str) -> Any:
    node: Any = values
    for key in ref.removeprefix(".Values.").split("."):
        node = node[key]
    return node


@pytest.mark.parametrize("path", CHART_DAEMONSETS, ids=lambda p: p.name)
def test_chart_daemonsets_set_only_the_agents_variables_and_restate_its_defaults(
        path: Path) -> None:
    """The templates are Go templates, not YAML: the env entries are read by pattern, and each
    ``.Values`` reference is resolved from values.yaml (the chart's defaults)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    entries = TEMPLATE_ENV.findall(path.read_text())
    assert {"NODE_NAME", "PLUGIN_DIR", "CDI_SPEC_DIR"} <= {name for name, _ in entries}
    for name, raw in entries:
        value: str | None = None
        if raw:
            template = TEMPLATE_VALUE.fullmatch(raw.strip())
            if template:
                refs = [_chart_value(values, r) for r in template["refs"].split()]
                value = (template["format"] % tuple(refs) if template["format"]
                         else str(refs[0]))
            elif not raw.strip().startswith("{{"):
                value = yaml.safe_load(raw)
        _check_daemonset_variable(str(path.relative_to(REPO_ROOT)), name, value)
