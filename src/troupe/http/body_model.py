"""The ``model`` a POST body names (spec §3.5): a JSON field or a multipart form field.

The whole body is parsed (upstream parses it too, and answers its parse errors), but
safely: a body nested deeper than the parser's recursion limit is a 400, not a 500,
and a large one is parsed in a worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import io
import json

import trio
from werkzeug.formparser import MultiPartParser
from werkzeug.http import parse_options_header

__all__ = ["OFF_LOOP_BYTES", "BadBody", "model_from_body", "model_from_body_sync"]

OFF_LOOP_BYTES = 256 << 10  # larger bodies are parsed off the event loop (~1 ms and up)


class BadBody(Exception):
    """The body cannot be read: a 400 with this message."""


async def model_from_body(body: bytes, content_type: str | None) -> str:
    """`model_from_body_sync`, in a worker thread when ``body`` is large."""
    if len(body) > OFF_LOOP_BYTES:
        return await trio.to_thread.run_sync(model_from_body_sync, body, content_type)
    return model_from_body_sync(body, content_type)


def model_from_body_sync(body: bytes, content_type: str | None) -> str:
    """The ``model`` field; "" when absent or not a string. Raises `BadBody`."""
    if content_type and "multipart/form-data" in content_type.lower():
        return _from_multipart(body, content_type)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise BadBody("invalid JSON in request body: nested too deeply") from None
    except ValueError as exc:
        raise BadBody(f"invalid JSON in request body: {exc}") from None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else ""


def _from_multipart(body: bytes, content_type: str) -> str:
    mime, options = parse_options_header(content_type)
    boundary = (
        options.get("boundary", "").encode("latin-1") if mime == "multipart/form-data" else b""
    )
    if not boundary:
        raise BadBody("multipart body without a boundary")
    try:
        form, files = MultiPartParser().parse(io.BytesIO(body), boundary, len(body))
    except ValueError as exc:
        raise BadBody(f"invalid multipart body: {exc}") from None
    for upload in files.values():
        upload.close()  # only the form fields matter here; the child gets the raw body
    value = form.get("model", "")
    return value if isinstance(value, str) else ""
