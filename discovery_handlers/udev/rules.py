"""Parse udev rule strings (udev(7) line syntax, match keys only) into ``Rule`` matchers. Pure.

``parse_rule`` returns a ``Rule`` (a conjunction of ``Match`` clauses) or raises ``RuleError``
naming the 1-based column and the offending token. The grammar accepted and refused:
docs/handlers/udev.md, "Rules" and "Where we differ from udev, on purpose".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from discovery_handlers.udev.escapes import EscapeError, c_unescape
from discovery_handlers.udev.patterns import Pattern, PatternError, compile_pattern


class Key(Enum):
    """The match keys a discovery rule may use (udev(7) names)."""

    ATTR = "ATTR"
    ATTRS = "ATTRS"
    DEVPATH = "DEVPATH"
    DRIVER = "DRIVER"
    DRIVERS = "DRIVERS"
    ENV = "ENV"
    KERNEL = "KERNEL"
    KERNELS = "KERNELS"
    SUBSYSTEM = "SUBSYSTEM"
    SUBSYSTEMS = "SUBSYSTEMS"
    TAG = "TAG"
    TAGS = "TAGS"

    @property
    def needs_name(self) -> bool:
        return self in (Key.ATTR, Key.ATTRS, Key.ENV)

    @property
    def on_parents(self) -> bool:
        """Plural keys search the device and its parents (all on one device, as udev does)."""
        return self in (Key.ATTRS, Key.DRIVERS, Key.KERNELS, Key.SUBSYSTEMS, Key.TAGS)


#: udev keys that assign, run or jump: never accepted in a discovery rule.
ACTION_KEYS = frozenset({
    "ACTION", "CONST", "GOTO", "GROUP", "IMPORT", "LABEL", "MODE", "NAME", "OPTIONS", "OWNER",
    "PROGRAM", "RESULT", "RUN", "SECLABEL", "SYMLINK", "SYSCTL", "TEST", "WAIT_FOR",
})

#: ``SUBSYSTEM=="subsystem"`` (or ``bus``, ``class``) matches any of the three, as in udev.
SUBSYSTEM_ALIASES = ("subsystem", "bus", "class")

#: Operators udev knows; only the first two match.
MATCH_OPERATORS = ("==", "!=")
ASSIGN_OPERATORS = (":=", "+=", "-=", "=")

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: udev's WHITESPACE: what may stand between clauses and around the operator.
WHITESPACE = " \t\n\r"


class RuleError(ValueError):
    """A rule string that cannot be used; ``column`` is 1-based, ``token`` the offending text."""

    def __init__(self, column: int, token: str, message: str) -> None:
        super().__init__(f"at position {column} ({token!r}): {message}")
        self.column = column
        self.token = token
        self.reason = message


@dataclass(frozen=True)
class Match:
    """One clause: ``key{name} op "value"``; ``pattern`` is the compiled value."""

    key: Key
    name: str | None
    negate: bool
    pattern: Pattern

    def __str__(self) -> str:
        name = f"{{{self.name}}}" if self.name is not None else ""
        op = "!=" if self.negate else "=="
        return f'{self.key.value}{name}{op}"{self.pattern.source}"'


@dataclass(frozen=True)
class Rule:
    """A conjunction of clauses. Clauses with plural keys (``on_parents``) must all hold on one
    device of the chain device → parents (udev's reading); the others on the device itself.
    ``parent_groups`` holds further such groups, each on a device of its own (the ``usb``
    shorthand needs two: the USB device and its interface); rule strings make at most one.
    ``anchor`` (the ``usb`` shorthand's): the DEVTYPE of the ancestor whose DEVPATH is the
    device's id, so the same port keeps its id when its node is renumbered."""

    own: tuple[Match, ...]
    parent_groups: tuple[tuple[Match, ...], ...] = ()
    anchor: str | None = None

    def __str__(self) -> str:
        clauses = [*self.own, *(m for group in self.parent_groups for m in group)]
        return ", ".join(str(m) for m in clauses)


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self, chars: str = WHITESPACE) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def token_at(self, pos: int) -> str:
        """A short excerpt starting at ``pos``, for messages."""
        match = re.match(r"\S{1,20}", self.text[pos:])
        return match.group(0) if match else self.text[pos:pos + 1] or "<end of rule>"

    def fail(self, message: str, pos: int | None = None) -> RuleError:
        at = self.pos if pos is None else pos
        return RuleError(at + 1, self.token_at(at) if at < len(self.text) else "<end of rule>",
                         message)


def parse_rule(text: str) -> Rule:
    """Parse one rule string; raise ``RuleError`` naming the first problem."""
    if "\x00" in text:
        raise RuleError(text.index("\x00") + 1, "\\x00", "NUL character in rule")
    scanner = _Scanner(text)
    own: list[Match] = []
    parents: list[Match] = []
    while True:
        scanner.skip(WHITESPACE + ",")  # udev: any commas and spaces between clauses
        if scanner.at_end():
            break
        match = _parse_clause(scanner)
        (parents if match.key.on_parents else own).append(match)
    if not own and not parents:
        raise RuleError(1, "<empty>", "empty rule: it would match every device; give at least "
                        'one match such as SUBSYSTEM=="tty"')
    return Rule(own=tuple(own), parent_groups=(tuple(parents),) if parents else ())


def _parse_clause(scanner: _Scanner) -> Match:
    start = scanner.pos
    key_match = _KEY.match(scanner.text, scanner.pos)
    if key_match is None:
        raise scanner.fail("expected a match key such as KERNEL, SUBSYSTEM or ATTRS{name}")
    word = key_match.group(0)
    try:
        key = Key(word)
    except ValueError:
        if word in ACTION_KEYS:
            raise scanner.fail(f"{word} assigns or runs something; discovery rules may only "
                               f"match ({_known_keys()})", start) from None
        raise scanner.fail(f"unknown or unsupported key {word} (supported: {_known_keys()})",
                           start) from None
    scanner.pos = key_match.end()
    name = _parse_name(scanner, key)
    scanner.skip()
    negate = _parse_operator(scanner, key)
    scanner.skip()
    value_pos = scanner.pos
    value = _parse_value(scanner)
    if value == "?*":  # udev reads KEY=="?*" as KEY!="" (for TAG: "no tag is empty")
        value, negate = "", not negate
    try:
        pattern = compile_pattern(value)
    except PatternError as exc:
        raise scanner.fail(f"bad pattern: {exc}", value_pos) from None
    if key is Key.SUBSYSTEM and value in SUBSYSTEM_ALIASES:
        pattern = Pattern(value, SUBSYSTEM_ALIASES, False)
    return Match(key=key, name=name, negate=negate, pattern=pattern)


def _parse_name(scanner: _Scanner, key: Key) -> str | None:
    text = scanner.text
    has_brace = scanner.pos < len(text) and text[scanner.pos] == "{"
    if not key.needs_name:
        if has_brace:
            raise scanner.fail(f"{key.value} takes no {{name}}")
        return None
    if not has_brace:
        raise scanner.fail(f"{key.value} needs a name in braces, e.g. {key.value}{{idVendor}}")
    open_pos = scanner.pos
    close = text.find("}", open_pos + 1)
    if close < 0:
        raise scanner.fail("unbalanced '{': no closing '}'", open_pos)
    name = text[open_pos + 1:close]
    if not name:
        raise scanner.fail(f"bad {key.value} name {name!r} (empty)", open_pos)
    if key is not Key.ENV and (name.startswith("[") or "%" in name or "$" in name):
        raise scanner.fail(f"{key.value}{{{name}}}: udev's substitutions in attribute names "
                           "(%, $, [subsystem/kernel]) are not supported in discovery rules",
                           open_pos)
    scanner.pos = close + 1
    return name


def _parse_operator(scanner: _Scanner, key: Key) -> bool:
    text = scanner.text
    for op in MATCH_OPERATORS:
        if text.startswith(op, scanner.pos):
            scanner.pos += len(op)
            return op == "!="
    for op in ASSIGN_OPERATORS:
        if text.startswith(op, scanner.pos):
            raise scanner.fail(f"operator {op!r} assigns; discovery rules only match "
                               "('==' or '!=')")
    if scanner.pos < len(text) and text[scanner.pos] == "}":
        raise scanner.fail("unbalanced '}'")
    raise scanner.fail(f"expected '==' or '!=' after {key.value}")


def _parse_value(scanner: _Scanner) -> str:
    text = scanner.text
    start = scanner.pos
    escaped = text.startswith('e"', start)
    quote_pos = scanner.pos + escaped
    if quote_pos >= len(text) or text[quote_pos] != '"':
        raise scanner.fail('values must be double-quoted, e.g. KERNEL=="ttyUSB*"')
    out: list[str] = []
    pos = quote_pos + 1
    while pos < len(text):
        char = text[pos]
        if char == "\\" and pos + 1 < len(text) and (escaped or text[pos + 1] == '"'):
            out.append(text[pos:pos + 2] if escaped else '"')
            pos += 2
            continue
        if char == '"':
            scanner.pos = pos + 1
            if not escaped:
                return "".join(out)
            try:
                return c_unescape("".join(out))
            except EscapeError as exc:
                raise scanner.fail(f"bad escape in e\"...\": {exc}", start) from None
        out.append(char)
        pos += 1
    raise scanner.fail("unterminated value: no closing '\"'", quote_pos)


def _known_keys() -> str:
    return ", ".join(k.value + ("{name}" if k.needs_name else "") for k in Key)
