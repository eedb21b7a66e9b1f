"""The child's answers as Ollama's: chat chunks and ``/completion`` events become
Ollama's stream objects (``message`` or ``response`` pieces, then a last object with
``done``, ``done_reason`` and the counts and durations, in nanoseconds).

`Answer` reads one answer, streamed (`on_event`, each returning the objects to send
now) or whole (`on_whole`); `final` is the last object either way.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from troupe.kvstore import cached_in, tokens_in
from troupe.proxy.client import RelayReport

__all__ = ["Answer", "created_at", "error_message"]

Json = dict[str, Any]

_DONE_REASON = {"stop": "stop", "length": "length", "tool_calls": "stop", "eos": "stop",
                "word": "stop", "limit": "length"}  # fmt: skip


def created_at() -> str:
    """Now, as Ollama writes times (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def error_message(status: int, raw: bytes) -> str:
    """The child's error answer's message (llama.cpp's JSON), or its text."""
    try:
        error = json.loads(raw)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        text = raw.decode("utf-8", "replace").strip()
        return text or f"the model's server answered {status}"


def _arguments(text: object) -> Any:
    if not isinstance(text, str):
        return text if isinstance(text, dict) else {}
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {"arguments": text}  # not JSON: kept rather than lost
    return value if isinstance(value, dict) else {"value": value}


class Answer:
    """One answer in Ollama's shape. ``chat``: a ``message`` (``/api/chat``), else a
    ``response`` string (``/api/generate``). ``kind``: what the child speaks ("chat"
    chunks or llama.cpp's "completion" events)."""

    def __init__(self, model: str, *, chat: bool, kind: str, started: float, load_s: float):
        self.model = model
        self.chat = chat
        self.kind = kind
        self.started = started  # time.monotonic() at the request's start
        self.load_s = load_s  # seconds waiting for the model (its load, if it loaded)
        self.content: list[str] = []
        self.thinking: list[str] = []
        self._calls: dict[int, Json] = {}
        self._calls_sent = False
        self.written = False  # the whole answer went to the client (its last line)
        # A stream's lines with text as they go out (the dashboard's live tokens/s).
        self.live = RelayReport(sse=True)
        self.finish: str | None = None
        self.prompt_n: int | None = None
        self.predicted_n: int | None = None
        self.prompt_ms: float | None = None
        self.predicted_ms: float | None = None
        self.slot_tokens: int | None = None  # what the child's slot holds after it
        self.slot_cached: int | None = None  # what it reused from the slot (timings.cache_n)

    # ----- reading --------------------------------------------------------------------

    def _counts(self, data: Json) -> None:
        timings = data.get("timings")
        if isinstance(timings, dict):
            self.slot_tokens = tokens_in(timings)
            self.slot_cached = cached_in(timings)
            self.prompt_n = _int(timings.get("prompt_n"), self.prompt_n)
            self.predicted_n = _int(timings.get("predicted_n"), self.predicted_n)
            self.prompt_ms = _float(timings.get("prompt_ms"), self.prompt_ms)
            self.predicted_ms = _float(timings.get("predicted_ms"), self.predicted_ms)
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.prompt_n = _int(usage.get("prompt_tokens"), self.prompt_n)
            self.predicted_n = _int(usage.get("completion_tokens"), self.predicted_n)
        if self.kind == "completion":
            self.prompt_n = _int(data.get("tokens_evaluated"), self.prompt_n)
            self.predicted_n = _int(data.get("tokens_predicted"), self.predicted_n)

    def _piece(self, text: str = "", thinking: str = "", calls: list[Json] | None = None) -> Json:
        out: Json = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: Json = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def on_event(self, data: Any) -> list[Json]:
        """One streamed event from the child: the objects to send for it."""
        if not isinstance(data, dict):
            return []
        self._counts(data)
        if self.kind == "completion":
            text = data.get("content")
            if data.get("stop"):
                self.finish = str(data.get("stop_type") or "stop")
            if isinstance(text, str) and text:
                self.content.append(text)
                return [self._piece(text)]
            return []
        out: list[Json] = []
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            text = delta.get("content")
            text = text if isinstance(text, str) else ""
            thought = delta.get("reasoning_content")
            thought = thought if isinstance(thought, str) else ""
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._call_delta(call)
            if text or thought:
                self.content.append(text)
                self.thinking.append(thought)
                out.append(self._piece(text, thought))
        if self.finish is not None and self._calls and not self._calls_sent:
            # Ollama sends a call whole, once its arguments are complete.
            self._calls_sent = True
            out.append(self._piece(calls=self.tool_calls()))
        return out

    def _call_delta(self, call: Json) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        held = self._calls.setdefault(index, {"name": "", "arguments": []})
        if function.get("name"):
            held["name"] = str(function["name"])
        if isinstance(function.get("arguments"), str):
            held["arguments"].append(function["arguments"])

    def on_whole(self, data: Any) -> None:
        """The child's whole (not streamed) answer."""
        if not isinstance(data, dict):
            return
        self._counts(data)
        if self.kind == "completion":
            self.content.append(str(data.get("content") or ""))
            self.finish = str(data.get("stop_type") or "stop")
            return
        choices = data.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        self.finish = str(choice.get("finish_reason") or "stop")
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        assert isinstance(message, dict)
        self.content.append(str(message.get("content") or ""))
        self.thinking.append(str(message.get("reasoning_content") or ""))
        for n, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                self._calls[n] = {
                    "name": str(function.get("name") or ""),
                    "arguments": [str(function.get("arguments") or "")],
                }

    def tool_calls(self) -> list[Json]:
        return [
            {"function": {"name": c["name"], "arguments": _arguments("".join(c["arguments"]))}}
            for _, c in sorted(self._calls.items())
        ]

    # ----- the end --------------------------------------------------------------------

    def final(self, *, whole: bool) -> Json:
        """The last object: everything said when ``whole`` (``"stream": false``), else
        an empty piece; then the counts and durations."""
        if whole:
            calls = self.tool_calls()
            out = self._piece("".join(self.content), "".join(self.thinking), calls or None)
        else:
            out = self._piece()
        out["done"] = True
        out["done_reason"] = _DONE_REASON.get(self.finish or "stop", self.finish or "stop")
        out["total_duration"] = int((time.monotonic() - self.started) * 1e9)
        out["load_duration"] = int(self.load_s * 1e9)
        if self.prompt_n is not None:
            out["prompt_eval_count"] = self.prompt_n
        if self.prompt_ms is not None:
            out["prompt_eval_duration"] = int(self.prompt_ms * 1e6)
        if self.predicted_n is not None:
            out["eval_count"] = self.predicted_n
        if self.predicted_ms is not None:
            out["eval_duration"] = int(self.predicted_ms * 1e6)
        return out


def _int(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: object, default: float | None) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default
