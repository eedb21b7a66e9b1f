"""From a Realtime conversation to a streamed ``/v1/chat/completions`` request, and
from the child's SSE stream back to deltas."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from typing import Any

from troupe.realtime.audio import to_wav
from troupe.realtime.config import ResponseConfig

__all__ = ["SSEDecoder", "chat_body", "chat_messages"]

Item = dict[str, Any]
Message = dict[str, Any]


def _user_content(item: Item, input_format: str) -> str | list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in item["content"]:
        kind = part["type"]
        if kind == "input_text":
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif part.get("audio") is not None:
            wav = to_wav(base64.b64decode(part["audio"]), input_format)
            data = base64.b64encode(wav).decode("ascii")
            parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
        elif part.get("transcript"):
            parts.append({"type": "text", "text": part["transcript"]})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # plain string: every template takes it
    return parts


def _text(item: Item) -> str:
    return "".join(p.get("text") or p.get("transcript") or "" for p in item["content"])


def chat_messages(items: Iterable[Item], instructions: str, input_format: str) -> list[Message]:
    """The chat messages for ``items``; consecutive function calls become the
    ``tool_calls`` of one assistant message, as chat templates expect."""
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = item["role"]
            if role == "user":
                messages.append({"role": "user", "content": _user_content(item, input_format)})
            else:
                messages.append({"role": role, "content": _text(item)})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]  # the text the model said before calling
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    return messages


def chat_body(model: str, messages: list[Message], config: ResponseConfig) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.max_output_tokens is not None:
        body["max_tokens"] = config.max_output_tokens
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.tools and config.tool_choice != "none":
        body["tools"] = [
            {
                "type": "function",
                "function": {k: v for k, v in tool.items() if k != "type"},
            }
            for tool in config.tools
        ]
        choice = config.tool_choice
        if isinstance(choice, dict):
            choice = {"type": "function", "function": {"name": choice["name"]}}
        body["tool_choice"] = choice
        if config.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = config.parallel_tool_calls
    return body


class SSEDecoder:
    """Server-sent events split from arbitrary byte chunks: each ``data:`` payload
    parsed as JSON; ``[DONE]`` ends the stream."""

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False

    def feed(self, chunk: bytes) -> Iterator[Any]:
        self._buffer += chunk
        while not self.done:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            for line in block.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # comments, event names, blank lines
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    return
                try:
                    yield json.loads(payload)
                except ValueError:
                    yield {"error": {"message": f"unreadable event from the model: {payload!r}"}}
