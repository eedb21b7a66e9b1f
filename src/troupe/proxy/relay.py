"""The byte relay: one request to a child, its answer written back as it comes.

The request goes out in one write on a pooled keep-alive connection. The answer's
head is rewritten (as upstream's proxy: the child's Server, framing, hop-by-hop and CORS
fields dropped, ours added, ``X-Accel-Buffering: no``); then every read from the
child is one write to the client: a chunked body passes through with its framing
untouched, any other body is framed as one chunk per read. A slow client slows the
reads from the child (one write awaited per read) and a slow child the client.

The client side is anything shaped like `Client` (the HTTP server's exchange,
`client.py`), so this module stays pure transport; the header fields each way are
`fields.py`'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence

import trio

from troupe.api import dumps
from troupe.proxy.client import ChildLost, Client, RelayReport
from troupe.proxy.fields import CHILD_HOST, request_bytes, request_headers, response_fields
from troupe.proxy.upstream import Child, UpstreamError, UpstreamPool, UpstreamResponse

__all__ = ["Relay"]

log = logging.getLogger("troupe.proxy")

CLOSE_GRACE = 2.0  # seconds to close an upstream answer when the client went away
FINISH_CHUNK = 0.5  # at a hard stop, how long to wait for the rest of a chunk
_BUMP = 1.0  # the read deadline moves at most once a second (cheaper than per read)
# One call per relayed request as it ends: (route path, status, request body
# bytes, response body bytes relayed) (troupe.ops.metrics.RouterMetrics.observe_relay).
Observe = Callable[[str, int, int, int], None]


HELD_MAX = 1 << 20  # bytes of one SSE event held back until its end (beyond: sent on)


def _error_event(message: str, code: int = 500, type_: str = "server_error") -> bytes:
    error = {"error": {"code": code, "message": message, "type": type_}}
    return b"data: " + dumps(error) + b"\n\n"


class Relay:
    """Pooled connections to every child; `relay` proxies one request."""

    def __init__(self, timeout: float, observe: Observe | None = None) -> None:
        # upstream: connect and read time out after --timeout (3600 s by default); a
        # long prefill sends nothing for a while, so reads get the whole of it.
        self._pool = UpstreamPool(CHILD_HOST, connect_timeout=timeout, read_timeout=timeout)
        self._observer = observe

    async def aclose(self) -> None:
        await self._pool.aclose()

    def started(self, model: str, gen: int, port: int, connections: int) -> None:
        """The child ``(model, gen)`` started on ``port``; it serves ``connections`` at once."""
        self._pool.started(model, gen, port, connections)

    def forget(self, model: str, gen: int) -> None:
        """The scheduler is stopping the child ``(model, gen)``."""
        self._pool.forget(model, gen)

    def gone(self, model: str, gen: int) -> None:
        """The scheduler saw the child ``(model, gen)`` exit."""
        self._pool.gone(model, gen)

    @property
    def pool(self) -> UpstreamPool:
        """The one transport to children, for callers that speak to them directly (the
        realtime sessions, the KV store, the metrics scrape)."""
        return self._pool

    @property
    def idle_connections(self) -> int:
        return self._pool.idle_count

    async def fetch(
        self,
        child: Child,
        method: str,
        target: str,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> tuple[int, bytes] | None:
        """A small whole answer from ``child``, or None when it cannot answer. Bound it
        with a cancel scope (stream lookups and deletes get 250 ms, as upstream)."""
        headers = request_headers(headers, child.port)
        try:
            return await self._pool.fetch(child, method, target, headers, body)
        except UpstreamError as exc:
            log.warning("request to %s failed: %s %s: %s", child.model, method, target, exc)
            return None

    def _observe(self, client: Client, status: int, sent: int, relayed: int) -> None:
        """Called once per relayed request, when it ends (whatever the outcome): the
        proxied-request metrics (route, status, bytes relayed both ways)."""
        if self._observer is not None:
            self._observer(client.path, status, sent, relayed)

    async def relay(
        self,
        client: Client,
        *,
        child: Child,
        body: bytes,
        method: str | None = None,
        target: str | None = None,
        detached: bool = False,
        crash_detail: Callable[[], Awaitable[str | None]] | None = None,
        report: RelayReport | None = None,
    ) -> None:
        """Send the request to ``child`` and stream its answer to ``client``.

        ``target``: the path and query for the child (default: the client's, as sent).
        ``detached``: the request is guaranteed to reach the child even if the client
        disconnects while the child has not answered yet (conversation requests, as upstream).
        ``crash_detail``: why the child died (its last log lines), asked for when the
        connection breaks, so the client learns more than "connection lost".
        ``report``: filled with what the access log records (status, times, bytes, the
        answer's tail).
        """
        wire = request_bytes(
            method or client.method,
            client.target if target is None else target.encode("latin-1"),
            client.headers,
            child.port,
            body,
        )
        status, relayed = 500, 0
        answered: UpstreamResponse | None = None  # (for the report, once there is one)
        try:
            try:
                if detached:
                    with trio.CancelScope(shield=True):
                        upstream = await self._pool.send(child, wire)
                else:
                    upstream = await self._pool.send(child, wire)
            except UpstreamError as exc:
                log.warning("proxy error for %s %s: %s", child.model, client.path, exc)
                text = f"proxy error: {exc}"
                detail = await crash_detail() if crash_detail is not None else None
                if detail:
                    text += f" ({detail})"
                if report is not None:
                    report.error = text
                    report.first_byte = trio.current_time()
                await client.respond(500, text.encode(), "text/plain")
                return
            answered, status = upstream, upstream.status_code
            try:
                relayed = await self._stream(client, upstream, crash_detail, report)
                if report is not None:
                    report.whole = True
            except ChildLost as exc:
                if report is not None:
                    report.error = f"child connection lost: {exc}"
                raise
            finally:
                # Closing an unfinished answer tells the child the client is gone, so
                # it stops generating; a finished one returns its connection to the pool.
                upstream.close()
        finally:
            if report is not None:  # (a stream cut short: what its writes counted)
                report.status = status
                report.bytes_out = _body_out(answered, relayed, report)
            self._observe(client, status, len(body), relayed)

    async def answer(
        self,
        client: Client,
        upstream: UpstreamResponse,
        sent: int,
        report: RelayReport | None = None,
        lost: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        """Stream an answer already under way (``upstream``, from a pool of the caller's:
        a peer node's) to ``client``, as `relay` does; ``sent``: request body bytes;
        ``report``: filled as `relay` fills it (a forwarding node's access record);
        ``lost``: why the answer broke off, for a stream's final error event."""
        relayed = 0
        sse = (upstream.content_type or b"").startswith(b"text/event-stream")
        try:
            try:
                if sse and upstream.chunked:  # (re-framed in whole events, for 1.0 too)
                    relayed = await self._stream_events(client, upstream, lost, report)
                else:
                    relayed = await self._stream(client, upstream, lost, report)
                if report is not None:
                    report.whole = True
            except ChildLost as exc:
                if report is not None:
                    report.error = f"connection to the node lost: {exc}"
                raise
            finally:
                upstream.close()
        finally:
            if report is not None:  # (a relay cut short: what its writes counted)
                report.status = upstream.status_code
                report.bytes_out = _body_out(upstream, relayed, report)
            self._observe(client, upstream.status_code, sent, relayed)

    async def _stream(
        self,
        client: Client,
        upstream: UpstreamResponse,
        crash_detail: Callable[[], Awaitable[str | None]] | None,
        report: RelayReport | None,
    ) -> int:
        """Head, then body bytes as they come; returns the body bytes relayed."""
        sse = (upstream.content_type or b"").startswith(b"text/event-stream")
        head = client.head(upstream.status_code, response_fields(upstream), length=None)
        if report is not None:
            report.sse = sse
        if upstream.chunked and not client.framing:
            return await self._stream_decoded(client, upstream, head, report)
        passthrough = upstream.chunked  # the child's framing is the client's
        relayed = 0
        timeout = upstream.read_timeout
        try:
            data = upstream.take_first()
            if upstream.complete:  # the whole answer came with its head: one write, no read
                out = head + (data if passthrough else client.chunk(data) + client.last_chunk)
                await client.send(out)
                if report is not None:
                    _note(report, data)
                return len(data)
            bumped = trio.current_time()
            with trio.CancelScope(deadline=bumped + (timeout or math.inf)) as reads:
                if not data and not passthrough and not upstream.complete:
                    # A whole answer whose body came apart from its head: wait for it,
                    # so both go out in one write. A stream's head goes out at once.
                    data = await upstream.receive_raw()
                out = head + (data if passthrough else client.chunk(data))
                while True:
                    if upstream.complete and not passthrough:
                        out += client.last_chunk
                    await client.send(out)
                    relayed += len(data)
                    if report is not None:
                        _note(report, data)
                    if upstream.complete:
                        return relayed
                    data = await upstream.receive_raw()
                    out = data if passthrough else client.chunk(data)
                    if timeout is not None:
                        now = trio.current_time()
                        if now - bumped > _BUMP:
                            reads.deadline = now + timeout
                            bumped = now
            raise UpstreamError("Read timeout")
        except UpstreamError as exc:
            log.warning("child connection lost during %s: %s", client.path, exc)
            if not sse or upstream.mid_chunk:
                raise ChildLost(str(exc)) from exc  # a truncated body must look truncated
            # An SSE client gets a final error event, as llama-server sends for a failed stream.
            detail = await crash_detail() if crash_detail is not None else None
            message = "the model's server closed the connection" + (f": {detail}" if detail else "")
            if report is not None:
                report.error = message
            await client.send(client.chunk(_error_event(message)) + client.last_chunk)
            return relayed
        except trio.Cancelled:
            if sse and client.server_stopping:
                await self._last_word(client, upstream, passthrough)
            raise

    async def _last_word(
        self, client: Client, upstream: UpstreamResponse, passthrough: bool
    ) -> None:
        """The router stops: end an SSE stream at a chunk boundary with a final event."""
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH_CHUNK + CLOSE_GRACE):
            try:
                with trio.move_on_after(FINISH_CHUNK):
                    while passthrough and upstream.mid_chunk and not upstream.complete:
                        await client.send(await upstream.receive_raw())
                if passthrough and upstream.mid_chunk:
                    return  # no boundary reached: the stream is cut, as it must be
                event = _error_event("the router is shutting down", 503, "unavailable_error")
                await client.send(client.chunk(event) + client.last_chunk)
            except (UpstreamError, Exception):  # the client may be gone too
                return

    async def _stream_events(
        self,
        client: Client,
        upstream: UpstreamResponse,
        lost: Callable[[], Awaitable[str | None]] | None,
        report: RelayReport | None,
    ) -> int:
        """An SSE answer from another node, framed anew in whole events: the node's own
        chunks need not end where an event does (its reads of its child's stream are
        passed on as they came), so an answer that breaks off (the node died or hung)
        could not be ended with an error event after a partial one. Here what went out
        always ends with a whole event, and a break ends the stream with an error
        event, as llama-server ends a failed stream."""
        head = client.head(upstream.status_code, response_fields(upstream), length=None)
        if report is not None:
            report.sse = True
        await client.send(head)
        if report is not None:
            report.first_byte = trio.current_time()
        relayed = 0
        held = b""  # the start of an event whose end has not come yet
        try:
            async for piece in upstream.chunks():
                data = held + piece if held else piece
                end = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4)
                if end < 2 and len(data) < HELD_MAX:
                    held = data
                    continue
                end = end if end >= 2 else len(data)  # (no event ends this long: sent on)
                out, held = (data, b"") if end == len(data) else (data[:end], data[end:])
                await client.send(client.chunk(out))
                relayed += len(out)
                if report is not None:
                    _note(report, out)
            if held:  # (a stream that does not end with a blank line: sent as it is)
                await client.send(client.chunk(held))
                relayed += len(held)
                if report is not None:
                    _note(report, held)
            await client.send(client.last_chunk)
        except UpstreamError as exc:
            log.warning("connection lost during %s: %s", client.path, exc)
            detail = await lost() if lost is not None else None
            message = "the model's server closed the connection" + (f": {detail}" if detail else "")
            if report is not None:
                report.error = message
            await client.send(client.chunk(_error_event(message)) + client.last_chunk)
        return relayed

    async def _stream_decoded(
        self,
        client: Client,
        upstream: UpstreamResponse,
        head: bytes,
        report: RelayReport | None,
    ) -> int:
        """A chunked answer for a client that cannot take chunks (HTTP/1.0)."""
        relayed = 0
        await client.send(head)
        if report is not None:
            report.first_byte = trio.current_time()
        try:
            async for piece in upstream.chunks():
                await client.send(piece)
                relayed += len(piece)
                if report is not None:
                    _note(report, piece)
        except UpstreamError as exc:
            raise ChildLost(str(exc)) from exc
        return relayed


def _body_out(upstream: UpstreamResponse | None, relayed: int, report: RelayReport) -> int:
    """The answer's body bytes the client was sent, chunk framing left out (a child's
    chunked stream passes through with its framing; a whole answer is framed anew)."""
    if upstream is None:
        return report.bytes_out  # (the relay's own error answer)
    wrote = max(relayed, report.bytes_out)  # with the child's framing when passed through
    return min(upstream.body_bytes, wrote) if upstream.chunked else wrote


def _note(report: RelayReport, data: bytes) -> None:
    """One write to the client went out: its times (the clock read only for the first
    ones), and the answer's tail."""
    if report.first_byte is None:
        report.first_byte = trio.current_time()
    if data:
        if report.first_body is None:
            report.first_body = trio.current_time()
        report.keep(data)
        report.bytes_out += len(data)
        if report.sse:  # text events (llama.cpp's "content", OpenAI's "text"), as sent
            report.tokens += data.count(b'content":"') + data.count(b'"text":"')
