"""The scanner that finds a large body's top-level ``"model"`` without building the
document (`troupe.http.json_scan`): it gives what ``json.loads`` gives, on generated
documents (keys in any order and spelling, duplicates, escapes, whitespace, nesting),
with windows small enough that every seam falls inside strings and brackets."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troupe.http import json_scan
from troupe.http.body_model import OFF_LOOP_BYTES, model_from_body_sync
from troupe.http.json_scan import BadBody, check_utf8, scan_model

TEXT = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"', "\\", "\\u0022", "model", "a\nb", "é", "\U0001f600", "]}", "[{", '\\"]']
)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
# Spellings of keys as they may appear in the document's text (escapes included).
KEYS = st.sampled_from(
    ['"model"', '"mod\\u0065l"', '"\\u006dodel"', '"models"', '"Model"', '"mode"', '"m\\"odel"']
) | TEXT.map(json.dumps)
SPACE = st.sampled_from(["", " ", "\n\t ", "\r\n"])


def expected(text: str) -> str:
    data = json.loads(text)
    value = data.get("model") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A JSON text whose top level is an object written member by member."""
    members = draw(st.lists(st.tuples(KEYS, VALUES | TEXT, st.booleans()), max_size=6))
    parts = []
    for key, value, ascii_only in members:
        space = draw(SPACE)
        parts.append(f"{key}{space}:{draw(SPACE)}{json.dumps(value, ensure_ascii=ascii_only)}")
    return draw(SPACE) + "{" + draw(SPACE) + ("," + draw(SPACE)).join(parts) + "}" + draw(SPACE)


@settings(max_examples=400, deadline=None)
@given(documents(), st.integers(1, 16))
def test_it_finds_what_json_loads_finds(text: str, window: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_scan, "WINDOW", window)
        assert scan_model(text.encode()) == expected(text)


@settings(max_examples=200, deadline=None)
@given(VALUES, st.integers(1, 16))
def test_any_other_document_names_no_model(value: Any, window: int) -> None:
    text = json.dumps(value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_scan, "WINDOW", window)
        assert scan_model(text.encode()) == expected(text)


@settings(max_examples=300, deadline=None)
@given(documents(), st.data())
def test_a_cut_document_is_refused_or_still_valid(text: str, data: st.DataObject) -> None:
    raw = text.encode()
    cut = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        want: str | None = expected(cut.decode())
    except ValueError:
        want = None  # invalid (or cut inside a character)
    if want is not None:
        assert scan_model(cut) == want


def test_the_last_of_duplicate_keys_wins_and_escapes_are_decoded() -> None:
    body = b'{"model": "a", "messages": [{"model": "inner"}], "mod\\u0065l": "b\\u00e9\\n"}'
    assert scan_model(body) == "b\u00e9\n"
    assert scan_model(b'{"model": "a", "model": 3}') == ""
    assert scan_model(b'{"model": 3, "model": "a"}') == "a"
    assert scan_model(b'[{"model": "a"}]') == ""
    assert scan_model(b'"model"') == ""
    assert scan_model(b" {\n} ") == ""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "Expecting value"),
        (b'{"model": "a"', "Expecting ',' delimiter"),
        (b'{"model" "a"}', "Expecting ':' delimiter"),
        (b'{"model": "a"} x', "Extra data"),
        (b"{model: 1}", "property name"),
        (b'{"messages": [1, 2, {"x": "y"]', "unterminated"),
        (b'{"model": "a\\', "unterminated string"),
        (b'{"model": "\\x"}', "Invalid \\escape"),
        (codecs.BOM_UTF8 + b'{"model": "a"}', "BOM"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b'{"model": "' + b"m" * (json_scan.MAX_MODEL_BYTES + 1) + b'"}', "longer than"),
    ],
)
def test_what_it_refuses(body: bytes, message: str) -> None:
    with pytest.raises(BadBody, match=message.replace("\\", "\\\\")):
        scan_model(body)


@pytest.mark.parametrize("window", [1, 2, 3, 1 << 20])
def test_utf8_is_checked_across_windows(window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_scan, "WINDOW", window)
    check_utf8("é\U0001f600x".encode() * 3)
    bad = "é\U0001f600".encode() * 3 + b"\xff" + b"x"
    with pytest.raises(BadBody, match=r"\(byte 18\)"):
        check_utf8(bad)
    with pytest.raises(BadBody, match=r"\(byte 0\)"):
        check_utf8("é".encode()[1:])


def test_a_large_body_is_scanned_and_gives_what_a_small_one_gives() -> None:
    numbers = ",".join(["1"] * (OFF_LOOP_BYTES // 2))
    body = ('{"messages": [' + numbers + '], "mod\\u0065l": "tiny"}').encode()
    assert len(body) > OFF_LOOP_BYTES
    assert model_from_body_sync(body, "application/json") == "tiny"
    assert model_from_body_sync(body.replace(b'"tiny"', b"[]"), None) == ""
    with pytest.raises(BadBody, match=r"not valid UTF-8 \(byte 3\)"):
        model_from_body_sync(b'{"m\xff' + body[4:], None)
