"""``/api/chat``, ``/api/generate``, ``/api/embed`` and ``/api/embeddings``: translated
to the child's routes under a lease, the answer translated back.

Streamed answers are newline-delimited JSON (Ollama's default), one object per chunk
the child sends; ``"stream": false`` asks the child for a whole answer and sends one
object. A client that goes away cancels the handler (the route is `watched`): the
child's answer is closed unfinished, which stops its generation at once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.http.keys import tenant_of
from troupe.http.loading import heralded, waits_for_load
from troupe.http.server.exchange import Exchange
from troupe.kvstore import Hold
from troupe.ollama.answers import Answer, created_at, error_message
from troupe.ollama.common import (
    NDJSON,
    child_headers,
    keep_alive_of,
    lease,
    may_admin,
    model_entry,
    read_json,
    refuse_admin,
    send_error,
)
from troupe.ollama.requests import (
    BadRequest,
    ChildRequest,
    chat_request,
    embed_request,
    generate_request,
)
from troupe.ops.access import AccessRecord
from troupe.proxy.client import RelayReport
from troupe.proxy.upstream import UpstreamError, UpstreamResponse
from troupe.realtime.translate import SSEDecoder
from troupe.sched import Grant

__all__ = ["chat", "embed", "embeddings", "generate"]

log = logging.getLogger("troupe.ollama")

CLOSE_GRACE = 2.0  # seconds to close a child's answer when the client is gone


async def _post(
    ctx: Troupe, ex: Exchange, grant: Grant, target: str, body: Any
) -> UpstreamResponse:
    wire = dumps(body)
    return await ctx.relay.pool.request(grant, "POST", target, child_headers(ex, grant), wire)


async def _close(upstream: UpstreamResponse) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
        await upstream.aclose()


async def _whole(upstream: UpstreamResponse) -> bytes:
    return b"".join([chunk async for chunk in upstream.chunks()])


def _observe(ctx: Troupe, ex: Exchange, status: int) -> None:
    ctx.metrics.observe_relay(ex.path, status, len(ex.body), ex.sent)


async def _answer(
    ctx: Troupe, ex: Exchange, entry: ModelEntry, child: ChildRequest, *, chat: bool,
    stream: bool, name: str, keep_alive: float | None,
) -> None:  # fmt: skip
    ignored = [k for k, v in child.ignored if not _as_started(entry, k, v)]
    if ignored:
        log.warning(
            "%s: options %s ignored: load-time options are the model's preset (ctx-size, ...)",
            entry.name, ", ".join(ignored),
        )  # fmt: skip
    started = time.monotonic()
    answers: list[Answer] = []

    def tokens(rec: AccessRecord) -> None:
        if answers:
            answer = answers[0]
            rec.prompt_tokens, rec.completion_tokens = answer.prompt_n, answer.predicted_n
            if answer.predicted_n and answer.predicted_ms:
                rec.tokens_per_second = answer.predicted_n * 1000.0 / answer.predicted_ms
            rec.stream = stream

    def written() -> bool:
        return bool(answers) and answers[0].written

    async def work(grant: Grant, waited: float) -> None:
        answer = Answer(name, chat=chat, kind=child.kind, started=started, load_s=waited)
        answers.append(answer)
        if stream:  # its tokens per second while it streams (GET /metrics, the dashboard)
            ctx.streams.open(entry.name, answer.live)
        try:
            async with _on_slot(ctx, ex, grant, child) as hold:
                body = {**child.body, **hold.fields()}
                await _relay(ctx, ex, grant, child.target, body, answer, stream)
                hold.tokens, hold.cached = answer.slot_tokens, answer.slot_cached
        finally:
            ctx.streams.close(answer.live)

    if not stream or not waits_for_load(ctx, entry.name):
        await lease(ctx, ex, entry, keep_alive, work, tokens, written=written)
        return
    # Only the head while the model loads: every NDJSON line is a chunk of the answer.
    async with heralded(ctx, ex, entry.name, NDJSON, "head") as herald:
        await lease(ctx, ex, entry, keep_alive, work, tokens, herald, written=written)


@asynccontextmanager
async def _on_slot(
    ctx: Troupe, ex: Exchange, grant: Grant, child: ChildRequest
) -> AsyncIterator[Hold]:
    """Held on one of the child's slots while it runs, as an OpenAI request is
    (`troupe.kvstore`): a returning conversation finds its slot, or is restored."""
    if ctx.kv is None:
        yield Hold(None)
        return
    conv = ex.header(b"x-conversation-id") or ""
    args = (grant.model, grant.gen, child.target, child.body, conv)
    async with ctx.kv.held(
        *args, tenant=tenant_of(ctx.tenants.current, ex.request.key_name)
    ) as hold:
        yield hold


async def _relay(
    ctx: Troupe, ex: Exchange, grant: Grant, target: str, body: dict[str, Any],
    answer: Answer, stream: bool,
) -> None:  # fmt: skip
    status = 500
    try:
        upstream = await _post(ctx, ex, grant, target, body)
    except UpstreamError as exc:
        await send_error(ex, 500, f"the model's server failed: {exc}")
        _observe(ctx, ex, 500)
        return
    try:
        status = upstream.status_code
        if status != 200:
            await send_error(ex, status, error_message(status, await _whole(upstream)))
        elif stream:
            await _stream(ex, upstream, answer)
        else:
            raw = await _whole(upstream)
            try:
                answer.on_whole(json.loads(raw))
            except ValueError:
                await send_error(ex, 500, "unreadable answer from the model's server")
                return
            await ex.respond(200, dumps(answer.final(whole=True)))
            answer.written = True
    except UpstreamError as exc:
        if not ex.started:
            await send_error(ex, 500, f"the model's server closed the connection: {exc}")
        else:
            ex.keep_alive = False  # the stream is cut: it must look cut
    finally:
        await _close(upstream)
        _observe(ctx, ex, status)


def _as_started(entry: ModelEntry, option: str, value: Any) -> bool:
    """A load-time option the child was started with anyway (no warning for it)."""
    return option == "num_ctx" and entry.preset.get_spelling("--ctx-size") == str(value)


async def _stream(ex: Exchange, upstream: UpstreamResponse, answer: Answer) -> None:
    if not ex.started:  # (else it went out while the model loaded)
        await ex.send(ex.head(200, NDJSON, length=None))
    try:
        await _relay_events(ex, upstream, answer)
    except trio.Cancelled:
        if ex.server_stopping:
            await _last_word(ex)
        raise
    except UpstreamError as exc:
        # Every chunk sent holds whole lines, so the stream can end with Ollama's error
        # line (its clients raise it) rather than be cut.
        log.warning("child connection lost during %s: %s", ex.path, exc)
        message = f"the model's server closed the connection: {exc}"
        await _send_lines(ex, [{"error": message}])
        await ex.send(ex.last_chunk)


async def _last_word(ex: Exchange) -> None:
    """The router stops (past --drain-timeout): end the stream with an error line, as
    the relay ends an SSE stream with an error event."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
        try:
            await _send_lines(ex, [{"error": "the router is shutting down"}])
            await ex.send(ex.last_chunk)
        except Exception:  # the client may be gone too
            return


