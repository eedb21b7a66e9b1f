"""A JSON object's top-level ``"model"`` string, found without building the document.

``json.loads`` of a 100 MB body of small numbers takes seconds and holds the GIL all
along, in a worker thread or not: every other request waits. This scanner reads the
top level only (each member's key, and the value of a ``"model"`` key) and skips every
other value by its brackets and strings, jumping with regular expressions and
``bytes`` methods that run in C over one window (`WINDOW` bytes, about a millisecond)
at a time: run in a worker thread, it gives the GIL back between windows, so the event
loop keeps answering while it runs.

For a valid document the answer is ``json.loads(body).get("model")`` when that is a
string, else "" (the last of duplicate keys wins, as there). Checked on the way: the
body is UTF-8 (the byte offset of the first bad byte otherwise), no BOM, and the top
level's own punctuation; the inside of skipped values is not validated (the child
parses the body itself and answers its errors). Errors raise `BadBody`.
"""

from __future__ import annotations

import codecs
import json
import re

__all__ = ["MAX_MODEL_BYTES", "WINDOW", "BadBody", "check_utf8", "scan_model"]

WINDOW = 128 << 10  # bytes one C call looks at (a millisecond or a few)
MAX_MODEL_BYTES = 64 << 10  # a longer "model" string is refused (no model is named so)
# Deeper nesting is refused, as json.loads refuses it (its recursion limit); counted
# where the scan steps in, so up to `_NESTED` more levels skipped in C may pass.
MAX_DEPTH = 1000
_KEY_MAX = len(r'"\u006d\u006f\u0064\u0065\u006c"')  # the longest spelling of "model"

_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")
_WS = re.compile(rb"[ \t\n\r]*+")
# A string's inside: runs of plain bytes and escape pairs, up to its closing quote.
_STRING_INSIDE = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)
_NESTED = 32  # containers this deep inside the one being skipped are skipped in C


def _balanced(depth: int) -> bytes:
    """Plain bytes, whole strings and whole containers up to ``depth`` deep."""
    inner = rb"|[\[{]" + _balanced(depth - 1) + rb"[\]}]" if depth else b""
    return rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+"' + inner + rb")*+"


# Inside a container: anything that leaves the depth as it was.
_FLAT = re.compile(_balanced(_NESTED), re.DOTALL)
_SCALAR = re.compile(rb'[^,}\] \t\n\r"\[{]*+')  # a number, true, false, null


class BadBody(Exception):
    """The body cannot be read: a 400 with this message."""


def _invalid(message: str, pos: int) -> BadBody:
    return BadBody(f"invalid JSON in request body: {message} (byte {pos})")


def check_utf8(body: bytes) -> None:
    """Raise `BadBody` unless ``body`` is UTF-8 (decoded a window at a time)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    size = len(body)
    for start in range(0, size, WINDOW):
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the last window
        try:
            decoder.decode(view[start : start + WINDOW], start + WINDOW >= size)
        except UnicodeDecodeError as exc:
            byte = start - pending + exc.start
            raise BadBody(f"request body is not valid UTF-8 (byte {byte})") from None


def _run(pattern: re.Pattern[bytes], buf: bytes, pos: int) -> int:
    """Past ``pattern``'s match at ``pos`` (a possessive run), a window at a time."""
    size = len(buf)
    while True:
        end = min(pos + WINDOW, size)
        match = pattern.match(buf, pos, end)
        pos = match.end() if match is not None else pos
        if pos < end or end == size:
            return pos


def _string_end(buf: bytes, pos: int) -> int:
    """Just past the closing quote of the string whose inside starts at ``pos``."""
    size = len(buf)
    start = pos - 1
    while True:
        match = _STRING_INSIDE.match(buf, pos, min(pos + WINDOW + 1, size))  # an escape fits
        end = match.end() if match is not None else pos
        if end < size and buf[end] == _QUOTE:
            return end + 1
        if end >= size or (end == pos and buf[end] == _BACKSLASH and end == size - 1):
            raise _invalid("unterminated string", start)
        pos = end  # a window's end (maybe between a backslash and what it escapes)


