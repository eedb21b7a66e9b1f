"""Which requests take one of a child's slots (and so wait their turn, fair queuing) and
which never wait behind them (`troupe.lease.takes_slot`)."""

from __future__ import annotations

import pytest

from troupe.lease import takes_slot


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/completions", "/completion", "/infill", "/v1/embeddings",
     "/rerank", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate", "/api/embed"],
)  # fmt: skip
def test_decoding_posts_take_a_slot(path: str) -> None:
    assert takes_slot("POST", path)
    assert takes_slot("POST", path + "?autoload=true")


@pytest.mark.parametrize(
    "path",
    ["/tokenize", "/detokenize", "/apply-template", "/props", "/slots/0", "/lora-adapters",
     "/v1/messages/count_tokens", "/v1/chat/completions/input_tokens"],
)  # fmt: skip
def test_posts_that_do_not_decode_take_none(path: str) -> None:
    assert not takes_slot("POST", path)


@pytest.mark.parametrize("path", ["/slots", "/props", "/health", "/metrics", "/v1/models"])
def test_gets_take_none(path: str) -> None:
    assert not takes_slot("GET", path)