async def _relay_events(ex: Exchange, upstream: UpstreamResponse, answer: Answer) -> None:
    decoder = SSEDecoder()
    async for chunk in upstream.chunks():
        lines = []
        for data in decoder.feed(chunk):
            if isinstance(data, dict) and "error" in data:
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else error
                await _send_lines(ex, [{"error": str(message)}])
                await ex.send(ex.last_chunk)
                return
            lines += answer.on_event(data)
        await _send_lines(ex, lines)
        _count(answer.live, lines)
        if decoder.done:
            break
    await _send_lines(ex, [answer.final(whole=False)])
    answer.written = True  # (a client that leaves now did not leave early)
    await ex.send(ex.last_chunk)


def _count(live: RelayReport, lines: list[dict[str, Any]]) -> None:
    """Lines with text went out: counted as the relay counts an SSE stream's events."""
    sent = sum(1 for line in lines if not line.get("done"))
    if sent:
        if live.first_body is None:
            live.first_body = trio.current_time()
        live.tokens += sent


async def _send_lines(ex: Exchange, objects: list[dict[str, Any]]) -> None:
    if not objects:
        return
    data = b"".join(dumps(o) + b"\n" for o in objects)
    ex.sent += len(data)
    await ex.send(ex.chunk(data))


async def _load_or_unload(
    ctx: Troupe, ex: Exchange, entry: ModelEntry, *, chat: bool, name: str,
    keep_alive: float | None,
) -> None:  # fmt: skip
    """An empty prompt (or no messages): load the model, or unload it with keep_alive 0,
    as Ollama does."""
    out: dict[str, Any] = {"model": name, "created_at": created_at()}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    if keep_alive == 0:
        if not may_admin(ctx, ex):  # unloading a model others share: an admin's action
            await refuse_admin(ex, "unload models (keep_alive 0)")
            return
        # Through the scheduler like any keep_alive: it unloads once the model's requests
        # end (at once when idle); the scheduler answers when it is gone.
        await ctx.scheduler.unload_once_idle(entry.name)
        await ex.respond(200, dumps({**out, "done": True, "done_reason": "unload"}))
        return

    async def work(grant: Grant, waited: float) -> None:
        await ex.respond(200, dumps({**out, "done": True, "done_reason": "load"}))

    await lease(ctx, ex, entry, keep_alive, work)


