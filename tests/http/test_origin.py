"""The Origin check: a web page the user visits cannot drive troupe.

A browser sends ``Origin`` with every cross-site POST (a "simple" ``text/plain`` one
included: no preflight, the request runs) and with every WebSocket handshake. One
whose origin is not allowed is refused with 403 at the head, before any handler runs,
key or no key, as Ollama does; requests without ``Origin`` (curl, SDKs, servers) and
pages of a loopback origin or of troupe's own host go through. Raw bytes over real
sockets; the `exchange` helpers are the edge tests'."""

from __future__ import annotations

import json

import pytest

from troupe_rig.router import RouterFactory
from troupe_rig.wire import connect, exchange, first_answer

EVIL = b"http://evil.example"


def simple_post(path: bytes, body: bytes, origin: bytes | None, extra: bytes = b"") -> bytes:
    """A CORS "simple request": what any page can make a browser send, unasked."""
    head = b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n" % path
    if origin is not None:
        head += b"Origin: %b\r\n" % origin
    return head + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body


def get(path: bytes, origin: bytes | None, host: bytes = b"127.0.0.1", extra: bytes = b"") -> bytes:
    head = b"GET %b HTTP/1.1\r\nHost: %b\r\n" % (path, host)
    if origin is not None:
        head += b"Origin: %b\r\n" % origin
    return head + extra + b"Connection: close\r\n\r\n"


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_page_of_another_site_cannot_load_a_model_or_read_anything(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        got = await exchange(router, simple_post(b"/models/load", b'{"model":"a"}', EVIL))
        assert status(got) == 403, got[:200]
        body = json.loads(got.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["type"] == "permission_error"
        assert b"Access-Control-Allow-Origin" not in got  # its page reads nothing
        for path in (b"/troupe/history", b"/troupe/version", b"/v1/models", b"/health"):
            got = await exchange(router, get(path, EVIL))
            assert status(got) == 403, path
            assert b"Access-Control-Allow-Origin" not in got, path
        for origin in (b"null", b"http://127.0.0.1.evil.example", b"chrome-extension://abc"):
            assert status(await exchange(router, get(b"/v1/models", origin))) == 403, origin
        # A preflight is refused too (the browser then sends nothing).
        preflight = b"OPTIONS /models/load HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: %b\r\n"
        got = await exchange(router, preflight % EVIL + b"Connection: close\r\n\r\n")
        assert status(got) == 403
        assert router.status("a") == "unloaded"  # the load never ran
        # The same POST without an Origin (curl, an SDK) or from a loopback page runs.
        for origin in (None, b"http://localhost:5173", b"http://127.0.0.1:3000"):
            got = await exchange(router, simple_post(b"/models/unload", b'{"model":"a"}', origin))
            assert status(got) == 400, got[:200]  # "model is not running": it ran
        got = await exchange(router, simple_post(b"/models/load", b'{"model":"a"}', None))
        assert status(got) == 200, got[:200]
        await router.wait_for_status("a", "loaded")
        got = await exchange(router, simple_post(b"/models/unload", b'{"model":"a"}', EVIL))
        assert status(got) == 403
        assert router.status("a") == "loaded"


async def test_troupe_s_own_pages_and_loopback_origins_pass(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--allowed-hosts", "troupe.lan") as router:
        port = router.url.rsplit(":", 1)[1].encode()
        own = b"http://127.0.0.1:" + port
        for origin in (own, b"http://localhost:1", b"https://[::1]:8443", b"http://app.localhost"):
            got = await exchange(router, get(b"/troupe/history", origin))
            assert status(got) == 200, origin
            assert b"Access-Control-Allow-Origin: " + origin + b"\r\n" in got
        # Behind a reverse proxy that passes the public Host: the page is of that host.
        got = await exchange(router, get(b"/v1/models", b"https://troupe.lan", b"troupe.lan"))
        assert status(got) == 200
        got = await exchange(router, get(b"/v1/models", b"https://other.lan", b"troupe.lan"))
        assert status(got) == 403


async def test_the_origin_is_checked_before_the_key(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-key", "K") as router:
        key = b"Authorization: Bearer K\r\n"
        assert status(await exchange(router, get(b"/v1/models", EVIL, extra=key))) == 403
        assert status(await exchange(router, get(b"/v1/models", None, extra=key))) == 200
        got = await exchange(router, simple_post(b"/models/load", b'{"model":"a"}', EVIL, key))
        assert status(got) == 403
        assert router.status("a") == "unloaded"


@pytest.mark.parametrize(
    ("listed", "allowed", "refused"),
    [
        ("https://app.example", b"https://app.example", b"https://app.example.evil"),
        ("https://a.example, https://b.example/", b"https://b.example", b"http://b.example"),
        ("*", b"http://anything.example", None),
    ],
)
async def test_cors_origins_lists_what_else_may_call(
    fake_router: RouterFactory, listed: str, allowed: bytes, refused: bytes | None
) -> None:
    async with fake_router({"a": {}}, "--cors-origins", listed) as router:
        assert status(await exchange(router, get(b"/v1/models", allowed))) == 200
        assert status(await exchange(router, get(b"/v1/models", b"http://localhost:80"))) == 200
        if refused is not None:
            assert status(await exchange(router, get(b"/v1/models", refused))) == 403


async def test_a_websocket_from_another_site_is_refused(fake_router: RouterFactory) -> None:
    wire = (
        b"GET /v1/realtime?model=a HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nOrigin: %b\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(wire % EVIL)
        got = await first_answer(stream)
        assert got.startswith(b"HTTP/1.1 403 "), got[:80]
        await stream.aclose()
        stream = await connect(router)
        await stream.send_all(wire % b"http://localhost:3000")
        assert (await first_answer(stream)).startswith(b"HTTP/1.1 101 ")
        await stream.aclose()


async def test_health_answers_inside_and_outside_the_api_prefix_without_a_key(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-prefix", "/P", "--api-key", "K") as router:
        for path in (b"/P/health", b"/health", b"/P/v1/health", b"/v1/health"):
            got = await exchange(router, get(path, None))
            assert status(got) == 200, path
            assert got.endswith(b'{"status":"ok"}')
        assert status(await exchange(router, get(b"/P/v1/models", None))) == 401
        assert status(await exchange(router, get(b"/v1/models", None))) == 401
        key = b"X-Api-Key: K\r\n"
        assert status(await exchange(router, get(b"/P/v1/models", None, extra=key))) == 200
        assert status(await exchange(router, get(b"/v1/models", None, extra=key))) == 404
