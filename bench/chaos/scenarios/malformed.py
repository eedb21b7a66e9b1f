"""Bad bytes over a raw socket: broken request lines, lying or huge Content-Length, bad
chunking, truncated bodies, header floods, deep or invalid JSON, invalid UTF-8, and a few
protocol duties (pipelining, Connection: close). Each case has a bound and the answers
it accepts; a 5xx, a hang, or a second answer is never accepted."""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass

import trio

from chaos.client import DOUBLE, GARBLED, HUNG, RESET, TRUNCATED, Answer, exchange
from chaos.scenario import Ctx, Scenario, preset_launch, until_ok
from chaos.wire import Reader

CLEAR = frozenset({"4xx"})  # a clear error
CLEAR_OR_CLOSE = frozenset({"4xx", "close"})  # for what is not even HTTP
NOT_5XX = frozenset({"2xx", "4xx"})  # the child may take it; the router must not fail
CONV = "chaos-conv"


@dataclass(frozen=True)
class Case:
    name: str
    wire: bytes
    accept: frozenset[str]
    half_close: bool = False  # the client sends EOF after its bytes (a truncated request)
    bound: float = 5.0
    must_close: bool = False  # the server must close the connection after answering


def _req(method: str, path: str, headers: list[str], body: bytes = b"") -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


def _post(body: bytes, path: str = "/v1/completions", extra: tuple[str, ...] = ()) -> bytes:
    headers = ["Content-Type: application/json", f"Content-Length: {len(body)}",
               "Connection: close", *extra]  # fmt: skip
    return _req("POST", path, headers, body)


def _chunked(body: bytes) -> bytes:
    headers = ["Content-Type: application/json", "Transfer-Encoding: chunked", "Connection: close"]
    return _req("POST", "/v1/completions", headers) + body


