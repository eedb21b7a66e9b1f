"""The INI grammar of llama.cpp presets (common/preset.cpp parse_ini_from_file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troupe.catalog.ini import PresetParseError, parse_ini, read_ini_file, render_ini
from troupe.errors import ConfigError


@pytest.mark.parametrize("nl", ["\n", "\r\n", "\r"])
def test_line_endings(nl: str) -> None:
    text = nl.join(["[a]", "x = 1", "y=2", "", "[b]", "z = 3"]) + nl
    assert parse_ini(text) == {"a": {"x": "1", "y": "2"}, "b": {"z": "3"}}


def test_mixed_line_endings_and_no_final_newline() -> None:
    assert parse_ini("[a]\r\nx = 1\ry = 2\nz = 3") == {"a": {"x": "1", "y": "2", "z": "3"}}


def test_values_end_before_comments_and_trailing_blanks() -> None:
    text = (
        "[s]\n"
        "a = one two  \n"
        "b = v;comment\n"
        "c = v # comment\n"
        'd = "quoted ; not" \n'
        "e =\n"
        "f = \t\n"
        "g=x=y\n"
        "h = a\tb\n"
    )
    assert parse_ini(text)["s"] == {
        "a": "one two",
        "b": "v",
        "c": "v",
        "d": '"quoted',
        "e": "",
        "f": "",
        "g": "x=y",
        "h": "a\tb",
    }


def test_comments_and_blank_lines() -> None:
    text = "; top\n# hash\n   ; indented comment\n\t\n[a] ; after header\nk = v\n"
    assert parse_ini(text) == {"a": {"k": "v"}}


def test_keys_before_any_section_go_to_default() -> None:
    assert parse_ini("version = 1\nk = v\n[a]\nx = 1\n") == {
        "default": {"version": "1", "k": "v"},
        "a": {"x": "1"},
    }


def test_explicit_default_header_clears_keys_before_it() -> None:
    assert parse_ini("k = v\n[default]\nx = 1\n") == {"default": {"x": "1"}}


def test_repeated_section_clears_and_repeated_key_wins() -> None:
    text = "[a]\nx = 1\ny = 2\n[b]\nz = 3\n[a]\nx = 4\nx = 5\n"
    assert parse_ini(text) == {"a": {"x": "5"}, "b": {"z": "3"}}


def test_section_names_keep_inner_and_trailing_blanks() -> None:
    parsed = parse_ini("[ org/repo:q4 ]\nk = v\n[*]\n[a b]\n")
    assert list(parsed) == ["org/repo:q4 ", "*", "a b"]
    assert parsed["*"] == {}


def test_section_name_may_span_lines() -> None:
    assert parse_ini("[a\nb]\nk = v\n") == {"a\nb": {"k": "v"}}


def test_key_characters() -> None:
    assert parse_ini("_a.b-C9 = 1\nLLAMA_ARG_X = 2\n") == {
        "default": {"_a.b-C9": "1", "LLAMA_ARG_X": "2"}
    }


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("[a]\n  k = v\n", 2, "may not be indented"),
        ("[a]\nk v\n", 2, "expected '[section]'"),
        ("\n\n[]\n", 3, "needs a name"),
        ("[  ]\n", 1, "needs a name"),
        ("[a] x\n", 1, "only a comment may follow"),
        ("[a\n", 1, "closing ']'"),
        ("9k = v\n", 1, "expected"),
        ("k\r\n= v\r\n", 1, "expected"),
        ("[a]\r\n\r\n= v\r\n", 3, "expected"),
        (" [a]\n", 1, "may not be indented"),
    ],
)
def test_parse_errors_name_file_and_line(text: str, line: int, why: str) -> None:
    with pytest.raises(PresetParseError) as info:
        parse_ini(text, "/etc/p.ini")
    msg = str(info.value)
    assert msg.startswith("failed to parse server config file: /etc/p.ini (line ")
    assert info.value.line == line
    assert why in msg
    assert "\n" not in msg
    assert isinstance(info.value, ConfigError)


def test_read_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^preset file does not exist: nope\.ini$"):
        read_ini_file(tmp_path / "nope.ini", "nope.ini")
    bad = tmp_path / "bad.ini"
    bad.write_bytes(b"[a]\nk = ok\nj = \xff\n")
    with pytest.raises(PresetParseError) as info:
        read_ini_file(bad)
    assert info.value.line == 3
    assert "invalid UTF-8" in str(info.value)


def test_read_file_keeps_utf8(tmp_path: Path) -> None:
    p = tmp_path / "p.ini"
    p.write_bytes("[modèle]\nalias = café\n".encode())
    assert read_ini_file(p) == {"modèle": {"alias": "café"}}


def test_bom_is_a_parse_error(tmp_path: Path) -> None:
    p = tmp_path / "p.ini"
    p.write_bytes(b"\xef\xbb\xbf[a]\n")
    with pytest.raises(PresetParseError):
        read_ini_file(p)


def test_render_ini_format() -> None:
    assert render_ini("m", [("a", "1"), ("b", "x\ny")]) == "[m]\na = 1\nb = x\\\ny\n\n"
    assert render_ini("empty", []) == "[empty]\n\n"


# -- round trip ---------------------------------------------------------------------

_VALUE_CHARS = st.characters(exclude_characters=";#\r\n", codec="utf-8", min_codepoint=1)
_values = st.text(_VALUE_CHARS, max_size=30).map(lambda s: s.strip(" \t"))
_keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)
_sections = st.text(st.characters(exclude_characters="]\r\n", codec="utf-8"), min_size=1).filter(
    lambda s: s.strip(" \t") == s and s != ""
)


@given(st.dictionaries(_sections, st.dictionaries(_keys, _values, max_size=5), max_size=5))
def test_round_trip_of_rendered_sections(data: dict[str, dict[str, str]]) -> None:
    text = "".join(render_ini(name, list(keys.items())) for name, keys in data.items())
    assert parse_ini(text) == data


@given(
    _keys,
    _values,
    st.sampled_from([" ; c", "#c", "  ", "\t; x", ""]),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.sampled_from(["\n", "\r\n", "\r", ""]),
)
def test_value_survives_comments_and_endings(
    key: str, value: str, tail: str, nl: str, last: str
) -> None:
    assert parse_ini(f"[s]{nl}{key} = {value}{tail}{last}") == {"s": {key: value}}
