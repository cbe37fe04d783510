"""C-style unescaping of udev's ``e"..."`` rule strings, as udev reads them. Pure: no I/O.

``c_unescape`` returns the value or raises ``EscapeError`` on an escape udev refuses
(docs/handlers/udev.md, "Rules" and "Inside the handler").
"""

from __future__ import annotations

_SIMPLE = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34,
           "'": 39, "s": 32}
_HEX = "0123456789abcdefABCDEF"
_OCT = "01234567"


class EscapeError(ValueError):
    """An escape udev would refuse (the message names it)."""


def c_unescape(text: str) -> str:
    """``text`` with its C escapes undone; raises ``EscapeError`` on one udev refuses."""
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out += char.encode("utf-8", errors="surrogateescape")
            i += 1
            continue
        if i + 1 >= len(text):
            raise EscapeError("a trailing backslash")
        kind = text[i + 1]
        if kind in _SIMPLE:
            out.append(_SIMPLE[kind])
            i += 2
        elif kind == "x":
            out.append(_number(text, i, i + 2, 2, _HEX, 16))
            i += 4
        elif kind in _OCT:
            value = _number(text, i, i + 1, 3, _OCT, 8)
            if value > 255:
                raise EscapeError(f"{text[i:i + 4]!r} is above 255")
            out.append(value)
            i += 4
        elif kind in "uU":
            width = 4 if kind == "u" else 8
            point = _number(text, i, i + 2, width, _HEX, 16)
            if kind == "U" and not _valid_unichar(point):
                raise EscapeError(f"{text[i:i + 2 + width]!r} is not a valid character")
            out += chr(point).encode("utf-8", errors="surrogatepass")
            i += 2 + width
        else:
            raise EscapeError(f"unknown escape {text[i:i + 2]!r}")
    return out.decode("utf-8", errors="surrogateescape")


def _number(text: str, start: int, first: int, width: int, digits: str, base: int) -> int:
    chunk = text[first:first + width]
    if len(chunk) < width or any(c not in digits for c in chunk):
        raise EscapeError(f"{text[start:first + width]!r} needs {width} digits")
    value = int(chunk, base)
    if value == 0:
        raise EscapeError(f"{text[start:first + width]!r} is a NUL")
    return value


def _valid_unichar(point: int) -> bool:
    return (point < 0x110000 and (point & 0xFFFFF800) != 0xD800
            and not 0xFDD0 <= point <= 0xFDEF and (point & 0xFFFE) != 0xFFFE)
