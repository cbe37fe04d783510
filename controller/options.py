"""Settings declared once, on the fields of grouped dataclasses: their doc, default and flag.

A field's metadata is ``option(...)`` (a flag, its help; ``extra`` flags and a ``finish`` for a
setting that is more than one plain flag) or ``tuning(...)`` (documented, no flag); a field
holding a settings dataclass is a group. ``add_options`` makes the flags, ``settings_from`` the
tree from the parsed arguments, ``reference`` the table of docs/controller-settings.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any, Final

_SETTING: Final = "setting"

#: (the parsed value of the field's own flag, every parsed argument) -> the setting.
Finish = Callable[[Any, argparse.Namespace], Any]


@dataclass(frozen=True)
class Option:
    """A field's doc and, unless ``flag`` is empty, its command-line form."""

    flag: str
    help: str
    keywords: Mapping[str, Any]
    extra: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    finish: Finish | None = None


def option(flag: str, help: str, *, extra: tuple[tuple[str, Mapping[str, Any]], ...] = (),
           finish: Finish | None = None, **keywords: Any) -> dict[str, Any]:
    """A field's metadata: the flag it is read from (``keywords`` go to ``add_argument``;
    a ``default`` among them replaces the field's for argparse)."""
    return {_SETTING: Option(flag, help, keywords, extra, finish)}


def tuning(help: str) -> dict[str, Any]:
    """A field's metadata: a documented setting with no flag (code and tests set it)."""
    return {_SETTING: Option("", help, {})}


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    return None


def _is_group(f: Field[Any]) -> bool:
    return _SETTING not in f.metadata and f.default_factory is not MISSING and is_dataclass(
        f.default_factory)


def walk(cls: type[Any], prefix: str = "") -> Iterator[tuple[str, Field[Any], Option]]:
    """(dotted path, field, option) of every setting of the tree under ``cls``, in order."""
    for f in fields(cls):
        if _is_group(f):
            yield from walk(f.default_factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        elif _SETTING in f.metadata:
            yield f"{prefix}{f.name}", f, f.metadata[_SETTING]


def add_options(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add to ``parser`` an argument per flagged setting of the tree under ``cls``, in field
    order, each storing under its dotted path; a group's flags under its docstring's title."""
    _add(parser, cls, "")


def _add(parser: argparse.ArgumentParser, cls: type[Any], prefix: str,
         into: argparse._ActionsContainer | None = None) -> None:
    target = into or parser
    for f in fields(cls):
        if _is_group(f):
            group: type[Any] = f.default_factory  # type: ignore[assignment]
            about = (group.__doc__ or "").strip().replace("``", "")
            _add(parser, group, f"{prefix}{f.name}.",
                 parser.add_argument_group(f"{prefix}{f.name}", about))
            continue
        declared = f.metadata.get(_SETTING)
        if declared is None or not declared.flag:
            continue
        keywords = {"default": _default(f), **declared.keywords}
        target.add_argument(declared.flag, dest=f"{prefix}{f.name}", help=declared.help,
                            **keywords)
        for flag, extra in declared.extra:
            target.add_argument(flag, **extra)


def settings_from(cls: type[Any], args: argparse.Namespace, prefix: str = "") -> Any:
    """The tree under ``cls``: flagged settings as ``args`` gives them, the rest defaults."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        if _is_group(f):
            values[f.name] = settings_from(f.default_factory, args,  # type: ignore[arg-type]
                                           f"{prefix}{f.name}.")
        elif _SETTING in f.metadata and f.metadata[_SETTING].flag:
            declared = f.metadata[_SETTING]
            value = getattr(args, f"{prefix}{f.name}")
            values[f.name] = declared.finish(value, args) if declared.finish else value
    return cls(**values)


def flags(cls: type[Any]) -> set[str]:
    """Every flag the tree under ``cls`` declares, extras included."""
    found = set()
    for _, _, declared in walk(cls):
        if declared.flag:
            found.add(declared.flag)
            found.update(flag for flag, _ in declared.extra)
    return found


def reference(cls: type[Any]) -> str:
    """A Markdown table of every setting of the tree under ``cls``: path, flag, default, doc."""
    rows = ["| setting | flag | default | what it is |", "| --- | --- | --- | --- |"]
    for path, f, declared in walk(cls):
        default = "(computed)" if f.default is MISSING else repr(f.default)
        flag = " ".join(f"`{x}`" for x in (declared.flag, *(e for e, _ in declared.extra)) if x)
        text = declared.help.replace(" (default: %(default)s)", "").replace("|", "\\|")
        rows.append(f"| `{path}` | {flag or '-'} | `{default}` | {text} |")
    return "\n".join(rows) + "\n"
