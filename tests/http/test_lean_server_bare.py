"""The server's own mechanics with a minimal handler: timeouts, the drain's steps, a
handler that fails."""

from __future__ import annotations

import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.exchange import Exchange
from troupe.http.server.lifecycle import HttpServer
from troupe.http.server.parse import Refusal, Request
from troupe_rig.bare_server import read_all, serve_bare


class Echo:
    """Answers ``/slow`` after a second, ``/boom`` by raising, anything else at once."""

    def __init__(self) -> None:
        self.started = trio.Event()

    def base_head(self, request: Request) -> bytes:
        return b"Server: llama.cpp\r\n"

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        pass  # no access log here

    def admit(self, request: Request) -> Refusal | None:
        if request.path == "/locked":
            return Refusal(401, b'{"error":"no"}')
        return None

    async def serve(self, exchange: Exchange) -> None:
        if exchange.path == "/boom":
            raise RuntimeError("a bug in a handler")
        if exchange.path == "/slow":
            self.started.set()
            await trio.sleep(1)
        await exchange.respond(200, exchange.path.encode(), "text/plain")

    async def upgrade(self, exchange: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        raise AssertionError("no upgrades here")


async def start(nursery: trio.Nursery, config: ServerConfig) -> tuple[HttpServer, Echo, int]:
    return await serve_bare(nursery, Echo(), config)


async def test_a_client_trickling_its_head_gets_408_and_the_close() -> None:
    async with trio.open_nursery() as nursery:
        server, _, port = await start(nursery, ServerConfig(head_timeout=0.3))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        data = await read_all(stream)
        assert data.startswith(b"HTTP/1.1 408 ")
        assert b'"code":408' in data
        await server.drain(0)


async def test_an_idle_keep_alive_connection_is_closed_after_its_timeout() -> None:
    async with trio.open_nursery() as nursery:
        server, _, port = await start(nursery, ServerConfig(keep_alive_timeout=0.2))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await read_all(stream)  # the answer, then the close once idle
        assert data.startswith(b"HTTP/1.1 200 ")
        assert data.endswith(b"/a")
        await server.drain(0)


async def test_a_failing_handler_gets_a_500_and_the_server_goes_on() -> None:
    async with trio.open_nursery() as nursery:
        server, _, port = await start(nursery, ServerConfig())
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await read_all(stream)
        assert data.startswith(b"HTTP/1.1 500 ")
        assert b"Connection: close" in data
        again = await trio.open_tcp_stream("127.0.0.1", port)
        await again.send_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_all(again)).endswith(b"/ok")
        await server.drain(0)


async def test_the_drain_lets_a_request_in_flight_finish_and_closes_idle_ones() -> None:
    async with trio.open_nursery() as nursery:
        server, handler, port = await start(nursery, ServerConfig())
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        busy = await trio.open_tcp_stream("127.0.0.1", port)
        await busy.send_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await handler.started.wait()
        server.stop_accepting()
        server.close_idle()
        assert await read_all(idle) == b""
        assert server.in_flight == 1
        with trio.fail_after(5):
            await server.wait_requests_done()
        answer = await read_all(busy)  # answered, then closed (no keep-alive while draining)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"Connection: close" in answer
        await server.drain(0)
