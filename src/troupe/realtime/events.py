"""Server events of the OpenAI Realtime API (GA), as plain dicts, and their ids.

The shapes are those of the ``openai`` SDK's ``openai.types.realtime`` models (the
tests validate every event troupe sends against them). Plain dicts rather than the
SDK's models: the SDK is not a runtime dependency, and a streamed delta must cost
microseconds.
"""

from __future__ import annotations

import itertools
import json
import secrets
from typing import Any

__all__ = [
    "Ids",
    "RealtimeError",
    "dumps",
    "error_event",
    "new_id",
    "public_item",
]

Event = dict[str, Any]


def dumps(event: Event) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def new_id(prefix: str) -> str:
    """``item_…``, ``resp_…``, ``call_…``: random, as the API's own ids."""
    return f"{prefix}_{secrets.token_hex(10)}"


class Ids:
    """Event ids of one session: a random stem and a counter (cheap per delta)."""

    def __init__(self) -> None:
        self._stem = f"event_{secrets.token_hex(6)}"
        self._count = itertools.count(1)

    def event(self) -> str:
        return f"{self._stem}{next(self._count):x}"


class RealtimeError(Exception):
    """A client event troupe cannot carry out; answered with an ``error`` event."""

    def __init__(
        self,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type_
        self.code = code
        self.param = param


def error_event(event_id: str, error: RealtimeError, client_event_id: str | None) -> Event:
    body: dict[str, Any] = {"type": error.type, "message": error.message}
    if error.code is not None:
        body["code"] = error.code
    if error.param is not None:
        body["param"] = error.param
    if client_event_id is not None:
        body["event_id"] = client_event_id
    return {"type": "error", "event_id": event_id, "error": body}


def public_item(item: Event) -> Event:
    """An item as ``conversation.item.added``/``done`` show it: everything but audio
    bytes (``conversation.item.retrieve`` returns those)."""
    content = item.get("content")
    if not content or not any("audio" in part for part in content):
        return item
    parts = [{k: v for k, v in part.items() if k != "audio"} for part in content]
    return {**item, "content": parts}
