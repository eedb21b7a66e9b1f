"""One response: the conversation sent to the child as a streamed chat completion,
its chunks sent back as Realtime events, ``response.done`` at the end whatever happens.

`ResponseRun.cancel` (``response.cancel``) cancels the stream: closing the unfinished
child answer stops its generation at once, and the response ends ``cancelled``. A
session that ends (the client left) cancels the whole task instead: nothing more is
sent, and the lease is given back on the way out.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.proxy.upstream import UpstreamError, UpstreamResponse
from troupe.realtime.config import ResponseConfig
from troupe.realtime.events import RealtimeError, new_id
from troupe.realtime.lease import ChildCall
from troupe.realtime.stream import OutputStream
from troupe.realtime.translate import SSEDecoder, chat_body, chat_messages

__all__ = ["ResponseRun", "ResponseSpec", "child_error"]

Event = dict[str, Any]
Item = dict[str, Any]


@attrs.frozen
class ResponseSpec:
    config: ResponseConfig
    context: list[Item]  # the items the model sees
    into_conversation: bool  # False: out of band (conversation "none")
    metadata: dict[str, Any] | None = None
    conversation_id: str | None = None
    input_format: str = "audio/pcm"


class ResponseRun:
    def __init__(
        self,
        spec: ResponseSpec,
        call: ChildCall,
        emit: Callable[[Event], Awaitable[None]],
        added: Callable[[Item], str | None],
        finished: Callable[[Item], None],
    ) -> None:
        self.id = new_id("resp")
        self.spec = spec
        self._call = call
        self._emit = emit
        self._scope = trio.CancelScope()
        self._failure: RealtimeError | None = None
        self.out = OutputStream(self.id, emit, added, finished, spec.into_conversation)

    def cancel(self) -> None:
        self._scope.cancel()

    def _response(self, status: str, details: Event | None = None) -> Event:
        config = self.spec.config
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": self.out.items(),
            "conversation_id": self.spec.conversation_id,
            "output_modalities": list(config.output_modalities),
            "max_output_tokens": config.max_output_tokens or "inf",
            "metadata": self.spec.metadata,
            "usage": self.out.usage,
        }

    async def run(self) -> None:
        await self._emit({"type": "response.created", "response": self._response("in_progress")})
        spec, call = self.spec, self._call
        messages = chat_messages(spec.context, spec.config.instructions, spec.input_format)
        body = json.dumps(chat_body(call.model, messages, spec.config)).encode()
        with self._scope:
            try:
                await call.post(
                    "/v1/chat/completions", body, "application/json", self._stream,
                    held=lambda: self.out.slot_tokens, used=self._used,
                )  # fmt: skip
            except ModelUnavailable as exc:
                failure = exc.failure
                self._failure = RealtimeError(
                    failure.message, type_=failure.type, code=str(failure.status)
                )
            except UpstreamError as exc:
                self._failure = RealtimeError(
                    f"the model's server closed the connection: {exc}", type_="server_error"
                )
        details: Event | None = None
        if self._scope.cancelled_caught:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        elif self._failure is not None:
            status = "failed"
            error = _error_json(self._failure)
            details = {"type": "failed", "error": error}
            await self._emit({"type": "error", "error": error})
        elif self.out.finish_reason == "length":
            status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        else:
            status = "completed"
        await self.out.close_all("completed" if status == "completed" else "incomplete")
        await self._emit({"type": "response.done", "response": self._response(status, details)})

    def _used(self) -> int | None:
        """The tokens the child's ``usage`` counted (None: it sent none, a cut stream)."""
        usage = self.out.usage
        return None if usage is None else int(usage["total_tokens"])

    async def _stream(self, upstream: UpstreamResponse) -> None:
        if upstream.status_code != 200:
            raw = b"".join([chunk async for chunk in upstream.chunks()])
            self._failure = child_error(upstream.status_code, raw)
            return
        decoder = SSEDecoder()
        async for chunk in upstream.chunks():
            for data in decoder.feed(chunk):
                if isinstance(data, dict) and "error" in data:
                    self._failure = child_error(500, json.dumps(data).encode())
                    return
                await self.out.on_chunk(data)
            if decoder.done:
                return


def _error_json(error: RealtimeError) -> Event:
    out: Event = {"type": error.type, "message": error.message}
    if error.code:
        out["code"] = error.code
    return out


def child_error(status: int, raw: bytes) -> RealtimeError:
    """The child's error answer (upstream JSON), or its text when it is not JSON."""
    try:
        error = json.loads(raw)["error"]
        return RealtimeError(
            str(error.get("message", "")),
            type_=str(error.get("type") or "server_error"),
            code=str(error.get("code") or status),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        text = raw.decode("utf-8", "replace").strip() or f"HTTP {status}"
        return RealtimeError(f"the model's server answered {status}: {text}", type_="server_error")
