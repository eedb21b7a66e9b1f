"""A small raw-socket HTTP/1.1 client that can misbehave on purpose, and says what it got.

Every exchange has a bound: an answer that does not end within it is ``hung``. Each
request is sent with ``Connection: close``; after the answer the client watches the
connection briefly, so a second answer to the same request (bytes after the response
ended) is seen (``double``), and whether the server closed it is noted. A client can
drop at a chosen point: after sending part of the request, after a delay, after the
response head, or after N stream events.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from chaos.wire import Reader

# What became of one request, from the client's side.
OK = "ok"  # 2xx, complete (a stream ended with [DONE] or its final event)
ERROR = "error"  # a complete non-2xx answer
STREAM_ERROR = "stream-error"  # a 2xx stream that ended with an error event
TRUNCATED = "truncated"  # the answer started, then the connection closed mid-way
RESET = "reset"  # closed (or refused) before any answer
HUNG = "hung"  # no complete answer within the bound
DROPPED = "dropped"  # the client left on purpose before the answer ended
DOUBLE = "double"  # bytes after the end of the answer: answered more than once
GARBLED = "garbled"  # not HTTP


@dataclass
class Drop:
    """Where the client leaves: after ``send_bytes`` of the request, ``after_s`` seconds
    after sending, after the response head, or after ``events`` stream events."""

    send_bytes: int | None = None
    after_s: float | None = None
    after_head: bool = False
    events: int | None = None


@dataclass
class Answer:
    kind: str
    status: int = 0
    elapsed: float = 0.0
    body: bytes = b""
    events: list[bytes] = field(default_factory=list)
    detail: str = ""
    first_byte_s: float | None = None
    server_closed: bool | None = None  # after a complete answer: did the server close?
    extra: bytes = b""  # what came after the end of the answer

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def error_message(self) -> str:
        data = self.json()
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message", ""))
        if self.events:
            with contextlib.suppress(ValueError):
                last = json.loads(self.events[-1])
                if isinstance(last, dict) and isinstance(last.get("error"), dict):
                    return str(last["error"].get("message", ""))
        return self.body[:200].decode(errors="replace")

    def brief(self) -> str:
        return f"{self.kind}{f' {self.status}' if self.status else ''}"


def request_bytes(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def _events(body: bytes) -> list[bytes]:
    return [ln[6:] for ln in body.split(b"\n") if ln.startswith(b"data: ")]


def _classify(parser: Reader, body: bytes) -> str:
    if not 200 <= parser.status < 300:
        return ERROR
    if not parser.streaming:
        return OK
    events = _events(body)
    if events and events[-1].strip() == b"[DONE]":
        return OK
    if events:
        with contextlib.suppress(ValueError):
            last = json.loads(events[-1])
            if isinstance(last, dict) and "error" in last:
                return STREAM_ERROR
            if isinstance(last, dict) and last.get("stop") is True:
                return OK  # llama.cpp's own /completion stream: no [DONE]
    return STREAM_ERROR if b'"error"' in body else TRUNCATED


async def exchange(
    address: tuple[str, int],
    wire: bytes,
    *,
    bound: float,
    drop: Drop | None = None,
    half_close: bool = False,
    started: trio.Event | None = None,
    watch_after: bool = True,
) -> Answer:
    """Send ``wire`` and read the answer; never takes longer than ``bound`` (+ 1 s to
    see whether a second answer follows). ``started`` is set at the first body byte."""
    t0 = time.monotonic()
    parser = Reader()
    result: Answer | None = None
    stream: trio.SocketStream | None = None
    with trio.move_on_after(bound) as scope:
        try:
            stream = await trio.open_tcp_stream(*address)
        except OSError as exc:
            return Answer(RESET, elapsed=time.monotonic() - t0, detail=f"connect: {exc}")
        try:
            result = await _talk(stream, wire, parser, t0, drop, half_close, started, watch_after)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            result = Answer(
                TRUNCATED if parser.status else RESET,
                parser.status,
                time.monotonic() - t0,
                b"".join(parser.body),
                detail=str(exc) or type(exc).__name__,
            )
        except (ValueError, IndexError) as exc:
            result = Answer(GARBLED, elapsed=time.monotonic() - t0, detail=str(exc)[:80])
    if stream is not None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()
    if scope.cancelled_caught or result is None:
        body = b"".join(parser.body)
        return Answer(HUNG, parser.status, time.monotonic() - t0, body, _events(body))
    return result


async def _talk(
    stream: trio.SocketStream,
    wire: bytes,
    parser: Reader,
    t0: float,
    drop: Drop | None,
    half_close: bool,
    started: trio.Event | None,
    watch_after: bool,
) -> Answer:
    def answer(kind: str, detail: str = "") -> Answer:
        body = b"".join(parser.body)
        first = parser.first_body_at - t0 if parser.first_body_at else None
        return Answer(
            kind, parser.status, time.monotonic() - t0, body, _events(body), detail, first
        )

    if drop is not None and drop.send_bytes is not None:
        await stream.send_all(wire[: drop.send_bytes])
        return answer(DROPPED, "while sending")
    await stream.send_all(wire)
    if half_close:
        with contextlib.suppress(OSError, trio.BrokenResourceError):
            await stream.send_eof()
    deadline = time.monotonic() + drop.after_s if drop and drop.after_s is not None else None
    while not parser.done:
        with trio.move_on_at(_trio_deadline(deadline)):
            data = await stream.receive_some(65536)
            if not data:
                if not parser.status:
                    return answer(RESET, "closed before any answer")
                if parser.mode != "eof":
                    return answer(TRUNCATED, "closed mid-answer")
                return answer(_classify(parser, b"".join(parser.body)))
            parser.feed(data)
            if started is not None and parser.body:
                started.set()
            if drop is not None:
                if drop.after_head and parser.status:
                    return answer(DROPPED, "after the head")
                if drop.events is not None and len(_events(b"".join(parser.body))) >= drop.events:
                    return answer(DROPPED, f"after {drop.events} events")
            continue
        return answer(DROPPED, f"after {drop.after_s if drop else 0:g} s")
    kind = _classify(parser, b"".join(parser.body))
    done = answer(kind)  # timed now: the wait below is not the server's latency
    if not watch_after:
        return done
    extra, closed = await _after_end(stream, parser)
    done.server_closed = closed
    done.extra = extra
    if extra:
        done.kind = DOUBLE
        done.detail = f"{len(extra)} bytes after the answer: {extra[:60]!r}"
    return done


def _trio_deadline(deadline: float | None) -> float:
    if deadline is None:
        return float("inf")
    return trio.current_time() + max(0.0, deadline - time.monotonic())


AFTER_END_S = 0.1  # how long to watch for a second answer (and for the server's close)


async def _after_end(stream: trio.SocketStream, parser: Reader) -> tuple[bytes, bool]:
    """Bytes after the answer's end, and whether the server closed (we asked it to)."""
    extra = bytes(parser.buf)
    closed = False
    with trio.move_on_after(AFTER_END_S):
        try:
            while data := await stream.receive_some(65536):
                extra += data
            closed = True
        except (OSError, trio.BrokenResourceError):
            closed = True
    return extra, closed


