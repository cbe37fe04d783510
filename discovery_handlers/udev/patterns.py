"""udev's value patterns (udev(7)): shell globs with ``|`` alternatives, compiled to regexes.

Why this exists: udev matches rule values with fnmatch(3) (no flags: ``*`` also matches ``/``,
a backslash escapes the next character) after splitting them on ``|``; Python's ``fnmatch``
differs (no backslash escapes, no ``[[:class:]]``), so the translation is ours. Pure: no I/O.
An unterminated ``[`` is a literal ``[``, as in fnmatch(3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: POSIX bracket classes fnmatch(3) knows, as regex character-set fragments.
_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r\\f\\v", "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}
_MAX_PATTERN = 4096


class PatternError(ValueError):
    """A value udev could not use either (too long, unknown ``[[:class:]]``)."""


@dataclass(frozen=True)
class Pattern:
    """A compiled value; ``source`` is the text as written in the rule."""

    source: str
    regex: re.Pattern[str] = field(compare=False, repr=False)

    def matches(self, value: str) -> bool:
        return self.regex.fullmatch(value) is not None


def compile_pattern(source: str) -> Pattern:
    """Compile a rule value; ``|`` separates alternatives, each an fnmatch(3) glob."""
    if len(source) > _MAX_PATTERN:
        raise PatternError(f"longer than {_MAX_PATTERN} characters")
    alternatives = [_glob_to_regex(alt) for alt in _split_alternatives(source)]
    return Pattern(source=source, regex=re.compile("|".join(f"(?:{a})" for a in alternatives),
                                                   re.DOTALL))


def escape_glob(text: str) -> str:
    """``text`` as a pattern that matches exactly it (for values taken literally)."""
    return re.sub(r"([*?\[\]|\\])", r"\\\1", text)


def has_glob(source: str) -> bool:
    """True when the value uses any pattern syntax (so libudev's own filters cannot take it)."""
    return any(c in source for c in "*?[|\\")


def _split_alternatives(source: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(source):
        char = source[i]
        if char == "\\" and i + 1 < len(source):
            current.append(source[i:i + 2])
            i += 2
            continue
        if char == "|":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def _glob_to_regex(glob: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "\\":
            if i + 1 < len(glob):
                out.append(re.escape(glob[i + 1]))
                i += 2
            else:
                out.append(re.escape("\\"))
                i += 1
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
        if (i + 2 < len(glob) and glob[i + 1] == "-" and glob[i + 2] != "]"):
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
