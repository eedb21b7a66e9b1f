"""A streamed request that waits for its model to load: its head at once, then the load.

llama.cpp's router sends nothing until the child is ready: a client waiting for a
20 s load sees no byte for 20 s (and a proxy or a client with a first-byte timeout gives
up). With ``--load-progress comments`` (the default), a streamed completion (``"stream":
true`` on ``/v1/chat/completions``, ``/v1/completions``, ``/completion``) whose model is
not loaded when it arrives gets the SSE head once it has waited `HEAD_AFTER`, then one SSE
comment per step of the engine's staged progress (``: loading tiny-a 40%``; SSE comments
are ignored by every SSE reader), then the child's own events in the same stream. With
``reasoning``, a chat completion gets the same lines as ``reasoning_content`` deltas (a
chat UI shows them as the model's thinking, like llama-swap's ``sendLoadingState``).
Ollama's ``/api/chat`` and ``/api/generate`` (NDJSON) get only the early head: every
line of theirs is a chunk of the answer, and an empty one would still be one.

Once the head is out the status is 200: a refusal after it (the load failed, the queue
timed out) ends the stream with the error as llama-server ends a failed stream, one
``data: {"error": {...}}`` event and no ``[DONE]`` (`AfterHead`); an answer of the child
that is not a 200 stream becomes that event too.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import trio

from troupe.api import dumps, strip_prefix
from troupe.assembly import Troupe
from troupe.http.errors import failure_body
from troupe.http.respond import send_failure
from troupe.http.server.exchange import Exchange
from troupe.ops.load_log import load_percent
from troupe.sched import Failure, ModelView, Snapshot, Status

__all__ = [
    "SSE_FIELDS",
    "AfterHead",
    "Herald",
    "describe_wait",
    "heralded",
    "progress_style",
    "waits_for_load",
]

HEAD_AFTER = (
    0.2  # seconds: a refusal that comes at once (a held model, a full queue) keeps its status
)
KEEP_WARM = 15.0  # seconds without news: the last line again (a proxy closes a silent stream)
ERROR_BODY_MAX = 64 << 10  # bytes of a child's error answer kept for the error event
SSE_FIELDS = b"Content-Type: text/event-stream\r\nX-Accel-Buffering: no\r\n"
# The routes whose streamed answers are SSE completions (llama.cpp's and OpenAI's).
_STREAMED = frozenset(
    {"/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions"}
)
_CHAT = frozenset({"/chat/completions", "/v1/chat/completions"})
_READY = (Status.LOADED, Status.SLEEPING)

Style = Literal["comments", "reasoning", "head"]


def describe_wait(name: str, view: ModelView | None) -> str | None:
    """What a request for ``name`` waits for, in one line; None when it waits for no load
    (the model is ready, or gone from the table)."""
    if view is None or (view.status in _READY and not view.stopping):
        return None
    if view.status is Status.LOADING:
        percent = load_percent(view.progress)
        if percent is None:
            return f"loading {name}"
        stages = view.progress.get("stages") if view.progress else None
        current = view.progress.get("current") if view.progress else None
        stage = f" ({current})" if isinstance(stages, list) and len(stages) > 1 else ""
        return f"loading {name} {percent}%{stage}"
    if view.status is Status.DOWNLOADING:
        return f"downloading {name}"
    if view.wait_reason:
        return f"waiting for {name}: {view.wait_reason}"
    return f"waiting for {name}"


def waits_for_load(ctx: Troupe, name: str) -> bool:
    """``--load-progress`` is on and ``name`` is not ready: a request for it waits for a
    load (the common case, a ready model, is one dict lookup)."""
    if ctx.settings.load_progress == "off":
        return False
    view = ctx.scheduler.snapshot.models.get(name)
    return view is None or view.status not in _READY or view.stopping


def progress_style(ctx: Troupe, ex: Exchange, name: str) -> Style | None:
    """How this request hears of its model's load, or None: not a streamed completion,
    ``--load-progress off``, or its model is ready (the common case: one dict lookup)."""
    mode = ctx.settings.load_progress
    if ex.method != "POST" or mode == "off":
        return None
    # The route first: the snapshot is rebuilt after every lease taken or given back,
    # so reading it costs each proxied request a view of every model (bench/proxy.py).
    route = strip_prefix(ex.path, ctx.settings.api_prefix) or ex.path
    if route not in _STREAMED or not waits_for_load(ctx, name) or not _streamed(ex.body):
        return None
    return "reasoning" if mode == "reasoning" and route in _CHAT else "comments"


def _streamed(body: bytes) -> bool:
    if b'"stream"' not in body:
        return False
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("stream") is True


class Herald:
    """Tells one waiting client about its model's load until `settle` (see the module).
    ``fields``: the head's fields (SSE's, or Ollama's NDJSON); ``style``: how lines go."""

    def __init__(self, ctx: Troupe, ex: Exchange, model: str, fields: bytes, style: Style) -> None:
        self.ctx, self.ex, self.model = ctx, ex, model
        self.fields, self.style = fields, style
        self.sent = 0  # body bytes written before the child's answer
        self.first_byte: float | None = None  # Trio time the head went out
        self._settled = False
        self._wait = trio.CancelScope()
        self._done = trio.Event()
        self._id = f"chatcmpl-load-{time.monotonic_ns():x}"

    @property
    def head_sent(self) -> bool:
        return self.ex.started

    async def run(self) -> None:
        try:
            if await self._waited(functools.partial(trio.sleep, HEAD_AFTER)):
                return
            while True:
                line = describe_wait(self.model, self.ctx.scheduler.snapshot.models.get(self.model))
                if line is not None:
                    await self._write(line)  # (not cancelled by settle: a line goes whole)

                def news(snapshot: Snapshot, was: str | None = line) -> bool:
                    return describe_wait(self.model, snapshot.models.get(self.model)) != was

                if await self._waited(lambda: self.ctx.scheduler.wait_until(news), KEEP_WARM):
                    return
        finally:
            self._done.set()

    async def _waited(self, wait: Callable[[], Awaitable[object]], limit: float = math.inf) -> bool:
        """``wait()`` (at most ``limit`` seconds) unless settled; True once settled."""
        if self._settled:
            return True
        with trio.CancelScope() as self._wait, trio.move_on_after(limit):
            await wait()
        return self._settled

    def stop(self) -> None:
        self._settled = True
        self._wait.cancel()

    async def settle(self) -> None:
        """Stop telling (the lease answered): a line being written is finished first."""
        self.stop()
        await self._done.wait()

    async def _write(self, line: str) -> None:
        ex = self.ex
        out = b"" if ex.started else ex.head(200, self.fields, length=None)
        data = b""
        if self.style == "comments":
            data = b": " + line.encode() + b"\n\n"
        elif self.style == "reasoning":
            data = b"data: " + dumps(self._delta(line + "\n")) + b"\n\n"
        if data:
            out += ex.chunk(data)
            self.sent += len(data)
            ex.sent += len(data)
        if out:
            if self.first_byte is None:
                self.first_byte = trio.current_time()
            await ex.send(out)

    def _delta(self, text: str) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": None, "index": 0, "delta": {"reasoning_content": text}}],
            "created": int(time.time()),
            "id": self._id,
            "model": self.model,
            "object": "chat.completion.chunk",
        }

    async def fail(self, failure: Failure) -> None:
        """A refusal: its status and body when the head has not gone out, else the
        stream's last event (llama-server's ``data: {"error": ...}``)."""
        if not self.ex.started:
            await send_failure(self.ex, failure)
            return
        await end_with_error(self.ex, failure_body(failure))