class Client:
    """Requests to one router, with the bound given per call."""

    def __init__(self, url: str) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        host, _, port = host_port.rpartition(":")
        self.address = (host, int(port))
        self.url = url

    async def raw(self, wire: bytes, bound: float, **kw: Any) -> Answer:
        return await exchange(self.address, wire, bound=bound, **kw)

    async def call(
        self,
        method: str,
        path: str,
        payload: object | None = None,
        *,
        bound: float,
        headers: dict[str, str] | None = None,
        drop: Drop | None = None,
        started: trio.Event | None = None,
        watch_after: bool = True,
    ) -> Answer:
        body = None if payload is None else json.dumps(payload).encode()
        wire = request_bytes(method, path, body, headers, f"{self.address[0]}:{self.address[1]}")
        return await exchange(
            self.address, wire, bound=bound, drop=drop, started=started, watch_after=watch_after
        )

    async def get_json(self, path: str, bound: float = 10.0) -> Any:
        got = await self.call("GET", path, bound=bound, watch_after=False)
        if got.kind not in (OK, ERROR):
            raise RuntimeError(f"GET {path}: {got.brief()} {got.detail}")
        return got.json()

    async def completion(
        self,
        model: str,
        *,
        bound: float,
        n: int = 4,
        stream: bool = False,
        drop: Drop | None = None,
        headers: dict[str, str] | None = None,
        started: trio.Event | None = None,
    ) -> Answer:
        """``/v1/completions`` (streams end with ``[DONE]``)."""
        payload = {"model": model, "prompt": "hello", "max_tokens": n, "stream": stream}
        return await self.call(
            "POST", "/v1/completions", payload, bound=bound, drop=drop, headers=headers,
            started=started,
        )  # fmt: skip
