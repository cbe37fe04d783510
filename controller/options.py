"""Command-line options declared on a settings dataclass's fields: one declaration per setting.

Why this exists: a setting declared as a field, again as an ``add_argument`` call and a third
time where the parsed arguments are copied into the dataclass drifts (a default changed in one
place). Here a field carries ``option(...)`` as its metadata: its flag, its help and any other
``add_argument`` keywords. ``add_options`` adds one argument per such field, with the field's
default as the argument's (so ``%(default)s`` in a help shows it), and ``option_values`` reads
the parsed arguments back by field name. A setting whose command line is more than one plain
flag says so on its field: ``extra`` flags added right after its own (``--standalone`` beside
``--peering-name``) and a ``finish`` that turns the parsed value, with the other arguments, into
the setting.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Final

_OPTION: Final = "command_line_option"

#: (the parsed value of the field's own flag, every parsed argument) -> the setting.
Finish = Callable[[Any, argparse.Namespace], Any]


@dataclass(frozen=True)
class Option:
    """A field's command-line form: its flag, its help, ``add_argument``'s other keywords."""

    flag: str
    help: str
    keywords: Mapping[str, Any]
    extra: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    finish: Finish | None = None


def option(flag: str, help: str, *, extra: tuple[tuple[str, Mapping[str, Any]], ...] = (),
           finish: Finish | None = None, **keywords: Any) -> dict[str, Any]:
    """A field's metadata: the option it is read from (``keywords`` go to ``add_argument``;
    a ``default`` among them replaces the field's for argparse)."""
    return {_OPTION: Option(flag, help, keywords, extra, finish)}


def _options(cls: type[Any]) -> list[tuple[str, Any, Option]]:
    """(field name, field default or None, option) of every field declared with ``option``."""
    return [(f.name, None if f.default is MISSING else f.default, f.metadata[_OPTION])
            for f in fields(cls) if _OPTION in f.metadata]


def add_options(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add to ``parser`` an argument per field of ``cls`` declared with ``option``, in field
    order, each storing under its field's name."""
    for name, default, declared in _options(cls):
        keywords = {"default": default, **declared.keywords}
        parser.add_argument(declared.flag, dest=name, help=declared.help, **keywords)
        for flag, extra in declared.extra:
            parser.add_argument(flag, **extra)


def option_values(cls: type[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``cls`` declared with ``option``, by name, as ``args`` gives them."""
    values = {}
    for name, _, declared in _options(cls):
        value = getattr(args, name)
        values[name] = declared.finish(value, args) if declared.finish else value
    return values
