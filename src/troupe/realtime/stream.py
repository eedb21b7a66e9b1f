"""A response's output items, built from the child's chat completion chunks.

Text becomes an assistant ``message`` item (``response.output_text.delta`` ...);
each tool call becomes a ``function_call`` item (``response.function_call_arguments
.delta`` ...). Items open when their first delta arrives, since only then is it known
whether the model speaks or calls; each opening and closing sends the API's events in
its order (output item, conversation item, content part, deltas, the ``.done``s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from troupe.kvstore import tokens_in
from troupe.realtime.events import new_id, public_item

__all__ = ["OutputStream", "usage_json"]

Event = dict[str, Any]
Item = dict[str, Any]


def usage_json(usage: dict[str, Any]) -> Event:
    """The chat completion's ``usage`` as the Realtime API counts it."""
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        "input_tokens": prompt,
        "output_tokens": completion,
        "input_token_details": {"cached_tokens": cached},
        "output_token_details": {"text_tokens": completion, "audio_tokens": 0},
    }


class OutputStream:
    def __init__(
        self,
        response_id: str,
        emit: Callable[[Event], Awaitable[None]],
        added: Callable[[Item], str | None],
        finished: Callable[[Item], None],
        into_conversation: bool,
    ) -> None:
        self.response_id = response_id
        self._emit = emit
        self._added = added  # puts a new item in the conversation; returns the one before
        self._finished = finished  # stores an item's final state in the conversation
        self._into = into_conversation
        self._items: list[Item] = []
        self._index: dict[str, int] = {}  # item id -> output_index
        self._text: Item | None = None  # the message being written
        self._parts: list[str] = []
        self._text_base: Event = {}
        self._calls: dict[int, Item] = {}  # open function calls by the chunk's index
        self._args: dict[str, list[str]] = {}
        self.usage: Event | None = None
        self.finish_reason: str | None = None
        self.slot_tokens: int | None = None  # what the child's slot holds (its timings)

    def items(self) -> list[Item]:
        return list(self._items)

    async def on_chunk(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.usage = usage_json(usage)
        if "timings" in data:
            self.slot_tokens = tokens_in(data["timings"])
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue  # not a chat chunk's shape: nothing in it to say
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if isinstance(content, str) and content:
                await self._text_delta(content)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    await self._call_delta(call)

    # ----- items ------------------------------------------------------------------------

    def _base(self, item: Item) -> Event:
        return {"response_id": self.response_id, "output_index": self._index[item["id"]]}

    async def _open(self, item: Item) -> None:
        self._index[item["id"]] = len(self._items)
        self._items.append(item)
        await self._emit({"type": "response.output_item.added", **self._base(item), "item": item})
        if self._into:
            previous = self._added(item)
            await self._emit(
                {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
            )

    async def _done(self, item: Item) -> None:
        self._items[self._index[item["id"]]] = item
        event = {"type": "response.output_item.done", **self._base(item), "item": item}
        await self._emit(event)
        if self._into:
            self._finished(item)
            await self._emit({"type": "conversation.item.done", "item": public_item(item)})

    async def _text_delta(self, text: str) -> None:
        item = self._text
        if item is None:
            item = {
                "id": new_id("item"),
                "object": "realtime.item",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            self._text, self._parts = item, []
            await self._open(item)
            self._text_base = self._part_base(item)
            part = {"type": "text", "text": ""}
            await self._emit(
                {"type": "response.content_part.added", **self._text_base, "part": part}
            )
        self._parts.append(text)
        await self._emit({"type": "response.output_text.delta", **self._text_base, "delta": text})

    def _part_base(self, item: Item) -> Event:
        return {**self._base(item), "item_id": item["id"], "content_index": 0}

    async def _close_text(self, status: str) -> None:
        item, self._text = self._text, None
        if item is None:
            return
        text = "".join(self._parts)
        base = self._part_base(item)
        await self._emit({"type": "response.output_text.done", **base, "text": text})
        part = {"type": "text", "text": text}
        await self._emit({"type": "response.content_part.done", **base, "part": part})
        content = [{"type": "output_text", "text": text}]
        await self._done({**item, "status": status, "content": content})

    async def _call_delta(self, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        if not isinstance(index, int):
            index = 0
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        item = self._calls.get(index)
        if item is None:
            await self._close_text("completed")  # what the model said before calling
            item = {
                "id": new_id("item"),
                "object": "realtime.item",
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.get("id") or new_id("call"),
                "name": function.get("name") or "",
                "arguments": "",
            }
            self._calls[index] = item
            self._args[item["id"]] = []
            await self._open(item)
        delta = function.get("arguments")
        if isinstance(delta, str) and delta:
            self._args[item["id"]].append(delta)
            await self._emit(
                {
                    "type": "response.function_call_arguments.delta",
                    **self._base(item),
                    "item_id": item["id"],
                    "call_id": item["call_id"],
                    "delta": delta,
                }
            )

    async def close_all(self, status: str) -> None:
        """End every open item (``incomplete`` when the response was cut short)."""
        await self._close_text(status)
        for index in sorted(self._calls):
            item = self._calls.pop(index)
            arguments = "".join(self._args.pop(item["id"]))
            await self._emit(
                {
                    "type": "response.function_call_arguments.done",
                    **self._base(item),
                    "item_id": item["id"],
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": arguments,
                }
            )
            await self._done({**item, "status": status, "arguments": arguments})
