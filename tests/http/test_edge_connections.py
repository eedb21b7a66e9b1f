"""Connections an attacker holds open cannot lock clients out, over real
sockets: at the cap, a new connection takes the place of the oldest that serves
nothing (idle, silent, or its head still incomplete: slowloris), and only when every
one serves does it get 503; a cap per client address; a route that takes no body
refuses one at its head (a public ``GET /health`` cannot hold a connection awaiting a
body); a body must keep a minimum pace after a grace, beside its total bound."""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator

import pytest
import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.exchange import Exchange
from troupe.http.server.lifecycle import HttpServer
from troupe.http.server.parse import Refusal, Request
from troupe_rig.bare_server import read_all, serve_bare
from troupe_rig.router import RouterFactory
from troupe_rig.wire import connect, first_answer, until_closed

HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: never complete
HOLD = b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


class Holds:
    """Answers 200 with the request's path; ``GET /hold`` first says it arrived
    (`arrived`) and waits for `release`."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.release = trio.Event()
        self._arrived, self._arrivals = trio.open_memory_channel[None](1000)

    async def arrived(self, n: int) -> None:
        """Until ``n`` more requests for /hold are being served."""
        with trio.fail_after(10):
            for _ in range(n):
                await self._arrivals.receive()

    def base_head(self, request: Request) -> bytes:
        return b"Server: llama.cpp\r\n"

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        pass

    def admit(self, request: Request) -> Refusal | None:
        return None

    async def serve(self, exchange: Exchange) -> None:
        self.paths.append(exchange.path)
        if exchange.path == "/hold":
            self._arrived.send_nowait(None)
            await self.release.wait()
        await exchange.respond(200, exchange.path.encode(), "text/plain")

    async def upgrade(self, exchange: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        raise AssertionError("no upgrades here")


async def start(nursery: trio.Nursery, config: ServerConfig) -> tuple[HttpServer, Holds, int]:
    return await serve_bare(nursery, Holds(), config)


async def tcp(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


@pytest.fixture
def many_files() -> Iterator[None]:
    """Descriptors for a few thousand sockets (both ends live in this process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 12000 if hard == resource.RLIM_INFINITY else min(hard, 12000)
    if want < 9000:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: too few descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def open_many(port: int, n: int, wire: bytes) -> list[trio.socket.SocketType]:
    """``n`` connections, each having sent ``wire`` and nothing more."""
    socks = []
    for _ in range(n):
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", port))
        await sock.send(wire)
        socks.append(sock)
    return socks


async def trickle(stream: trio.SocketStream, closed: trio.Event) -> None:
    """A byte every 50 ms until the server closes (or 10 s)."""
    with trio.move_on_after(10):
        while not closed.is_set():
            try:
                await stream.send_all(b" ")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            await trio.sleep(0.05)


def close_all(socks: list[trio.socket.SocketType]) -> None:
    for sock in socks:
        sock.close()


async def test_two_thousand_half_heads_do_not_lock_a_client_out(many_files: None) -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(keep_alive_timeout=30)  # the default cap, 1024
        server, handler, port = await start(nursery, config)
        socks = await open_many(port, 2000, HALF_HEAD)
        try:
            client = await tcp(port)
            await client.send_all(b"GET /real HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got = await read_all(client)
            assert got.startswith(b"HTTP/1.1 200 "), got[:80]
            assert handler.paths == ["/real"]
            assert len(server.connections) <= config.max_connections
            assert server.reclaims > 0
        finally:
            close_all(socks)
        await server.drain(0)
        assert (server.connections, server.resting, server.per_client) == (set(), {}, {})


async def test_at_the_cap_the_oldest_connection_serving_nothing_makes_room() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(max_connections=3, health_reserve=0, keep_alive_timeout=30)
        server, handler, port = await start(nursery, config)
        half = await tcp(port)  # the oldest: one request, then half a head
        await half.send_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await first_answer(half)).startswith(b"HTTP/1.1 200 ")
        await half.send_all(HALF_HEAD)
        silent = await tcp(port)  # nothing sent
        busy = await tcp(port)
        await busy.send_all(HOLD)
        await handler.arrived(1)
        # The cap is full: the half-sent head (resting the longest) makes room first.
        second = await tcp(port)
        await second.send_all(HOLD)
        await handler.arrived(1)
        assert b"HTTP/1.1" not in await read_all(half)  # closed, unanswered
        # Then the silent one.
        third = await tcp(port)
        await third.send_all(HOLD)
        await handler.arrived(1)
        assert await read_all(silent) == b""
        # Every connection serves a request now: a new one gets the 503.
        late = await tcp(port)
        got = await read_all(late)
        assert got.startswith(b"HTTP/1.1 503 "), got[:80]
        assert b"too many open connections" in got
        handler.release.set()
        for s in (busy, second, third):
            assert (await read_all(s)).startswith(b"HTTP/1.1 200 ")
        assert handler.paths == ["/a", "/hold", "/hold", "/hold"]
        await server.drain(0)


async def test_the_cap_per_client_address() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(
            max_connections=100, max_per_client=2, per_client_loopback=True, keep_alive_timeout=30
        )
        server, handler, port = await start(nursery, config)
        held = []
        for _ in range(2):
            s = await tcp(port)
            await s.send_all(HOLD)
            held.append(s)
        await handler.arrived(2)
        third = await tcp(port)  # the same address, its two connections serving
        got = await read_all(third)
        assert got.startswith(b"HTTP/1.1 503 "), got[:80]
        assert b"too many open connections from this address" in got
        assert server.per_client == {"127.0.0.1": 2}
        handler.release.set()
        for s in held:
            assert (await read_all(s)).startswith(b"HTTP/1.1 200 ")
        # At its cap with connections serving nothing, its own oldest makes room.
        idle = []
        for _ in range(2):
            s = await tcp(port)
            await s.send_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await first_answer(s)).startswith(b"HTTP/1.1 200 ")
            idle.append(s)
        new = await tcp(port)
        await new.send_all(b"GET /n HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_all(new)).startswith(b"HTTP/1.1 200 ")
        assert b"HTTP/1.1" not in await read_all(idle[0])  # the older one, closed
        await idle[1].send_all(b"GET /m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b"HTTP/1.1 200 " in await read_all(idle[1])
        await server.drain(0)
        assert server.per_client == {}


async def test_loopback_clients_are_not_capped_per_address_by_default() -> None:
    """A proxy on the same host (nginx, HAProxy) is one loopback address for all its
    clients: only the total cap counts for it."""
    async with trio.open_nursery() as nursery:
        config = ServerConfig(max_connections=100, max_per_client=2, keep_alive_timeout=30)
        server, handler, port = await start(nursery, config)
        held = []
        for _ in range(3):
            s = await tcp(port)
            await s.send_all(HOLD)
            held.append(s)
        await handler.arrived(3)
        assert server.per_client == {}
        handler.release.set()
        for s in held:
            assert (await read_all(s)).startswith(b"HTTP/1.1 200 ")
        await server.drain(0)


async def test_a_body_trickled_below_the_minimum_rate_is_closed_after_the_grace() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(body_min_rate=100, body_rate_grace=0.5, read_timeout=30)
        server, handler, port = await start(nursery, config)
        # A body at a pace above the minimum is served, pauses and all.
        ok = await tcp(port)
        await ok.send_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
        await ok.send_all(b"a" * 100)
        await trio.sleep(0.3)  # a pause within the grace (time is what is tested)
        await ok.send_all(b"a" * 100 + b"GET /y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await read_all(ok)).count(b"HTTP/1.1 200 ") == 2
        # A byte every 2 s: 408 once the grace is over, long before --body-timeout.
        slow = await tcp(port)
        await slow.send_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        closed = trio.Event()

        async def every_two_seconds() -> None:
            with trio.move_on_after(30):
                while not closed.is_set():
                    try:
                        await slow.send_all(b"a")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    await trio.sleep(2)

        nursery.start_soon(every_two_seconds)
        t0 = trio.current_time()
        got = await until_closed(slow)
        closed.set()
        assert got.startswith(b"HTTP/1.1 408 "), got[:80]
        assert b"request body too slow (under 100 bytes/s after 0.5 s)" in got
        assert trio.current_time() - t0 < 5  # the pace, not a total bound of 300 s
        assert handler.paths == ["/x", "/y"]
        await slow.aclose()
        await server.drain(0)


async def test_a_health_probe_past_the_cap_with_a_body_gets_the_503() -> None:
    async with trio.open_nursery() as nursery:
        config = ServerConfig(max_connections=1, health_reserve=1, keep_alive_timeout=30)
        server, handler, port = await start(nursery, config)
        busy = await tcp(port)
        await busy.send_all(HOLD)
        await handler.arrived(1)
        probe = await tcp(port)  # in the reserve
        await probe.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        got = await read_all(probe)  # answered at the head, the body never awaited
        assert got.startswith(b"HTTP/1.1 503 "), got[:80]
        handler.release.set()
        assert (await read_all(busy)).startswith(b"HTTP/1.1 200 ")
        await server.drain(0)


@pytest.mark.parametrize(
    ("wire", "shape"),
    [
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n", "llama"),
        (b"HEAD /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n", "llama"),
        (b"OPTIONS / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n", "llama"),
        (b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n", "ollama"),
    ],
)
async def test_a_route_that_takes_no_body_refuses_one_at_the_head(
    fake_router: RouterFactory, wire: bytes, shape: str
) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(wire)  # and no body byte: the answer must not wait for it
        got = await first_answer(stream)
        assert got.startswith(b"HTTP/1.1 400 "), got[:80]
        assert b"Connection: close" in got
        error = json.loads(body_of(got))["error"]
        if shape == "ollama":
            assert "takes no request body" in error
        else:
            assert error["code"] == 400
            assert error["type"] == "invalid_request_error"
            assert "takes no request body" in error["message"]
        assert b"HTTP/1.1" not in await until_closed(stream)
        await stream.aclose()
        # Content-Length: 0 is no body: served as ever.
        stream = await connect(router)
        await stream.send_all(
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )
        assert (await until_closed(stream)).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()


async def test_health_requests_declaring_a_body_do_not_lock_out_a_keyed_client(
    fake_router: RouterFactory, many_files: None
) -> None:
    async with fake_router({"a": {}}, "--api-key", "SECRET") as router:
        port = int(router.url.rsplit(":", 1)[1])
        wire = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n"
        socks = await open_many(port, 1045, wire)
        try:
            with trio.fail_after(30):
                async with router.client() as client:
                    got = await client.get("/v1/models", headers={"Authorization": "Bearer SECRET"})
            assert got.status_code == 200, got.text
        finally:
            close_all(socks)


async def test_the_body_pace_flags_reach_the_server(fake_router: RouterFactory) -> None:
    flags = ("--body-min-rate", "100", "--body-rate-grace", "0.5")
    async with fake_router({"a": {}}, *flags) as router:
        stream = await connect(router)
        await stream.send_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{"
        )
        closed = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle, stream, closed)  # 20 bytes a second
            got = await until_closed(stream)
            closed.set()
        assert got.startswith(b"HTTP/1.1 408 "), got[:80]
        assert b"too slow" in got
        await stream.aclose()
