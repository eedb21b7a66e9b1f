"""A client that leaves mid-request is noticed by the server's one watch (an epoll set,
`troupe.http.server.watch`), over real sockets with a minimal handler: the work of each
client that closes is cancelled, the others' goes on, and a request pipelined behind
one under watch is kept and answered."""

from __future__ import annotations

import socket

import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.exchange import Exchange
from troupe.http.server.parse import Refusal, Request
from troupe.http.server.watch import SLACK, WATCH_AFTER
from troupe_rig.bare_server import serve_bare


class Waits:
    """``/wait/N`` runs until its client leaves (or `release`); ``/slow`` takes 100 ms;
    anything else answers at once."""

    def __init__(self) -> None:
        self.started: dict[str, trio.Event] = {}
        self.left: dict[str, trio.Event] = {}
        self.release = trio.Event()

    def base_head(self, request: Request) -> bytes:
        return b"Server: llama.cpp\r\n"

    def refused(
        self, request: Request | None, status: int, message: str, body: bytes, peer: str
    ) -> None:
        pass

    def admit(self, request: Request) -> Refusal | None:
        return None

    async def serve(self, exchange: Exchange) -> None:
        path = exchange.path
        if path.startswith("/wait/"):
            self.started.setdefault(path, trio.Event()).set()
            if await exchange.until_client_leaves(self.release.wait):
                self.left.setdefault(path, trio.Event()).set()
                return
        elif path == "/slow":

            async def slow() -> None:
                await trio.sleep(0.1)

            await exchange.until_client_leaves(slow)
        await exchange.respond(200, path.encode(), "text/plain")

    async def upgrade(self, exchange: Exchange, stream: trio.abc.Stream, rest: bytes) -> None:
        raise AssertionError("no upgrades here")


async def _answer(stream: trio.SocketStream) -> bytes:
    """One whole answer (its body is the request's path: it ends with it)."""
    data = b""
    while not (b"\r\n\r\n" in data and data.endswith((b"/1", b"/3"))):
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def _get(path: str) -> bytes:
    return b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()


async def test_each_client_that_leaves_has_its_work_cancelled_and_the_others_go_on() -> None:
    async with trio.open_nursery() as nursery:
        server, handler, port = await serve_bare(nursery, Waits(), ServerConfig())
        streams = {}
        for n in range(4):
            path = f"/wait/{n}"
            handler.started[path] = trio.Event()
            streams[path] = stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(_get(path))
            await handler.started[path].wait()
        await trio.sleep(WATCH_AFTER + SLACK + 0.03)  # all of them under watch now
        for path in ("/wait/0", "/wait/2"):
            handler.left[path] = trio.Event()
            await streams[path].aclose()
        with trio.fail_after(5):
            await handler.left["/wait/0"].wait()
            await handler.left["/wait/2"].wait()
        # The two that stayed are still served, and answered once released.
        handler.release.set()
        for path in ("/wait/1", "/wait/3"):
            with trio.fail_after(5):
                answer = await _answer(streams[path])
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert answer.endswith(path.encode())
            assert path not in handler.left
            await streams[path].aclose()
        nursery.cancel_scope.cancel()
    assert not server.watch._fds, "a request that ended is watched no more"


async def test_a_client_reset_mid_request_is_noticed() -> None:
    async with trio.open_nursery() as nursery:
        _, handler, port = await serve_bare(nursery, Waits(), ServerConfig())
        handler.started["/wait/r"] = trio.Event()
        handler.left["/wait/r"] = trio.Event()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(_get("/wait/r"))
        await handler.started["/wait/r"].wait()
        await trio.sleep(WATCH_AFTER + SLACK + 0.03)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # linger 0: a reset, not a close
        with trio.fail_after(5):
            await handler.left["/wait/r"].wait()
        nursery.cancel_scope.cancel()


async def test_a_request_pipelined_behind_one_under_watch_is_answered() -> None:
    async with trio.open_nursery() as nursery:
        _, _, port = await serve_bare(nursery, Waits(), ServerConfig())
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(_get("/slow"))
        await trio.sleep(WATCH_AFTER + SLACK + 0.03)  # /slow is under watch
        await stream.send_all(_get("/next"))  # its bytes wait, unread, behind /slow
        answers = b""
        with trio.fail_after(5):
            while answers.count(b"HTTP/1.1 200 ") < 2:
                chunk = await stream.receive_some(65536)
                assert chunk, f"closed after {answers!r}"
                answers += chunk
        assert answers.index(b"/slow") < answers.index(b"/next")
        await stream.aclose()
        nursery.cancel_scope.cancel()
