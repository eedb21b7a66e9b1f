"""The ``model`` a POST body names (as upstream reads it): a JSON field or a multipart form field.

A small body (up to `OFF_LOOP_BYTES`) is parsed whole, as upstream does (its parse
errors are answered here), safely: one nested deeper than the parser's recursion
limit is a 400, not a 500. A larger one is never parsed: `troupe.http.json_scan`
finds its top-level ``model`` without building the document, in a worker thread,
giving the GIL back every window, so a 100 MB body of small numbers delays no other
request (``json.loads`` of it holds the GIL for seconds, in a thread or not). The
child parses the body itself and answers its errors.

Multipart bodies (audio transcriptions) go to werkzeug's multipart decoder, kept for
this alone: it is maintained, bounded and fuzzed by others, where a parser of our own
would have to match its leniency (bare CR or LF line breaks, preambles) to route the
same requests. It is imported when the first multipart body arrives, never at start-up,
and always runs in a worker thread. File parts are not kept (only form fields are
read; the child gets the raw body), and a body of more than `MAX_PARTS` parts is a 400.
"""

from __future__ import annotations

import json
from typing import IO

import trio

from troupe.http.json_scan import BadBody, check_utf8, scan_model

__all__ = ["MAX_PARTS", "OFF_LOOP_BYTES", "BadBody", "model_from_body", "model_from_body_sync"]

OFF_LOOP_BYTES = 256 << 10  # larger bodies are scanned off the event loop (~1 ms and up)
MAX_PARTS = 1000  # werkzeug's own default for a request's form


async def model_from_body(body: bytes, content_type: str | None) -> str:
    """`model_from_body_sync`, in a worker thread when ``body`` is large or multipart."""
    if len(body) > OFF_LOOP_BYTES or _is_multipart(content_type):
        return await trio.to_thread.run_sync(model_from_body_sync, body, content_type)
    return model_from_body_sync(body, content_type)


def _is_multipart(content_type: str | None) -> bool:
    return bool(content_type) and "multipart/form-data" in (content_type or "").lower()


def model_from_body_sync(body: bytes, content_type: str | None) -> str:
    """The ``model`` field; "" when absent or not a string. Raises `BadBody`."""
    if content_type and _is_multipart(content_type):
        return _from_multipart(body, content_type)
    if len(body) > OFF_LOOP_BYTES:
        check_utf8(body)
        return scan_model(body)
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


class _Discard:
    """Where a file part's bytes go: nowhere (only the form fields are read)."""

    def write(self, data: bytes) -> int:
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def close(self) -> None:
        pass


def _discard(
    total_content_length: int | None,
    content_type: str | None,
    filename: str | None,
    content_length: int | None = None,
) -> IO[bytes]:
    return _Discard()  # type: ignore[return-value]  # the decoder only writes and seeks


def _from_multipart(body: bytes, content_type: str) -> str:
    # Lazy: werkzeug is only needed once a multipart body arrives.
    import io  # noqa: PLC0415

    from werkzeug.exceptions import RequestEntityTooLarge  # noqa: PLC0415
    from werkzeug.formparser import MultiPartParser  # noqa: PLC0415
    from werkzeug.http import parse_options_header  # noqa: PLC0415

    mime, options = parse_options_header(content_type)
    boundary = (
        options.get("boundary", "").encode("latin-1") if mime == "multipart/form-data" else b""
    )
    if not boundary:
        raise BadBody("multipart body without a boundary")
    parser = MultiPartParser(stream_factory=_discard, max_form_parts=MAX_PARTS)
    try:
        form, _files = parser.parse(io.BytesIO(body), boundary, len(body))
    except ValueError as exc:
        raise BadBody(f"invalid multipart body: {exc}") from None
    except RequestEntityTooLarge:
        raise BadBody(f"invalid multipart body: more than {MAX_PARTS} parts") from None
    value = form.get("model", "")
    return value if isinstance(value, str) else ""