def _container_end(buf: bytes, pos: int, outer: int) -> int:
    """Just past the array or object that opens at ``pos``, ``outer`` levels deep."""
    size = len(buf)
    start, depth = pos, 1
    pos += 1
    limit = MAX_DEPTH - outer
    while True:
        end = min(pos + WINDOW, size)
        match = _FLAT.match(buf, pos, end)
        pos = match.end() if match is not None else pos
        if pos >= size:
            raise _invalid("unterminated array or object", start)
        char = buf[pos]
        if char in _OPEN:
            depth += 1
            pos += 1
            if depth > limit:
                raise BadBody("invalid JSON in request body: nested too deeply")
        elif char in _CLOSE:
            depth -= 1
            pos += 1
            if depth == 0:
                return pos
        elif char == _QUOTE:
            pos = _string_end(buf, pos + 1)
        # else: a window's end


def _text(raw: bytes, pos: int) -> str:
    """A JSON string (with its quotes), decoded as ``json.loads`` does."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _invalid(str(exc), pos) from None
    assert isinstance(value, str)
    return value


def _is_model_key(buf: bytes, start: int, end: int) -> bool:
    """Whether the key string ``buf[start:end]`` (quotes included) is ``"model"``."""
    if end - start > _KEY_MAX:
        return False
    raw = buf[start:end]
    if raw == b'"model"':
        return True
    return _BACKSLASH in raw and _text(raw, start) == "model"


def _expect_end(buf: bytes, pos: int) -> None:
    if _run(_WS, buf, pos) < len(buf):
        raise _invalid("Extra data", pos)


def scan_model(buf: bytes) -> str:
    """The top-level ``"model"`` string of the JSON document ``buf`` (UTF-8, checked
    apart by `check_utf8`); "" when there is none, or it is not a string, or the
    document is not an object."""
    if buf.startswith(codecs.BOM_UTF8):
        raise BadBody("invalid JSON in request body: Unexpected UTF-8 BOM (decode using utf-8-sig)")
    size = len(buf)
    pos = _run(_WS, buf, 0)
    if pos >= size:
        raise _invalid("Expecting value", pos)
    if buf[pos] != ord("{"):
        if buf[pos] in _OPEN:  # an array names no model; checked for its depth
            _expect_end(buf, _container_end(buf, pos, 0))
        return ""  # a scalar names none either
    span: tuple[int, int] | None = None  # the last "model" value, when a string
    pos = _run(_WS, buf, pos + 1)
    if pos < size and buf[pos] == ord("}"):
        pos += 1
    else:
        while True:
            if pos >= size or buf[pos] != _QUOTE:
                raise _invalid("Expecting property name enclosed in double quotes", pos)
            key_end = _string_end(buf, pos + 1)
            is_model = _is_model_key(buf, pos, key_end)
            pos = _run(_WS, buf, key_end)
            if pos >= size or buf[pos] != ord(":"):
                raise _invalid("Expecting ':' delimiter", pos)
            pos = _run(_WS, buf, pos + 1)
            if pos >= size:
                raise _invalid("Expecting value", pos)
            char, start = buf[pos], pos
            if char == _QUOTE:
                pos = _string_end(buf, pos + 1)
            elif char in _OPEN:
                pos = _container_end(buf, pos, 1)
            else:
                pos = _run(_SCALAR, buf, pos)
                if pos == start:
                    raise _invalid("Expecting value", pos)
            if is_model:
                span = (start, pos) if char == _QUOTE else None
            pos = _run(_WS, buf, pos)
            if pos < size and buf[pos] == ord(","):
                pos = _run(_WS, buf, pos + 1)
                continue
            if pos < size and buf[pos] == ord("}"):
                pos += 1
                break
            raise _invalid("Expecting ',' delimiter", pos)
    _expect_end(buf, pos)
    if span is None:
        return ""
    start, end = span
    if end - start > MAX_MODEL_BYTES:
        raise BadBody(f"the model field is longer than {MAX_MODEL_BYTES} bytes")
    return _text(buf[start:end], start)