async def end_with_error(ex: Exchange, body: bytes) -> None:
    """End a started SSE stream with ``body`` (an ``{"error": ...}`` document) as its
    last event, as llama-server ends a stream that failed (no ``[DONE]``)."""
    data = b"data: " + body + b"\n\n"
    ex.sent += len(data)
    await ex.send(ex.chunk(data) + ex.last_chunk)


@asynccontextmanager
async def heralded(
    ctx: Troupe, ex: Exchange, model: str, fields: bytes, style: Style
) -> AsyncIterator[Herald]:
    """A `Herald` at work beside the block (which must `Herald.settle` it before it
    writes to ``ex``)."""
    herald = Herald(ctx, ex, model, fields, style)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(herald.run)
        try:
            yield herald
        finally:
            herald.stop()


class AfterHead:
    """The client's side of a relay whose head troupe already sent (a `Herald`'s): the
    child's 200 stream goes on in the same response without its head; any other answer
    (an error, a whole JSON body) is kept and ends the stream as an error event
    (`finish`). Shaped like `troupe.proxy.client.Client`."""

    __slots__ = ("_body", "_error", "ex")

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self._error: int | None = None  # the child's status when its answer is no stream
        self._body = bytearray()

    @property
    def method(self) -> str:
        return self.ex.method

    @property
    def path(self) -> str:
        return self.ex.path

    @property
    def target(self) -> bytes:
        return self.ex.target

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return self.ex.headers

    @property
    def body(self) -> bytes:
        return self.ex.body

    @property
    def started(self) -> bool:
        return True

    @property
    def framing(self) -> bool:
        return self._error is None and self.ex.framing

    @property
    def server_stopping(self) -> bool:
        return self.ex.server_stopping

    def head(self, status: int, fields: bytes, *, length: int | None) -> bytes:
        if status != 200 or b"text/event-stream" not in fields:
            self._error = status
        return b""

    def chunk(self, data: bytes) -> bytes:
        return data if self._error is not None else self.ex.chunk(data)

    @property
    def last_chunk(self) -> bytes:
        return b"" if self._error is not None else self.ex.last_chunk

    async def send(self, data: bytes) -> None:
        if self._error is None:
            await self.ex.send(data)
        elif len(self._body) < ERROR_BODY_MAX:
            self._body += data[: ERROR_BODY_MAX - len(self._body)]

    async def respond(self, status: int, body: bytes, content_type: str | bytes = "") -> None:
        self._error, self._body = status, bytearray(body[:ERROR_BODY_MAX])
        await self.finish()

    async def finish(self) -> None:
        """The child's answer was no stream: it ends this one as an error event."""
        if self._error is None:
            return
        status, body = self._error, bytes(self._body)
        self._error = None
        if not _is_error_document(body):
            message = body.decode("utf-8", "replace").strip() or f"the model answered {status}"
            body = dumps({"error": {"code": status, "message": message, "type": "server_error"}})
        await end_with_error(self.ex, body)


def _is_error_document(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)