def corpus() -> list[Case]:
    junk = random.Random(3).randbytes(4096)
    deep = 100_000
    ok_body = json.dumps({"model": "m1", "prompt": "hi", "max_tokens": 2}).encode()
    close = ["Connection: close"]
    return [
        Case("garbage-line", b"GARBAGE\r\n\r\n", CLEAR_OR_CLOSE),
        Case("binary-junk", junk, CLEAR_OR_CLOSE, half_close=True),
        Case("nul-in-path", b"GET /he\x00alth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", CLEAR_OR_CLOSE),
        Case("bad-version", b"GET /health HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
             CLEAR_OR_CLOSE | {"505", "2xx"}),  # taking it as 1.1 is lenient, not wrong
        Case("method-garbage", _req("FROB", "/health", close), NOT_5XX),
        Case("long-url", _req("GET", "/health?x=" + "A" * 65536, close), CLEAR_OR_CLOSE | NOT_5XX),
        Case("header-flood", _req("GET", "/health", [f"X-F{i}: v" for i in range(10_000)]),
             CLEAR_OR_CLOSE),
        Case("huge-header", _req("GET", "/health", ["X-Big: " + "b" * (1 << 20)]),
             CLEAR_OR_CLOSE),
        Case("cl-100gb", _req("POST", "/v1/chat/completions",
                              ["Content-Type: application/json",
                               "Content-Length: 107374182400"]), CLEAR),
        Case("cl-over-limit", _req("POST", "/v1/completions",
                                   ["Content-Type: application/json",
                                    f"Content-Length: {200 << 20}"]), CLEAR),
        Case("cl-negative", _req("POST", "/v1/completions", ["Content-Length: -5", *close]),
             CLEAR_OR_CLOSE),
        Case("cl-garbage", _req("POST", "/v1/completions", ["Content-Length: abc", *close]),
             CLEAR_OR_CLOSE),
        Case("cl-conflict", _req("POST", "/v1/completions",
                                 ["Content-Length: 5", "Content-Length: 7", *close], b"{}{}{}{"),
             CLEAR_OR_CLOSE),
        Case("cl-and-chunked", _req("POST", "/v1/completions",
                                    ["Content-Length: 4", "Transfer-Encoding: chunked", *close],
                                    b"0\r\n\r\n"), CLEAR_OR_CLOSE | NOT_5XX),
        Case("chunk-bad-size", _chunked(b"zz\r\n{}\r\n0\r\n\r\n"), CLEAR_OR_CLOSE),
        Case("chunk-huge-size", _chunked(b"FFFFFFFFFFFFFFFF\r\n{}"), CLEAR_OR_CLOSE,
             half_close=True),
        Case("chunk-no-end", _chunked(b"2\r\n{}\r\n"), CLEAR_OR_CLOSE, half_close=True),
        Case("truncated-body", _req("POST", "/v1/completions",
                                    ["Content-Type: application/json", "Content-Length: 100"],
                                    b'{"model": "m1"'), CLEAR_OR_CLOSE, half_close=True),
        Case("empty-body", _post(b""), CLEAR),
        Case("invalid-json", _post(b'{"model": "m1", "prompt": '), CLEAR),
        Case("json-not-object", _post(b"[1, 2, 3]"), CLEAR),
        Case("json-null", _post(b"null"), CLEAR),
        Case("model-wrong-type", _post(b'{"model": {"x": 1}, "prompt": "hi"}'), CLEAR),
        Case("deep-json", _post(b"[" * deep + b"]" * deep), CLEAR),
        Case("deep-json-object", _post(b'{"model": "m1", "x": ' + b'{"a": ' * deep + b"1"
                                       + b"}" * deep + b"}"), CLEAR | NOT_5XX),
        Case("deep-json-after-model", _post(b'{"model": "m1", "prompt": "hi", "x": ' + b"[" * deep
                                            + b"]" * deep + b"}"), NOT_5XX),
        Case("huge-model-name", _post(json.dumps({"model": "a" * (1 << 20)}).encode()), CLEAR),
        Case("invalid-utf8-model", _post(b'{"model": "\xff\xfe", "prompt": "hi"}'), CLEAR),
        Case("invalid-utf8-prompt", _post(b'{"model": "m1", "prompt": "\xff\xfe\xfd", '
                                          b'"max_tokens": 2}'), NOT_5XX),
        Case("invalid-utf8-path",
             b"GET /\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
             CLEAR_OR_CLOSE),
        Case("bad-percent", _req("GET", "/slots?model=%ZZ%", close), CLEAR),
        Case("websocket-bad-key", _req("GET", "/v1/realtime?model=m1",
                                       ["Upgrade: websocket", "Connection: Upgrade",
                                        "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: !"]),
             CLEAR_OR_CLOSE),
        Case("stream-from-injection", _req("GET", f"/v1/stream?conv_id={CONV}"
                                           "&from=0%0D%0AX-Injected:%201", close), NOT_5XX),
        Case("stream-from-garbage", _req("GET", f"/v1/stream?conv_id={CONV}&from=abc", close),
             NOT_5XX),
        Case("lookup-huge", _post(json.dumps({"conversation_ids": ["x"] * 100_000}).encode(),
                                  "/v1/streams/lookup"), NOT_5XX),
        Case("expect-100", _post(ok_body, extra=("Expect: 100-continue",)), frozenset({"2xx"})),
        Case("connection-close", _req("GET", "/health", close), frozenset({"2xx"}),
             must_close=True),
        Case("http10", b"GET /health HTTP/1.0\r\n\r\n", frozenset({"2xx"}), must_close=True),
        Case("proxied-close", _post(ok_body), frozenset({"2xx"}), must_close=True),
        # The edge's own rows (RFC 9112, decided at the head, local routes' errors in JSON):
        Case("http09", b"GET /health\r\n\r\n", CLEAR_OR_CLOSE),
        Case("h2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", CLEAR_OR_CLOSE),
        Case("no-host", b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", CLEAR),
        Case("two-hosts", _req("GET", "/health", ["Host: localhost", *close]), CLEAR),
        Case("absolute-form", b"GET http://127.0.0.1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Connection: close\r\n\r\n", frozenset({"2xx"})),
        Case("dns-rebinding-host", b"GET /v1/models HTTP/1.1\r\nHost: rebind.example\r\n"
             b"Connection: close\r\n\r\n", CLEAR),
        Case("te-not-chunked", _req("POST", "/v1/completions",
                                    ["Transfer-Encoding: gzip, chunked", *close], b"0\r\n\r\n"),
             CLEAR_OR_CLOSE),
        # A refusal with a huge body announced: answered before a byte of it is sent
        # (the case sends none: a server that sends 100 Continue and waits hangs).
        Case("expect-unknown-route", _req("POST", "/no/such", ["Expect: 100-continue",
                                                               f"Content-Length: {100 << 20}"]),
             CLEAR, must_close=True),
        Case("expect-local-413", _req("POST", "/models/load", ["Expect: 100-continue",
                                                               f"Content-Length: {64 << 20}"]),
             CLEAR, must_close=True),
        Case("deep-json-local", _post(b"[" * deep + b"]" * deep, "/models/load"), CLEAR),
        Case("invalid-utf8-local", _post(b'{"model": "\xff\xfe"}', "/models/load"), CLEAR),
        Case("trailer-fields", _chunked(b"2\r\n{}\r\n0\r\nX-Api-Key: k\r\n\r\n"), CLEAR),
    ]  # fmt: skip


def outcome(answer: Answer) -> str:
    if answer.kind in (HUNG, DOUBLE, GARBLED):
        return answer.kind
    if answer.kind == RESET or (answer.kind == TRUNCATED and not answer.status):
        return "close"
    if answer.status == 505:
        return "505"
    return f"{answer.status // 100}xx" if answer.kind != TRUNCATED else "cut"


async def pipelined(ctx: Ctx) -> str | None:
    """Two requests in one write: two answers, in order, nothing more."""
    wire = _req("GET", "/health", []) + _req("GET", "/v1/models", ["Connection: close"])
    got = await exchange(ctx.client.address, wire, bound=5)
    if got.kind in (HUNG, RESET, GARBLED):
        return f"pipelined: {got.kind}"
    rest = Reader()
    try:
        rest.feed(got.extra)
    except ValueError:
        return "pipelined: the second answer is not HTTP"
    if got.kind != DOUBLE or not rest.done or rest.status != 200:
        return f"pipelined: the second answer is missing ({got.kind})"
    return None


async def dripped(
    ctx: Ctx, head: bytes, piece: bytes, every: float, bound: float
) -> tuple[bytes, float, bool]:
    """``head``, then ``piece`` every ``every`` seconds until the server closes or
    ``bound`` passes: what it answered, the seconds it took, whether ``bound`` passed."""
    t0 = trio.current_time()
    stream = await trio.open_tcp_stream(*ctx.client.address)
    answer = b""
    try:
        with trio.move_on_after(bound) as waited:
            await stream.send_all(head)
            async with trio.open_nursery() as nursery:

                async def drip() -> None:
                    with contextlib.suppress(trio.BrokenResourceError, OSError):
                        while True:
                            await trio.sleep(every)
                            await stream.send_all(piece)

                nursery.start_soon(drip)
                with contextlib.suppress(trio.BrokenResourceError, OSError):
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
    return answer, trio.current_time() - t0, waited.cancelled_caught


async def trickled(ctx: Ctx, name: str, head: bytes, piece: bytes, bound: float) -> str | None:
    """``head``, then ``piece`` every 0.5 s: the server must close within ``bound``
    (troupe: the head deadline counts empty lines; the body has a total deadline)."""
    answer, took, timed_out = await dripped(ctx, head, piece, 0.5, bound)
    ctx.fig(name, f"{took:.1f}s")
    if timed_out:
        return f"{name}: still open after {bound:g} s"
    if answer and not answer.startswith(b"HTTP/1.1 4"):
        return f"{name}: answered {answer[:12]!r}"
    return None


async def malformed(ctx: Ctx) -> None:
    """Every case answered within its bound, as the case accepts."""
    await until_ok(ctx, "setup", "m1", 30)
    await ctx.client.completion("m1", bound=30, headers={"X-Conversation-Id": CONV})  # tracked
    bad: list[str] = []
    cases = corpus()
    for case in cases:
        got = await exchange(
            ctx.client.address, case.wire, bound=case.bound, half_close=case.half_close
        )
        ctx.ledger.add("corpus", got)
        seen = outcome(got)
        if seen not in case.accept:
            more = f" {got.error_message()[:40]!r}" if got.status else ""
            bad.append(f"{case.name}={seen}{more}")
        elif case.must_close and got.server_closed is False:
            bad.append(f"{case.name}=not-closed")
    problem = await pipelined(ctx)
    if problem:
        bad.append(problem)
    body_head = _req("POST", "/v1/completions", ["Content-Length: 1000"])
    for name, head, piece, bound in (
        ("crlf-trickle", b"", b"\r\n", 15.0),  # head deadline 10 s from the first byte
        ("body-trickle", body_head, b" ", 12.0),  # --body-timeout 5 (troupe)
    ):
        problem = await trickled(ctx, name, head, piece, bound)
        if problem:
            bad.append(problem)
    ctx.fig("cases", f"{len(cases) + 1 - len(bad)}/{len(cases) + 1}ok")
    if bad:
        ctx.fail("; ".join(bad))
    # The corpus's own hung or doubled answers are reported above, per case.
    ctx.ledger.records = [r for r in ctx.ledger.records if r.group != "corpus"]


SCENARIOS = [
    Scenario(
        "malformed-input",
        "raw bad bytes",
        preset_launch({"m1": {}}, 1, troupe_extra=lambda ctx: ("--body-timeout", "5")),
        malformed,
    ),
]
