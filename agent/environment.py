"""How the agent's settings are read from the environment a DaemonSet gives it.

A setting read from a variable carries an ``EnvironmentVariable`` in its field's metadata (its
name, its default as ``edgeplug-agent --help`` shows it, its meaning, and how its value is read);
the helpers below make that metadata. The settings themselves: ``agent.settings``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

T = TypeVar("T")

_VARIABLE: Final = "environment_variable"


class SettingsError(ValueError):
    """The environment lacks or garbles a setting; the message names the variable."""


#: How a variable's value becomes its setting: (the variable's name, its value or None when
#: unset) -> the setting. Raises SettingsError naming the variable.
Reader = Callable[[str, str | None], Any]


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable the agent reads: its name, its default as ``--help`` shows it, its meaning."""

    name: str
    default: str
    meaning: str
    reader: Reader = field(repr=False, compare=False)

    def read(self, env: Mapping[str, str]) -> Any:
        return self.reader(self.name, env.get(self.name))


def _variable(name: str, default: str, meaning: str, reader: Reader) -> dict[str, Any]:
    """A field's metadata: the variable it is read from."""
    return {_VARIABLE: EnvironmentVariable(name, default, meaning, reader)}


def _converted(name: str, raw: str, convert: Callable[[str], T], what: str) -> T:
    try:
        return convert(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be {what}: {exc}") from exc


def positive(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{raw!r} is not a finite number above 0")
    return value


def required(name: str, meaning: str) -> dict[str, Any]:
    """Unset or blank: refused. Surrounding blanks are dropped."""
    def read(var: str, raw: str | None) -> str:
        value = (raw or "").strip()
        if not value:
            raise SettingsError(f"{var} is required ({meaning}); see edgeplug-agent --help")
        return value
    return _variable(name, "(required)", meaning, read)


def or_default(name: str, default: T, meaning: str, convert: Callable[[str], T], *,
               what: str = "", shown: str | None = None) -> dict[str, Any]:
    """Unset or empty: ``default``; else ``convert`` of the value (``what`` it must be)."""
    def read(var: str, raw: str | None) -> T:
        return _converted(var, raw, convert, what) if raw else default
    return _variable(name, str(default) if shown is None else shown, meaning, read)


def optional(name: str, unset: str, meaning: str, convert: Callable[[str], T], *,
             what: str = "") -> dict[str, Any]:
    """Unset or empty: None (``unset`` says what that means in ``--help``)."""
    def read(var: str, raw: str | None) -> T | None:
        return _converted(var, raw, convert, what) if raw else None
    return _variable(name, unset, meaning, read)


def path_unless_empty(name: str, default: Path, meaning: str) -> dict[str, Any]:
    """Unset: ``default``; empty: None (the feature off); else the path given."""
    def read(var: str, raw: str | None) -> Path | None:
        value = str(default) if raw is None else raw
        return Path(value) if value else None
    return _variable(name, str(default), meaning, read)


def switch(name: str, default: bool, meaning: str) -> dict[str, Any]:
    """``on``/``off`` (any case); only the word opposite to ``default`` changes it."""
    opposite = "off" if default else "on"

    def read(var: str, raw: str | None) -> bool:
        return (not default) if (raw or "").lower() == opposite else default
    return _variable(name, "on" if default else "off", meaning, read)


def variable_of(setting: Field[Any]) -> EnvironmentVariable:
    """The variable a settings field is read from."""
    found: EnvironmentVariable = setting.metadata[_VARIABLE]
    return found


def is_read_from_environment(setting: Field[Any]) -> bool:
    return _VARIABLE in setting.metadata


_DOC: Final = "doc"


def tuning(doc: str) -> dict[str, Any]:
    """A setting no variable sets (code and tests do): what it means."""
    return {_DOC: doc}


def doc_of(setting: Field[Any]) -> str:
    """What a setting means: its variable's meaning, or its tuning doc."""
    if _VARIABLE in setting.metadata:
        return variable_of(setting).meaning
    found: str = setting.metadata[_DOC]
    return found
