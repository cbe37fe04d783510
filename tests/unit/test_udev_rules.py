"""udev rule strings: accepted with the right matcher, refused with a message naming the rule,
the position and the offending token (through ``parse_details``, as the agent reports it)."""

from __future__ import annotations

import pytest

from discovery_handlers.contract import InvalidDetails
from discovery_handlers.udev import handler
from discovery_handlers.udev.rules import ACTION_KEYS, Key, Rule, parse_rule


def details_of(*rules: str) -> str:
    lines = "".join(f"  - {_yaml_quote(r)}\n" for r in rules)
    return f"udevRules:\n{lines}"


def _yaml_quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "\\0")
    return f'"{escaped}"'


def clauses(rule: Rule) -> list[tuple[str, str | None, str, str]]:
    own = [(m.key.value, m.name, "!=" if m.negate else "==", m.pattern.source) for m in rule.own]
    parents = [(m.key.value, m.name, "!=" if m.negate else "==", m.pattern.source)
               for group in rule.parent_groups for m in group]
    return own + parents


ACCEPTED = [
    ('KERNEL=="null"', [("KERNEL", None, "==", "null")]),
    ('SUBSYSTEM=="mem"', [("SUBSYSTEM", None, "==", "mem")]),
    ('KERNEL=="video[0-9]*"', [("KERNEL", None, "==", "video[0-9]*")]),
    ('KERNEL!="ttyS*"', [("KERNEL", None, "!=", "ttyS*")]),
    ('ATTR{idVendor}=="0403"', [("ATTR", "idVendor", "==", "0403")]),
    ('ATTRS{idProduct}!="6001"', [("ATTRS", "idProduct", "!=", "6001")]),
    ('ENV{ID_V4L_CAPABILITIES}==":capture:"', [("ENV", "ID_V4L_CAPABILITIES", "==", ":capture:")]),
    ('DEVPATH=="/devices/virtual/mem/null"',
     [("DEVPATH", None, "==", "/devices/virtual/mem/null")]),
    ('DRIVER=="ftdi_sio"', [("DRIVER", None, "==", "ftdi_sio")]),
    ('DRIVERS=="usb"', [("DRIVERS", None, "==", "usb")]),
    ('KERNELS=="1-1*"', [("KERNELS", None, "==", "1-1*")]),
    ('SUBSYSTEMS=="usb"', [("SUBSYSTEMS", None, "==", "usb")]),
    ('TAG=="uaccess"', [("TAG", None, "==", "uaccess")]),
    ('TAGS=="seat"', [("TAGS", None, "==", "seat")]),
    ('KERNEL=="zero|full"', [("KERNEL", None, "==", "zero|full")]),
    ('SUBSYSTEM=="tty",KERNEL=="ttyUSB*"', [("SUBSYSTEM", None, "==", "tty"),
                                           ("KERNEL", None, "==", "ttyUSB*")]),
    ('  SUBSYSTEM=="tty" ,  ATTRS{idVendor}=="0403",  ', [("SUBSYSTEM", None, "==", "tty"),
                                                         ("ATTRS", "idVendor", "==", "0403")]),
    ('ENV{X}==""', [("ENV", "X", "==", "")]),
    ('ATTR{name}=="say \\"hi\\""', [("ATTR", "name", "==", 'say "hi"')]),
    ('ATTR{serial}=="A\\*B"', [("ATTR", "serial", "==", "A\\*B")]),
    ('KERNEL=="vidéo"', [("KERNEL", None, "==", "vidéo")]),
    ('ATTRS{power/control}=="auto"', [("ATTRS", "power/control", "==", "auto")]),
    # udev's line syntax: spaces around the operator, commas optional or repeated
    ('KERNEL == "random"', [("KERNEL", None, "==", "random")]),
    ('ATTR{x} != "y"', [("ATTR", "x", "!=", "y")]),
    ('KERNEL=="a" KERNEL=="b"', [("KERNEL", None, "==", "a"), ("KERNEL", None, "==", "b")]),
    ('KERNEL=="a"KERNEL=="b"', [("KERNEL", None, "==", "a"), ("KERNEL", None, "==", "b")]),
    ('KERNEL=="a",,KERNEL=="b"', [("KERNEL", None, "==", "a"), ("KERNEL", None, "==", "b")]),
    ('KERNEL=="a"\t,\nKERNEL=="b"', [("KERNEL", None, "==", "a"), ("KERNEL", None, "==", "b")]),
    (', KERNEL=="a"', [("KERNEL", None, "==", "a")]),
    ('ENV{a b}=="x"', [("ENV", "a b", "==", "x")]),
    # udev's e"..." strings: C escapes undone first
    ('KERNEL==e"tty\\x41"', [("KERNEL", None, "==", "ttyA")]),
    ('KERNEL==e"a\\tb\\\\c\\"d"', [("KERNEL", None, "==", 'a\tb\\c"d')]),
    ('KERNEL==e"\\101\\u00e9\\U0001F600\\s"', [("KERNEL", None, "==", "Aé\U0001F600 ")]),
    ('KERNEL==e"\\xff"', [("KERNEL", None, "==", "\udcff")]),
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED, ids=[a for a, _ in ACCEPTED])
def test_accepted_rule_compiles_to_its_clauses(text: str, expected: list[tuple[str, ...]]) -> None:
    assert clauses(parse_rule(text)) == expected
    parsed = handler.parse_details(details_of(text), {})
    assert clauses(parsed.rules[0]) == expected


