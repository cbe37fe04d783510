"""udev's value patterns (udev(7)), matched as systemd-udevd matches them. Pure: no I/O.

``compile_pattern`` turns a rule value into a matcher (alternatives on ``|``, plain strings,
fnmatch globs in the C locale). udev's reading, which this follows: docs/handlers/udev.md, "Rules".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: Characters that make a value a glob (systemd's GLOB_CHARS); ``|`` and ``\\`` do not.
GLOB_CHARS = "*?["
#: POSIX bracket classes in the C locale, as regex character-set fragments.
_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r\\f\\v", "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}
_MAX_PATTERN = 4096
_NEVER = "(?!)"


class PatternError(ValueError):
    """A value refused on purpose (too long, unknown ``[[:class:]]``)."""


@dataclass(frozen=True)
class Pattern:
    """A compiled value; ``source`` is the value as udev sees it (quotes and escapes resolved).
    ``alternatives`` are the non-empty ones; ``with_empty`` when the empty string matches too;
    ``regex`` (globs only) runs over the UTF-8 bytes of the value, one character per byte."""

    source: str
    alternatives: tuple[str, ...]
    with_empty: bool
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, value: str) -> bool:
        if not value and self.with_empty:
            return True
        if self.regex is None:
            return value in self.alternatives
        return self.regex.fullmatch(as_bytes_text(value)) is not None


def as_bytes_text(text: str) -> str:
    """``text``'s UTF-8 bytes, one character each (undecodable bytes kept as they came)."""
    return text.encode("utf-8", errors="surrogateescape").decode("latin-1")


def compile_pattern(source: str) -> Pattern:
    """Compile a rule value as udev does (see the module docstring)."""
    if len(source) > _MAX_PATTERN:
        raise PatternError(f"longer than {_MAX_PATTERN} characters")
    parts = source.split("|")
    alternatives = tuple(p for p in parts if p)
    with_empty = len(alternatives) < len(parts)
    if not any(c in source for c in GLOB_CHARS):
        return Pattern(source, alternatives, with_empty)
    regexes = [_glob_to_regex(as_bytes_text(alt)) for alt in alternatives]
    body = "|".join(f"(?:{r})" for r in regexes) or _NEVER
    return Pattern(source, alternatives, with_empty, re.compile(body, re.DOTALL))


def literal_pattern(text: str) -> Pattern:
    """A pattern that matches exactly ``text`` (values the handler builds, never split)."""
    return Pattern(text, (text,) if text else (), not text)


def enumerator_safe(source: str) -> bool:
    """True when libudev's enumeration filters (one fnmatch(3) glob, no alternatives, in the
    process's locale) select exactly what udev's rules match for this value: not empty, ASCII,
    no ``|``, no backslash."""
    return bool(source) and source.isascii() and not any(c in source for c in "|\\")


def _glob_to_regex(glob: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "\\":
            if i + 1 >= len(glob):
                return _NEVER  # fnmatch(3): a trailing backslash never matches
            out.append(re.escape(glob[i + 1]))
            i += 2
        elif char == "*":
            out.append(".*")
            i += 1
        elif char == "?":
            out.append(".")
            i += 1
        elif char == "[":
            bracket = _bracket(glob, i)
            if bracket is None:
                out.append(re.escape("["))
                i += 1
            else:
                regex, i = bracket
                out.append(regex)
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def _bracket(glob: str, start: int) -> tuple[str, int] | None:
    """The regex for the bracket expression at ``start`` and the index after it, or None when
    the bracket is unterminated (then it is a literal ``[``)."""
    i = start + 1
    negate = i < len(glob) and glob[i] in "!^"
    if negate:
        i += 1
    items: list[str] = []
    first = True
    while i < len(glob):
        char = glob[i]
        if char == "]" and not first:
            if not items:  # only reversed ranges: nothing (negated: anything)
                return ("." if negate else _NEVER), i + 1
            body = "".join(items)
            return (f"[^{body}]" if negate else f"[{body}]"), i + 1
        first = False
        if char == "[" and glob.startswith("[:", i):
            end = glob.find(":]", i + 2)
            if end < 0:
                return None
            name = glob[i + 2:end]
            if name not in _CLASSES:
                raise PatternError(f"unknown character class [:{name}:]")
            items.append(_CLASSES[name])
            i = end + 2
            continue
        if char == "\\" and i + 1 < len(glob):
            char = glob[i + 1]
            i += 1
        if i + 2 < len(glob) and glob[i + 1] == "-" and glob[i + 2] != "]":
            low, high = char, glob[i + 2]
            if high == "\\" and i + 3 < len(glob):
                high = glob[i + 3]
                i += 1
            if ord(low) <= ord(high):
                items.append(f"{re.escape(low)}-{re.escape(high)}")
            i += 3
            continue
        items.append(re.escape(char))
        i += 1
    return None