async def _model_request(
    ctx: Troupe, ex: Exchange
) -> tuple[dict[str, Any], ModelEntry, float | None] | None:
    """The request's JSON, its catalog entry and keep_alive; None once an error was sent."""
    req = await read_json(ex)
    if req is None:
        return None
    entry = await model_entry(ctx, ex, req)
    if entry is None:
        return None
    ok, keep_alive = await keep_alive_of(ex, req)
    if not ok:
        return None
    return req, entry, keep_alive


async def _generation(ctx: Troupe, ex: Exchange, *, chat: bool) -> None:
    asked = await _model_request(ctx, ex)
    if asked is None:
        return
    req, entry, keep_alive = asked
    name = str(req.get("model") or req.get("name"))
    stream = req.get("stream") is not False
    empty = not req.get("messages") if chat else not req.get("prompt") and not req.get("suffix")
    if empty:
        await _load_or_unload(ctx, ex, entry, chat=chat, name=name, keep_alive=keep_alive)
        return
    try:
        make = chat_request if chat else generate_request
        child = make(entry.name, req, stream)
    except BadRequest as exc:
        await send_error(ex, 400, str(exc))
        return
    await _answer(ctx, ex, entry, child, chat=chat, stream=stream, name=name, keep_alive=keep_alive)


async def chat(ctx: Troupe, ex: Exchange) -> None:
    await _generation(ctx, ex, chat=True)


async def generate(ctx: Troupe, ex: Exchange) -> None:
    await _generation(ctx, ex, chat=False)


async def _embed(ctx: Troupe, ex: Exchange, key: str) -> None:
    asked = await _model_request(ctx, ex)
    if asked is None:
        return
    req, entry, keep_alive = asked
    try:
        body, count = embed_request(entry.name, req, key)
    except BadRequest as exc:
        await send_error(ex, 400, str(exc))
        return
    name = str(req.get("model") or req.get("name"))
    started = time.monotonic()
    counted: list[int] = []

    def tokens(rec: AccessRecord) -> None:
        if counted:
            rec.prompt_tokens = counted[0]

    async def work(grant: Grant, waited: float) -> None:
        vectors: list[Any] = []
        prompt_n = 0
        if count:
            status, parsed = await _fetch_json(ctx, ex, grant, body)
            if status != 200:
                await send_error(ex, status, str(parsed))
                return
            assert isinstance(parsed, Mapping)
            data = sorted(parsed.get("data") or [], key=lambda d: d.get("index", 0))
            vectors = [d.get("embedding") for d in data]
            prompt_n = int((parsed.get("usage") or {}).get("prompt_tokens") or 0)
            counted.append(prompt_n)
        if key == "prompt":
            await ex.respond(200, dumps({"embedding": vectors[0] if vectors else []}))
            return
        out = {
            "model": name,
            "embeddings": vectors,
            "total_duration": int((time.monotonic() - started) * 1e9),
            "load_duration": int(waited * 1e9),
            "prompt_eval_count": prompt_n,
        }
        await ex.respond(200, dumps(out))

    await lease(ctx, ex, entry, keep_alive, work, tokens)


async def _fetch_json(ctx: Troupe, ex: Exchange, grant: Grant, body: Any) -> tuple[int, Any]:
    """A whole JSON answer from the child's ``/v1/embeddings``: (200, the document), or
    (status, the error's message)."""
    try:
        upstream = await _post(ctx, ex, grant, "/v1/embeddings", body)
    except UpstreamError as exc:
        _observe(ctx, ex, 500)
        return 500, f"the model's server failed: {exc}"
    status = upstream.status_code
    try:
        raw = await _whole(upstream)
    except UpstreamError as exc:
        return 500, f"the model's server closed the connection: {exc}"
    finally:
        await _close(upstream)
        _observe(ctx, ex, status)
    if status != 200:
        return status, error_message(status, raw)
    try:
        return 200, json.loads(raw)
    except ValueError:
        return 500, "unreadable answer from the model's server"


async def embed(ctx: Troupe, ex: Exchange) -> None:
    await _embed(ctx, ex, "input")


async def embeddings(ctx: Troupe, ex: Exchange) -> None:
    await _embed(ctx, ex, "prompt")
