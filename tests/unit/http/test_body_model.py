"""The model a POST body names: JSON, and multipart form fields (werkzeug's decoder,
bounded: file parts are not kept, and the number of parts is limited)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troupe.http.body_model import MAX_PARTS, BadBody, model_from_body, model_from_body_sync

CT = "multipart/form-data; boundary=XyZ"


def multipart(*parts: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += (
            b"--XyZ\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n" + value + b"\r\n"
        )
    return out + b"--XyZ--\r\n"


def test_the_model_field_of_a_multipart_body() -> None:
    body = multipart(("file", b"\x00RIFF" * 1000, "a.wav"), ("model", b"whisper", None))
    assert model_from_body_sync(body, CT) == "whisper"


def test_a_file_part_named_model_is_not_the_model() -> None:
    assert model_from_body_sync(multipart(("model", b"x", "model.txt")), CT) == ""


def test_the_first_of_repeated_model_fields_counts() -> None:
    body = multipart(("model", b"first", None), ("model", b"second", None))
    assert model_from_body_sync(body, CT) == "first"


def test_a_multipart_body_without_a_boundary_is_bad() -> None:
    with pytest.raises(BadBody, match="boundary"):
        model_from_body_sync(b"x", "multipart/form-data")


def test_too_many_parts_is_bad_not_unbounded() -> None:
    body = multipart(*[(f"f{i}", b"v", None) for i in range(MAX_PARTS + 1)])
    with pytest.raises(BadBody, match="parts"):
        model_from_body_sync(body, CT)


async def test_multipart_is_parsed_off_the_event_loop() -> None:
    body = multipart(("model", b"whisper", None))
    assert await model_from_body(body, CT) == "whisper"


def test_json_bodies() -> None:
    assert model_from_body_sync(b'{"model": "a"}', "application/json") == "a"
    assert model_from_body_sync(b'{"model": 3}', None) == ""
    with pytest.raises(BadBody, match="nested too deeply"):
        model_from_body_sync(b"[" * 100_000, None)
    with pytest.raises(BadBody, match="UTF-8"):
        model_from_body_sync(b"\xff", None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.sampled_from([CT, "multipart/form-data; boundary=-"]))
def test_any_bytes_give_a_model_or_a_bad_body_never_another_error(
    body: bytes, content_type: str
) -> None:
    with contextlib.suppress(BadBody):
        assert isinstance(model_from_body_sync(body, content_type), str)
