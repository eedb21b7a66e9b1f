"""Every connection has a bounded life, on the server with a minimal handler
over real sockets: the head deadline counts empty lines before the request, a body has
a total deadline, connections past the cap get 503 (GET /health still answered), and a
chunked body's trailer fields never become headers."""

from __future__ import annotations

import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.exchange import Exchange
from troupe.http.server.lifecycle import HttpServer
from troupe.http.server.parse import Refusal, Request, RequestParser
from troupe_rig.bare_server import read_all, serve_bare


class Echo:
    """Answers with the request's header names (and its body's size)."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.hold_health = False  # GET /health waits for `release` (set `entered` first)
        self.entered = trio.Event()
        self.release = trio.Event()
        self.holding = 0  # requests for /hold waiting for `release`
        self.two_held = trio.Event()

    def base_head(self, request: Request) -> bytes:
        return b"Server: llama.cpp\r\n"

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        pass  # no access log here

    def admit(self, request: Request) -> Refusal | None:
        return None

    async def serve(self, exchange: Exchange) -> None:
        self.seen.append(exchange.request)
        if exchange.path == "/hold":
            self.holding += 1
            if self.holding == 2:
                self.two_held.set()
            await self.release.wait()
        if exchange.path == "/health" and self.hold_health:
            self.entered.set()
            await self.release.wait()
        names = b",".join(k for k, _ in exchange.headers)
        await exchange.respond(200, b"%b|%d" % (names, len(exchange.body)), "text/plain")

    async def upgrade(self, exchange: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        raise AssertionError("no upgrades here")


async def start(nursery: trio.Nursery, config: ServerConfig) -> tuple[HttpServer, Echo, int]:
    return await serve_bare(nursery, Echo(), config)


async def trickle(stream: trio.SocketStream, piece: bytes, closed: trio.Event) -> None:
    """``piece`` every 50 ms until the server closes (or 10 s)."""
    with trio.move_on_after(10):
        while not closed.is_set():
            try:
                await stream.send_all(piece)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            await trio.sleep(0.05)


async def test_empty_lines_before_a_request_do_not_restart_the_clock() -> None:
    async with trio.open_nursery() as nursery:
        # keep-alive far longer than the head deadline: only the head deadline can end it
        server, _, port = await start(
            nursery, ServerConfig(head_timeout=0.5, keep_alive_timeout=30)
        )
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        closed = trio.Event()
        nursery.start_soon(trickle, stream, b"\r\n", closed)
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
        closed.set()
        assert data.startswith(b"HTTP/1.1 408 "), data[:60]
        await stream.aclose()
        await server.drain(0)


async def test_a_body_trickled_within_the_read_timeout_still_has_a_total_deadline() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(read_timeout=30, body_timeout=0.5)
        server, handler, port = await start(nursery, config)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        closed = trio.Event()
        nursery.start_soon(trickle, stream, b"a", closed)
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
        closed.set()
        assert data.startswith(b"HTTP/1.1 408 "), data[:60]
        assert handler.seen == []
        await stream.aclose()
        await server.drain(0)


async def test_past_the_connection_cap_only_health_is_answered_then_503() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(max_connections=2, health_reserve=1, keep_alive_timeout=30)
        server, handler, port = await start(nursery, config)
        held = []
        for _ in range(2):  # the cap, each busy with a request that waits
            s = await trio.open_tcp_stream("127.0.0.1", port)
            await s.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            held.append(s)
        with trio.fail_after(10):
            await handler.two_held.wait()
        probe = await trio.open_tcp_stream("127.0.0.1", port)  # in the reserve
        await probe.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_all(probe)).startswith(b"HTTP/1.1 200 ")  # answered, then closed
        other = await trio.open_tcp_stream("127.0.0.1", port)  # in the reserve, not health
        await other.send_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
        )
        got = await read_all(other)
        assert got.startswith(b"HTTP/1.1 503 ")
        assert b'"code":503' in got
        # The reserve taken: a connection beyond it is turned away at once.
        handler.hold_health = True
        reserve = await trio.open_tcp_stream("127.0.0.1", port)
        await reserve.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(10):
            await handler.entered.wait()
        beyond = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await read_all(beyond)).startswith(b"HTTP/1.1 503 ")
        handler.release.set()
        assert (await read_all(reserve)).startswith(b"HTTP/1.1 200 ")
        for s in held:
            assert (await read_all(s)).startswith(b"HTTP/1.1 200 ")
        await server.drain(0)
        assert len(handler.seen) == 4  # the two held, /health twice


async def test_at_the_cap_a_new_connection_takes_the_place_of_an_idle_one() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(max_connections=2, health_reserve=0, keep_alive_timeout=30)
        server, _, port = await start(nursery, config)
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        for s in idle:  # one request each, then idle on keep-alive
            await s.send_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            with trio.fail_after(10):
                assert (await s.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
        new = await trio.open_tcp_stream("127.0.0.1", port)
        await new.send_all(b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_all(new)).startswith(b"HTTP/1.1 200 ")  # served, not 503
        closed: list[trio.SocketStream] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as watchers:

                async def watch(s: trio.SocketStream) -> None:
                    if await s.receive_some(65536) == b"":
                        closed.append(s)
                        watchers.cancel_scope.cancel()

                for s in idle:
                    watchers.start_soon(watch, s)
        assert len(closed) == 1  # one idle connection made room, without an answer
        for s in idle:
            await s.aclose()
        await server.drain(0)


async def test_trailer_fields_are_dropped_not_merged_into_headers() -> None:
    async with trio.open_nursery() as nursery:
        server, handler, port = await start(nursery, ServerConfig())
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
            b"\r\n3\r\nabc\r\n0\r\nAuthorization: Bearer SECRET\r\nX-Trailer: 1\r\n\r\n"
        )
        data = await read_all(stream)
        assert data.endswith(b"|3")
        assert b"authorization" not in data
        assert b"x-trailer" not in data
        assert [k for k, _ in handler.seen[0].headers] == [
            b"host",
            b"transfer-encoding",
            b"connection",
        ]
        await server.drain(0)


def test_the_parser_drops_trailers_and_normalises_absolute_form() -> None:
    parser = RequestParser(1 << 20)
    parser.feed(
        b"POST http://Example.com:80/a/b?c=d HTTP/1.1\r\nHost: other\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\nHost: evil\r\n\r\n"
    )
    request = parser.ready.popleft()
    assert request.target == b"/a/b?c=d"
    assert request.path == "/a/b"
    assert request.authority == b"Example.com:80"
    assert request.headers == [(b"host", b"other"), (b"transfer-encoding", b"chunked")]
    assert request.body == b"x"