def test_plural_keys_form_one_parent_group_and_singular_keys_stay_on_the_device() -> None:
    rule = parse_rule('SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", KERNELS=="1-1", KERNEL=="t*"')
    assert [m.key for m in rule.own] == [Key.SUBSYSTEM, Key.KERNEL]
    assert [[m.key for m in g] for g in rule.parent_groups] == [[Key.ATTRS, Key.KERNELS]]


# (rule, position, token, words the message must hold)
REFUSED = [
    ('ACTION=="add"', 1, "ACTION==\"add\"", "assigns or runs"),
    ('NAME=="x"', 1, 'NAME=="x"', "assigns or runs"),
    ('SYMLINK+="radio"', 1, 'SYMLINK+="radio"', "assigns or runs"),
    ('RUN+="/bin/sh"', 1, 'RUN+="/bin/sh"', "assigns or runs"),
    ('MODE="0666"', 1, 'MODE="0666"', "assigns or runs"),
    ('GOTO="end"', 1, 'GOTO="end"', "assigns or runs"),
    ('PROGRAM=="/bin/true"', 1, 'PROGRAM=="/bin/true"', "assigns or runs"),
    ('KERNEL=="x", OWNER="root"', 14, 'OWNER="root"', "assigns or runs"),
    ('KERNEL=="x", GROUP="dialout"', 14, 'GROUP="dialout"', "assigns or runs"),
    ('KERNEL=="x", LABEL="l"', 14, 'LABEL="l"', "assigns or runs"),
    ('KERNEL=="x", IMPORT{builtin}=="usb_id"', 14, "IMPORT{builtin}==\"us", "assigns or runs"),
    ('KERNEL=="x", TEST=="/sys"', 14, 'TEST=="/sys"', "assigns or runs"),
    ('KERNEL=="x", OPTIONS+="last_rule"', 14, 'OPTIONS+="last_rule"', "assigns or runs"),
    ('FOO=="bar"', 1, 'FOO=="bar"', "unknown or unsupported key FOO"),
    ('KERNEL="null"', 7, '="null"', "operator '=' assigns"),
    ('KERNEL+="null"', 7, '+="null"', "operator '+=' assigns"),
    ('KERNEL-="null"', 7, '-="null"', "operator '-=' assigns"),
    ('KERNEL:="null"', 7, ':="null"', "operator ':=' assigns"),
    ('ATTR{idVendor="0403"', 5, '{idVendor="0403"', "unbalanced '{'"),
    ('ATTR{idVendor}}=="0403"', 15, '}=="0403"', "unbalanced '}'"),
    ('ATTRidVendor}=="0403"', 1, 'ATTRidVendor}=="0403', "unknown or unsupported key"),
    ('ATTR=="0403"', 5, '=="0403"', "needs a name in braces"),
    ('ENV{}=="x"', 4, '{}=="x"', "bad ENV name"),
    ('KERNEL{x}=="null"', 7, '{x}=="null"', "takes no {name}"),
    ("KERNEL==null", 9, "null", "double-quoted"),
    ("KERNEL=='null'", 9, "'null'", "double-quoted"),
    ('KERNEL=="null', 9, '"null', "unterminated value"),
    ("", 1, "<empty>", "empty rule"),
    ("   ", 1, "<empty>", "empty rule"),
    ('KERNEL', 7, "<end of rule>", "expected '==' or '!='"),
    ('KERNEL=="[[:bogus:]]"', 9, '"[[:bogus:]]"', "unknown character class"),
    ('KERNEL=="a\x00b"', 11, "\\x00", "NUL"),
    ('KERNEL==e"\\q"', 9, 'e"\\q"', "bad escape in e\"...\": unknown escape"),
    ('KERNEL==e"\\x00"', 9, 'e"\\x00"', "is a NUL"),
    ('KERNEL==e"\\x4"', 9, 'e"\\x4"', "needs 2 digits"),
    ('ATTR{$kernel}=="x"', 5, '{$kernel}=="x"', "substitutions"),
    ('ATTRS{[usb/1-1]serial}=="x"', 6, '{[usb/1-1]serial}=="', "substitutions"),
    ('ATTR {x}=="y"', 5, " ", "needs a name in braces"),
    (" , ,", 1, "<empty>", "empty rule"),
]


