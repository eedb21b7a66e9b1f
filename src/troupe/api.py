"""llama-server's HTTP API as every layer needs to know it.

Its JSON (compact UTF-8, no spaces), the ``--api-prefix`` every route sits under, and
which routes go to a child: POST routes name their model in the body, GET ones
in ``?model=``. The front routes by these sets (`troupe.http.routes`, the one route
table), the metrics label by them, the transport writes JSON this way: so they sit
below all three.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "JSON_TYPE",
    "PROXY_GET_PATHS",
    "PROXY_GET_WITH_MODEL",
    "PROXY_POST_PATHS",
    "dumps",
    "last_object",
    "strip_prefix",
]

JSON_TYPE = "application/json; charset=utf-8"

# POST routes whose model comes from the JSON body (as upstream).
PROXY_POST_PATHS = frozenset(
    {
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/control",
        "/v1/responses",
        "/responses",
        "/v1/audio/transcriptions",
        "/audio/transcriptions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/infill",
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
        "/v1/systemone",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
        "/responses/input_tokens",
        "/v1/responses/input_tokens",
        "/lora-adapters",
        "/props",
    }
)
# GET routes whose model comes from ?model=.
PROXY_GET_PATHS = frozenset({"/slots", "/lora-adapters"})
# Proxied only with ?model=; without it the router answers: GET /props (upstream), and
# GET /metrics, troupe's own metrics (upstream answers 400 there: a deliberate deviation).
PROXY_GET_WITH_MODEL = frozenset({"/props", "/metrics"})


_DECODER = json.JSONDecoder()


def last_object(data: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object after the last ``"key":`` in ``data`` (an answer, or its last
    bytes: llama-server's ``usage`` and ``timings`` come last), or None."""
    at = data.rfind(b'"' + key + b'"')
    if at < 0:
        return None
    start = data.find(b"{", at)
    if start < 0:
        return None
    try:
        value, _ = _DECODER.raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def dumps(value: Any) -> bytes:
    """Compact JSON, as llama.cpp writes it (UTF-8, no spaces)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def strip_prefix(path: str, prefix: str) -> str | None:
    """``path`` without the ``--api-prefix``; None when it is outside the prefix."""
    if not prefix:
        return path
    if path == prefix or not path.startswith(prefix + "/"):
        return None
    return path[len(prefix) :]
