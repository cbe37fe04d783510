"""udev's ``e"..."`` strings: C escapes undone as systemd's cunescape does (no flags), and the
escapes udev refuses (it drops the rule's line) refused with what is wrong."""

from __future__ import annotations

import pytest

from discovery_handlers.udev.escapes import EscapeError, c_unescape

UNESCAPED = [
    ("plain", "plain"),
    ("a\\tb\\nc\\rd", "a\tb\nc\rd"),
    ("\\a\\b\\f\\v", "\a\b\f\v"),
    ("\\\\ \\\" \\'", "\\ \" '"),
    ("x\\sy", "x y"),
    ("\\x41\\x7a", "Az"),
    ("\\101\\172", "Az"),
    ("\\u00e9", "é"),
    ("\\U0001F600", "\U0001F600"),
    ("\\xc3\\xa9", "é"),  # two bytes that form UTF-8
    ("\\xff", "\udcff"),  # a byte that does not: kept as sysfs values are read
    ("é*", "é*"),
]

REFUSED = [
    ("\\q", "unknown escape"),
    ("tail\\", "trailing backslash"),
    ("\\x4", "needs 2 digits"),
    ("\\xg1", "needs 2 digits"),
    ("\\x00", "NUL"),
    ("\\000", "NUL"),
    ("\\u0000", "NUL"),
    ("\\400", "above 255"),
    ("\\12", "needs 3 digits"),
    ("\\UFFFFFFFF", "not a valid character"),
    ("\\U0000D800", "not a valid character"),
    ("\\U0000FFFE", "not a valid character"),
]


@pytest.mark.parametrize(("text", "expected"), UNESCAPED, ids=[t for t, _ in UNESCAPED])
def test_escapes_are_undone(text: str, expected: str) -> None:
    assert c_unescape(text) == expected


@pytest.mark.parametrize(("text", "words"), REFUSED, ids=[t for t, _ in REFUSED])
def test_escapes_udev_refuses_are_refused(text: str, words: str) -> None:
    with pytest.raises(EscapeError, match=words):
        c_unescape(text)
