"""The INI grammar of llama.cpp presets (``parse_ini_from_file`` in common/preset.cpp).

Upstream parses with a PEG (no backtracking); the same grammar here, one line at a
time, with possessive regular expressions::

    newline      ::= "\\r\\n" / "\\n" / "\\r"
    ws           ::= [ \\t]*
    comment      ::= [;#] (!newline .)*
    eol          ::= ws comment? (newline / EOF)
    ident        ::= [a-zA-Z_] [a-zA-Z0-9_.-]*
    value        ::= (!(ws ([;#] / newline / EOF)) .)*
    header-line  ::= "[" ws [^\\]]+ ws "]" eol
    kv-line      ::= ident ws "=" ws value eol
    comment-line ::= ws comment (newline / EOF)
    blank-line   ::= ws (newline / EOF)
    ini          ::= (header-line / kv-line / comment-line / blank-line)* EOF

Consequences worth knowing: a key or ``[`` must start its line (leading
whitespace is an error); a section name keeps any space before ``]`` and may even
span lines; a value ends before ``;``/``#`` and drops trailing blanks; quotes are
literal; any invalid UTF-8 fails the whole file. Semantics: keys before any section
belong to ``default``; a repeated section header clears that section; a repeated
key keeps the last value.
"""

from __future__ import annotations

import re
from pathlib import Path

from troupe.catalog.values import byte_order
from troupe.errors import ConfigError

__all__ = [
    "DEFAULT_SECTION",
    "PresetParseError",
    "parse_ini",
    "read_ini_file",
    "render_ini",
    "sorted_sections",
]

DEFAULT_SECTION = "default"

_WS = r"[ \t]*+"
_NEWLINE = r"(?:\r\n|\n|\r)"
_COMMENT = r"[;#][^\r\n]*+"
_EOL = rf"{_WS}(?:{_COMMENT})?+(?:{_NEWLINE}|\Z)"
_VALUE = rf"(?:(?!{_WS}(?:[;#]|[\r\n]|\Z)).)*+"
_HEADER = re.compile(rf"\[{_WS}(?P<section>[^\]]++){_WS}\]{_EOL}", re.DOTALL)
_KV = re.compile(
    rf"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*+){_WS}={_WS}(?P<value>{_VALUE}){_EOL}", re.DOTALL
)
_COMMENT_LINE = re.compile(rf"{_WS}{_COMMENT}(?:{_NEWLINE}|\Z)")
_BLANK_LINE = re.compile(rf"{_WS}(?:{_NEWLINE}|\Z)")
_LINE_BREAK = re.compile(_NEWLINE)


class PresetParseError(ConfigError):
    """A preset file that does not follow the grammar; ``line`` is 1-based."""

    def __init__(self, source: str, line: int, detail: str) -> None:
        # Upstream's whole message is the part before the parenthesis.
        super().__init__(f"failed to parse server config file: {source} (line {line}: {detail})")
        self.source = source
        self.line = line


def _line_of(text: str, pos: int) -> int:
    return len(_LINE_BREAK.findall(text, 0, pos)) + 1


def _describe(text: str, pos: int) -> str:
    line = _LINE_BREAK.split(text[pos:], maxsplit=1)[0]
    shown = line if len(line) <= 60 else line[:57] + "..."
    if line[:1] in (" ", "\t") and line.strip(" \t")[:1] not in ("", ";", "#"):
        why = "keys and section headers may not be indented"
    elif re.match(r"\[[ \t]*(\]|$)", line):
        why = "a section header needs a name"
    elif line.startswith("[") and "]" in line:
        why = "only a comment may follow a section header"
    elif line.startswith("["):
        why = "a section header needs a closing ']'"
    else:
        why = "expected '[section]', 'key = value', a comment or a blank line"
    return f"{shown!r}: {why}"


def parse_ini(text: str, source: str = "<string>") -> dict[str, dict[str, str]]:
    """Sections -> keys -> raw values, exactly as upstream's parser fills its map.

    The dicts come in file order; upstream's ``std::map`` order is byte-wise, which
    callers get with `troupe.catalog.values.byte_order`.
    """
    parsed: dict[str, dict[str, str]] = {}
    section = DEFAULT_SECTION
    pos, end = 0, len(text)
    while pos < end:
        if m := _HEADER.match(text, pos):
            section = m.group("section")
            parsed[section] = {}  # a repeated header clears the section
        elif m := _KV.match(text, pos):
            parsed.setdefault(section, {})[m.group("key")] = m.group("value")
        elif not (m := _COMMENT_LINE.match(text, pos) or _BLANK_LINE.match(text, pos)):
            raise PresetParseError(source, _line_of(text, pos), _describe(text, pos))
        pos = m.end()
    return parsed


def read_ini_file(path: Path, shown: str | None = None) -> dict[str, dict[str, str]]:
    """Read and parse a preset file; ``shown`` is the name used in messages."""
    name = str(path) if shown is None else shown
    if not path.exists():
        raise ConfigError(f"preset file does not exist: {name}")
    try:
        data = path.read_bytes()
    except OSError:
        raise ConfigError(f"failed to open server preset file: {name}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        good = data[: exc.start].decode("utf-8")
        raise PresetParseError(name, _line_of(good, len(good)), "invalid UTF-8") from None
    return parse_ini(text, name)


def render_ini(name: str, items: list[tuple[str, str]]) -> str:
    """``common_preset::to_ini``: a header, ``key = value`` lines, a blank line.

    A newline inside a value is written as a backslash and a newline.
    """
    out = [f"[{name}]\n"]
    out.extend(f"{key} = {value.replace(chr(10), chr(92) + chr(10))}\n" for key, value in items)
    out.append("\n")
    return "".join(out)


def sorted_sections(parsed: dict[str, dict[str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Sections and their keys in upstream's iteration order (byte-wise, both levels)."""
    return [
        (name, sorted(keys.items(), key=lambda kv: byte_order(kv[0])))
        for name, keys in sorted(parsed.items(), key=lambda s: byte_order(s[0]))
    ]