@pytest.mark.parametrize(("text", "column", "token", "words"), REFUSED,
                         ids=[repr(r[0]) for r in REFUSED])
def test_refused_rule_names_index_position_and_token(
    text: str, column: int, token: str, words: str
) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(details_of('KERNEL=="null"', text), {})
    error = caught.value
    assert error.field == "udevRules[1]"
    assert f"at position {column} ({token!r})" in error.reason
    assert words in error.reason
    assert str(error).startswith("discoveryDetails.udevRules[1]: ")


def test_non_utf8_bytes_in_a_rule_are_refused_with_their_position() -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details('udevRules: ["KERNEL==\\"a\\uDC80\\""]', {})
    assert caught.value.field == "udevRules[0]"
    assert "at position 11: not UTF-8" in caught.value.reason


def test_non_utf8_details_bytes_are_refused() -> None:
    from discovery_handlers.udev.details import parse_details

    with pytest.raises(InvalidDetails, match=r"not UTF-8 text \(byte 21\)"):
        parse_details(b'udevRules: ["KERNEL==\xff\xfe"]')


def test_a_rule_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidDetails, match=r"udevRules\[0\]: must be a string, got dict"):
        handler.parse_details('udevRules:\n  - KERNEL: null\n', {})


def test_parse_details_never_imports_pyudev() -> None:
    import subprocess
    import sys

    code = ("import sys; from discovery_handlers.udev import handler; "
            "handler.parse_details('udevRules: [\\'KERNEL==\"null\"\\']', {}); "
            "print('pyudev' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("key", sorted(ACTION_KEYS))
@pytest.mark.parametrize("op", ["==", "!=", "=", "+=", "-=", ":="])
def test_every_udev_action_key_is_refused_with_any_operator(key: str, op: str) -> None:
    rule = f'SUBSYSTEM=="tty", {key}{op}"x"'
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(details_of(rule), {})
    assert caught.value.field == "udevRules[0]"
    assert caught.value.reason.startswith(f"at position 19 ('{key}{op}")
    assert f"{key} assigns or runs something" in caught.value.reason


def test_garbage_rules_are_refused_or_compiled_never_crash() -> None:
    import random

    from discovery_handlers.udev.rules import RuleError

    keys = ["KERNEL", "ATTRS{idVendor}", "ENV{X}", "SUBSYSTEMS", "TAG", "RUN", "ATTR{", "FOO"]
    ops = ["==", "!=", "=", "+=", ""]
    values = ["*", "?", "[", "]", "[!0-9]", "[[:digit:]]", "[[:nope:]]", "|", "\\", "\\\"",
              "x", "\x00", "\udc80", "é", " ", ",", "{", "}"]
    rng = random.Random(8)  # fixed: the same 3,000 rules every run
    outcomes = {"compiled": 0, "refused": 0}
    columns: list[int] = []
    for _ in range(3000):
        clauses = []
        for _ in range(rng.randint(1, 3)):
            value = "".join(rng.choice(values) for _ in range(rng.randint(0, 5)))
            clauses.append(f'{rng.choice(keys)}{rng.choice(ops)}"{value}"')
        text = rng.choice([", ", ",", " "]).join(clauses)
        if rng.random() < 0.3:  # drop or duplicate a character somewhere
            at = rng.randrange(len(text))
            text = text[:at] + (text[at] * 2 if rng.random() < 0.5 else "") + text[at + 1:]
        try:
            rule = parse_rule(text)
        except RuleError as exc:
            columns.append(exc.column)
            outcomes["refused"] += 1
            continue
        for match in (*rule.own, *(m for g in rule.parent_groups for m in g)):
            match.pattern.matches("x")  # compiled patterns evaluate
        outcomes["compiled"] += 1
    assert outcomes["refused"] > 100
    assert outcomes["compiled"] > 100
    assert min(columns) >= 1  # every refusal names a position in the rule
