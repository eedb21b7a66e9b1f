"""A steered request's bytes (`KvService.steered`) and what its answer says of its slot:
``id_slot`` and ``cache_prompt`` spliced into the client's own bytes, the tokens a slot
holds after an answer and those it reused."""

from __future__ import annotations

import json
from typing import Any

from troupe.api import last_object

__all__ = [
    "cached_held",
    "cached_in",
    "tokens_held",
    "tokens_in",
    "with_fields",
    "with_slot",
    "without_cache",
]


def with_slot(body: bytes, request: dict[str, Any], slot: int) -> bytes:
    """``body`` with ``"id_slot": slot`` (`with_fields`)."""
    return with_fields(body, request, {"id_slot": slot})


def with_fields(body: bytes, request: dict[str, Any], fields: dict[str, Any]) -> bytes:
    """``body`` with ``fields``: spliced in after its opening brace when it is UTF-8 with
    none of their keys (the rest of the bytes go as the client sent them, unparsed
    again), else ``request`` written out whole with them."""
    start = len(body) - len(body.lstrip())
    plain = json.detect_encoding(body) == "utf-8" and body[start : start + 1] == b"{"
    if not plain or any(k in request for k in fields):
        return json.dumps({**request, **fields}).encode()
    sep = b"" if not request else b","
    head = json.dumps(fields, separators=(",", ":"))[:-1].encode()
    return b"%s%s%s%s" % (body[:start], head, sep, body[start + 1 :])


_SPACE = b" \t\r\n"


def without_cache(body: bytes) -> bytes:
    """``body`` with ``"cache_prompt": false`` spliced in before its closing brace, not
    parsed: of a key given twice the engine's parser (nlohmann's, as Python's) keeps the
    last value, so a client's own ``cache_prompt``, however it is spelled, gives way.
    Anything but a UTF-8 JSON object goes as it came (the engine refuses it, or reads
    no ``cache_prompt`` from it)."""
    start, end = 0, len(body)
    while start < end and body[start] in _SPACE:
        start += 1
    while end > start and body[end - 1] in _SPACE:
        end -= 1
    if end - start < 2 or body[start] != ord("{") or body[end - 1] != ord("}"):
        return body
    if json.detect_encoding(body) != "utf-8":
        return body
    inner = end - 1
    while inner > start + 1 and body[inner - 1] in _SPACE:
        inner -= 1
    sep = b"" if inner == start + 1 else b","
    return b'%s%s"cache_prompt":false%s' % (body[:inner], sep, body[inner:])


def cached_held(answer: bytes) -> int | None:
    """The tokens ``answer`` (as `tokens_held` reads it) says its prompt reused from the
    slot (``timings.cache_n``); None when it does not say."""
    return cached_in(last_object(answer, b"timings"))


def cached_in(timings: object) -> int | None:
    if not isinstance(timings, dict):
        return None
    n = timings.get("cache_n")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def tokens_held(answer: bytes) -> int | None:
    """The tokens a slot holds after ``answer`` (a whole JSON answer, or the last bytes
    of a stream), from its ``timings`` (`tokens_in`)."""
    return tokens_in(last_object(answer, b"timings"))


def tokens_in(timings: object) -> int | None:
    """An answer's ``timings``: cached + evaluated + predicted tokens (what its slot
    holds after it). None when it does not say."""
    if not isinstance(timings, dict):
        return None
    counts = [timings.get(k) for k in ("cache_n", "prompt_n", "predicted_n")]
    ints = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return sum(ints) if len(ints) == len(counts) else None
