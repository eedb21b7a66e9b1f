"""The HTTP edge as an attacker meets it, raw bytes over real sockets: a
request without a key costs nothing (decided at the head, before any body byte or
``100 Continue``), trailers are never headers, RFC 9112's MUSTs, the Host check
against DNS rebinding, several named keys."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from troupe_rig.router import RouterFactory, RunningRouter
from troupe_rig.wire import connect, first_answer, until_closed

HUGE = 100 << 20


async def exchange(router: RunningRouter, wire: bytes) -> bytes:
    """``wire`` sent, everything read until the server closes."""
    stream = await connect(router)
    await stream.send_all(wire)
    try:
        return await until_closed(stream)
    finally:
        await stream.aclose()


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


async def test_no_key_with_a_huge_body_and_expect_is_refused_at_the_head(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        stream = await connect(router)
        await stream.send_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % HUGE
        )
        got = await first_answer(stream)  # no body byte sent yet
        assert got.startswith(b"HTTP/1.1 401 "), got[:80]
        assert b"100 Continue" not in got
        assert b"Connection: close" in got
        assert json.loads(body_of(got))["error"]["type"] == "authentication_error"
        # The body is not waited for: the server has closed its side already.
        rest = await until_closed(stream)
        assert b"HTTP/1.1" not in rest
        await stream.aclose()


async def test_a_refused_body_sent_with_its_head_is_never_read_into_the_request(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        body = json.dumps({"model": "a", "prompt": "x"}).encode()
        got = await exchange(
            router,
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%b"
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % (len(body), body),
        )
        assert got.startswith(b"HTTP/1.1 401 ")
        assert got.count(b"HTTP/1.1 ") == 1  # closed: the pipelined request is not served


async def test_an_expect_continue_request_that_will_be_served_gets_100(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        body = json.dumps({"model": "a", "content": "hi"}).encode()
        stream = await connect(router)
        await stream.send_all(
            b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer SECRET\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert (await first_answer(stream)).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        await stream.send_all(body + b"")
        got = await first_answer(stream)
        assert got.startswith(b"HTTP/1.1 200 ")
        await stream.aclose()


async def test_a_key_in_a_chunked_trailer_does_not_authenticate(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        body = json.dumps({"model": "a", "content": "hi"}).encode()
        got = await exchange(
            router,
            b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%b\r\n0\r\nAuthorization: Bearer SECRET\r\nX-Api-Key: SECRET\r\n\r\n"
            % (len(body), body),
        )
        assert got.startswith(b"HTTP/1.1 401 ")


async def test_local_routes_answer_json_413_at_the_head_and_json_for_bad_bodies(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(
            b"POST /models/load HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % (64 << 20)
        )
        got = await first_answer(stream)
        assert got.startswith(b"HTTP/1.1 413 "), got[:80]
        assert b"application/json" in got
        assert json.loads(body_of(got))["error"]["code"] == 413
        await stream.aclose()
        deep = b"[" * 100_000 + b"]" * 100_000
        for bad in (deep, b'{"model": "\xff\xfe"}', b'{"model": '):
            got = await exchange(
                router,
                b"POST /models/load HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(bad), bad),
            )
            assert got.startswith(b"HTTP/1.1 400 "), got[:80]
            assert json.loads(body_of(got))["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("wire", "status"),
    [
        (b"GET /health\r\n\r\n", b"400"),  # HTTP/0.9
        (b"GET /health HTTP/1.1\r\n\r\n", b"400"),  # no Host
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: localhost\r\n\r\n", b"400"),
        (b"GET http://127.0.0.1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"200"),
        (b"GET http://localhost:1/v1/models?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n", b"200"),
        (b"GET ftp://127.0.0.1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"400"),
        (b"GET /health HTTP/1.0\r\n\r\n", b"200"),  # HTTP/1.0 needs no Host
    ],
)
async def test_rfc_9112_request_lines_and_host(
    fake_router: RouterFactory, wire: bytes, status: bytes
) -> None:
    async with fake_router({"a": {}}) as router:
        got = await exchange(router, wire.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert got.split(b" ", 2)[1] == status, got[:120]
        assert b"application/json" in got


async def test_absolute_form_target_with_a_key_is_served(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        got = await exchange(
            router,
            b"GET http://127.0.0.1/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer SECRET\r\nConnection: close\r\n\r\n",
        )
        assert got.startswith(b"HTTP/1.1 200 ")
        assert json.loads(body_of(got))["data"][0]["id"] == "a"


@pytest.mark.parametrize(
    "path", ["/health", "/v1/models", "/props", "/models/sse", "/troupe/", "/props?model=a"]
)
async def test_head_is_get_without_a_body(fake_router: RouterFactory, path: str) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(
            b"HEAD %b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path.encode()
        )
        got = await until_closed(stream)
        await stream.aclose()
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        # Nothing between the HEAD's answer and the next one's: no body.
        assert rest.startswith(b"HTTP/1.1 200 "), rest[:80]
        assert rest.endswith(b'{"status":"ok"}')


async def test_dns_rebinding_host_is_refused_on_loopback(fake_router: RouterFactory) -> None:
    wire = b"GET /v1/models HTTP/1.1\r\nHost: %b\r\nConnection: close\r\n\r\n"
    async with fake_router({"a": {}}) as router:
        for host in (b"evil.example", b"evil.example:8080", b"127.0.0.1.evil.example"):
            got = await exchange(router, wire % host)
            assert got.startswith(b"HTTP/1.1 403 "), got[:80]
            assert json.loads(body_of(got))["error"]["type"] == "permission_error"
        for host in (b"localhost:8080", b"127.0.0.1", b"[::1]:1", b"app.localhost", b"troupe",
                     b"192.168.1.5:80"):  # fmt: skip
            assert (await exchange(router, wire % host)).startswith(b"HTTP/1.1 200 "), host
        # A POST with a body: refused before its body is read.
        got = await exchange(
            router,
            b"POST /models/load HTTP/1.1\r\nHost: rebind.example\r\nContent-Length: 2\r\n\r\n{}",
        )
        assert got.startswith(b"HTTP/1.1 403 ")
    async with fake_router({"a": {}}, "--allowed-hosts", "troupe.lan, other") as router:
        assert (await exchange(router, wire % b"troupe.lan:80")).startswith(b"HTTP/1.1 200 ")
        assert (await exchange(router, wire % b"evil.example")).startswith(b"HTTP/1.1 403 ")


async def test_named_keys_authenticate_and_logs_name_them(
    fake_router: RouterFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# who\nalice:k-alice\nbob:k-bob\n")
    wire = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n%bConnection: close\r\n\r\n"
    args = ("--api-key", "plain", "--named-api-keys", str(keys))
    caplog.set_level(logging.DEBUG, logger="troupe.http")
    async with fake_router({"a": {}}, *args) as router:
        for key in (b"k-alice", b"k-bob", b"plain"):
            got = await exchange(router, wire % (b"Authorization: Bearer " + key + b"\r\n"))
            assert got.startswith(b"HTTP/1.1 200 "), key
        for bad in (b"k-alic", b"k-alicee", b"", b"alice:k-alice"):
            got = await exchange(router, wire % (b"X-Api-Key: " + bad + b"\r\n"))
            assert got.startswith(b"HTTP/1.1 401 "), bad
        assert router.ctx.settings.api_key_names == ("", "alice", "bob")
        book = router.ctx.tenants.current  # the live tenant book the key check reads
        assert [t.name for t in (book.match("k-bob"), book.match("plain")) if t] == [
            "bob",
            "key-1",
        ]
    assert "GET /v1/models by alice" in caplog.text
    assert "GET /v1/models by key-1" in caplog.text
    assert "k-alice" not in caplog.text


async def test_a_websocket_upgrade_from_a_rebinding_host_is_refused(
    fake_router: RouterFactory,
) -> None:
    wire = (
        b"GET /v1/realtime?model=a HTTP/1.1\r\nHost: %b\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(wire % b"rebind.example")
        got = await first_answer(stream)
        assert got.startswith(b"HTTP/1.1 403 "), got[:80]
        await stream.aclose()
        stream = await connect(router)
        await stream.send_all(wire % b"127.0.0.1")
        assert (await first_answer(stream)).startswith(b"HTTP/1.1 101 ")
        await stream.aclose()
