"""The pooled HTTP/1.1 client the relay uses to talk to children, over real sockets."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio
import trio.testing

from troupe.proxy.upstream import ChildRef, Gone, UpstreamError, UpstreamPool

Handler = Callable[[trio.SocketStream, int], Awaitable[None]]


def child(port: int, gen: int = 1) -> ChildRef:
    return ChildRef("m", gen, port)


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + rest


async def serve(nursery: trio.Nursery, handler: Handler) -> tuple[int, list[int]]:
    """A TCP server calling ``handler(stream, connection_number)``; returns its port and
    the list of connection numbers seen (one per accepted connection)."""
    seen: list[int] = []

    async def on_connection(stream: trio.SocketStream) -> None:
        seen.append(len(seen) + 1)
        async with stream:
            await handler(stream, seen[-1])

    listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1], seen


async def keep_alive(stream: trio.SocketStream, _: int) -> None:
    while await read_request(stream):
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def read_all(pool: UpstreamPool, port: int, body: bytes = b"") -> tuple[int, bytes]:
    resp = await pool.request(child(port), "POST", "/x", [(b"host", b"h")], body)
    data = b"".join([c async for c in resp.chunks()])
    await resp.aclose()
    return resp.status_code, data


async def test_keep_alive_connections_are_reused() -> None:
    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, keep_alive)
        pool = UpstreamPool()
        for _ in range(3):
            assert await read_all(pool, port, b"{}") == (200, b"ok")
        assert seen == [1]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_connection_the_child_closed_is_retried_once_on_a_new_one() -> None:
    async def one_answer_then_close(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        # Says keep-alive, closes anyway (llama-server after an SSE stream).
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        )

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, one_answer_then_close)
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        await trio.testing.wait_all_tasks_blocked()
        assert await read_all(pool, port) == (200, b"ok")
        assert seen == [1, 2]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_break_mid_body_is_an_upstream_error() -> None:
    async def truncated(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")

    async with trio.open_nursery() as nursery:
        port, _ = await serve(nursery, truncated)
        pool = UpstreamPool()
        resp = await pool.request(child(port), "GET", "/", [(b"host", b"h")], b"")
        with pytest.raises(UpstreamError):
            _ = [c async for c in resp.chunks()]
        await resp.aclose()
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_nothing_listening_is_an_upstream_error() -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(UpstreamError, match="Could not establish connection"):
            await UpstreamPool().request(child(port), "GET", "/", [(b"host", b"h")], b"")


async def test_an_unfinished_answer_closes_its_connection_instead_of_pooling_it() -> None:
    server_saw_the_close = trio.Event()

    async def streaming(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                await stream.send_all(b"5\r\nchunk\r\n")
                await trio.sleep(0.01)  # a generator's pace, not synchronisation
        except trio.BrokenResourceError:
            server_saw_the_close.set()

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, streaming)
        pool = UpstreamPool()
        resp = await pool.request(child(port), "GET", "/", [(b"host", b"h")], b"")
        async for chunk in resp.chunks():
            assert chunk.startswith(b"chunk")
            break
        await resp.aclose()  # the server sees its writes fail: the client went away
        with trio.fail_after(5):
            await server_saw_the_close.wait()
        await pool.aclose()
        nursery.cancel_scope.cancel()
    assert seen == [1]


async def test_a_silent_child_times_out() -> None:
    async def silent(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port, _ = await serve(nursery, silent)
        pool = UpstreamPool(read_timeout=0.2)
        with pytest.raises(UpstreamError, match="Read timeout"):
            await pool.request(child(port), "GET", "/", [(b"host", b"h")], b"")
        nursery.cancel_scope.cancel()


async def test_forget_closes_the_idle_connections_of_a_child_that_is_gone() -> None:
    closed = trio.Event()

    async def keep_alive_until_closed(stream: trio.SocketStream, _: int) -> None:
        await keep_alive(stream, _)
        closed.set()  # the pool's side of the connection was closed

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, keep_alive_until_closed)
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        assert pool.idle_count == 1
        pool.forget("m", 1)
        assert pool.idle_count == 0
        with trio.fail_after(5):
            await closed.wait()
        # A request for the dead child is refused without touching the network.
        with pytest.raises(UpstreamError, match="exited"):
            await pool.request(child(port, gen=1), "GET", "/", [(b"host", b"h")], b"")
        # The model's next child (same port, as ports are reused) gets a fresh connection.
        assert await read_all_gen(pool, port, gen=2) == (200, b"ok")
        assert seen == [1, 2]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_connection_in_use_when_its_child_is_stopped_is_cut() -> None:
    # llama-server does not exit while a request waits on its stopped task loop (which
    # will never answer it): the stop would take the whole stop-timeout. Cut it instead.
    server_saw_the_close = trio.Event()

    async def streaming(stream: trio.SocketStream, _: int) -> None:
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n"
        )
        try:
            await stream.receive_some(1)
        finally:
            server_saw_the_close.set()

    async with trio.open_nursery() as nursery:
        port, _ = await serve(nursery, streaming)
        pool = UpstreamPool()
        resp = await pool.request(child(port), "POST", "/x", [(b"host", b"h")], b"")
        chunks = resp.chunks()
        assert await chunks.__anext__() == b"first"
        pool.forget("m", 1)  # the scheduler stops the child mid-answer
        with pytest.raises(UpstreamError):
            await chunks.__anext__()
        await resp.aclose()
        with trio.fail_after(5):
            await server_saw_the_close.wait()
        assert pool.open_count == 0
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_connections_are_not_shared_between_generations_on_one_port() -> None:
    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, keep_alive)
        pool = UpstreamPool()
        assert await read_all_gen(pool, port, gen=1) == (200, b"ok")
        assert await read_all_gen(pool, port, gen=2) == (200, b"ok")
        assert seen == [1, 2]  # gen 2 never got gen 1's socket
        assert pool.idle_count == 2
        pool.forget("m", 2)  # forgetting a generation forgets the older ones too
        assert pool.idle_count == 0
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def read_all_gen(pool: UpstreamPool, port: int, gen: int) -> tuple[int, bytes]:
    resp = await pool.request(child(port, gen), "POST", "/x", [(b"host", b"h")], b"")
    data = b"".join([c async for c in resp.chunks()])
    await resp.aclose()
    return resp.status_code, data


async def test_a_burst_opens_more_but_only_the_childs_workers_stay_open() -> None:
    # llama-server binds a worker to each keep-alive connection; past its fixed workers
    # a new connection can wait out another's 5 s keep-alive. So a burst may open more
    # connections (the child spawns extra threads for them), but only `limit` stay.
    release = trio.Event()

    async def slow(stream: trio.SocketStream, _: int) -> None:
        while await read_request(stream):
            await release.wait()
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, slow)
        pool = UpstreamPool()
        pool.set_limit("m", 1, 2)
        results: list[tuple[int, bytes]] = []

        async def one() -> None:
            results.append(await read_all(pool, port))

        async with trio.open_nursery() as clients:
            for _ in range(5):
                clients.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.open_count == 5  # nobody waits in troupe for a connection
            release.set()
        assert results == [(200, b"ok")] * 5
        assert len(seen) == 5
        assert (pool.open_count, pool.idle_count) == (2, 2)  # the extra three were closed
        assert await read_all(pool, port) == (200, b"ok")
        assert len(seen) == 5  # and the two kept are reused
        await pool.aclose()
        nursery.cancel_scope.cancel()


def _answers_once_then_drops_the_next(received: list[bytes]) -> Handler:
    """A child that answers the first request on a connection (keep-alive), reads the
    next one whole and closes without answering (it may have acted on it)."""

    async def handler(stream: trio.SocketStream, _: int) -> None:
        first = await read_request(stream)
        received.append(first.split(b" ", 1)[0])
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        second = await read_request(stream)
        if second:
            received.append(second.split(b" ", 1)[0])

    return handler


async def test_a_post_that_reached_the_child_is_never_sent_twice() -> None:
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, _answers_once_then_drops_the_next(received))
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        with pytest.raises(UpstreamError, match="without answering"):
            await read_all(pool, port, b'{"prompt": "x"}')  # on the pooled connection
        assert received == [b"POST", b"POST"]  # the second one once, not again
        assert seen == [1]  # no second connection was opened to send it again
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_get_that_broke_on_a_pooled_connection_is_sent_again() -> None:
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, _answers_once_then_drops_the_next(received))
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        resp = await pool.request(child(port), "GET", "/slots", [(b"host", b"h")], b"")
        assert resp.status_code == 200  # a GET changes nothing: it went again, on a new one
        await resp.aclose()
        assert received == [b"POST", b"GET", b"GET"]
        assert seen == [1, 2]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_the_child_closed_is_found_before_a_post_uses_it() -> None:
    # The child answers, then closes its side (its keep-alive timeout, or after a
    # stream). A POST written into that connection would be lost without an answer and
    # could not go again; the pool sees the close first and opens a new connection.
    closed = trio.Event()
    received: list[bytes] = []

    async def answer_then_close(stream: trio.SocketStream, _: int) -> None:
        request = await read_request(stream)
        received.append(request.split(b" ", 1)[0])
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await stream.aclose()
        closed.set()

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, answer_then_close)
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        assert pool.idle_count == 1
        await closed.wait()
        assert await read_all(pool, port, b'{"prompt": "x"}') == (200, b"ok")
        assert received == [b"POST", b"POST"]
        assert seen == [1, 2]
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_the_live_child_is_the_started_one_not_yet_stopping_on_its_own_port() -> None:
    pool = UpstreamPool()
    assert pool.live("m") is None
    pool.started("m", 1, 7001, 4)
    assert pool.live("m") == ChildRef("m", 1, 7001)
    pool.started("m", 2, 7002, 4)  # a restart: the newer child (the older one is gone)
    assert pool.live("m") == ChildRef("m", 2, 7002)
    assert pool.child("m", 1) is None
    pool.forget("m", 1)  # the old one's stop, reported late, leaves the new one
    pool.gone("m", 1)
    assert pool.live("m") == ChildRef("m", 2, 7002)
    pool.forget("m", 2)  # stopping: no longer live, still known until it exits
    assert pool.live("m") is None
    assert pool.child("m", 2) == ChildRef("m", 2, 7002)
    pool.gone("m", 2)
    assert pool.child("m", 2) is None
    pool.started("m", 2, 7002, 4)  # a late start of a child already gone changes nothing
    assert pool.live("m") is None
    await pool.aclose()


async def test_a_stopping_child_gets_only_final_requests_and_a_gone_one_nothing() -> None:
    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, keep_alive)
        pool = UpstreamPool()
        pool.started("m", 1, port, 4)
        headers = [(b"host", b"h")]
        assert await pool.fetch(child(port), "POST", "/x", headers, b"{}") == (200, b"ok")
        pool.forget("m", 1)  # the scheduler stops it: its KV save is still to come
        with pytest.raises(Gone):
            await pool.fetch(child(port), "POST", "/x", headers, b"{}")
        got = await pool.fetch(child(port), "POST", "/slots/0?action=save", headers, final=True)
        assert got == (200, b"ok")
        assert pool.open_count == 0  # a final request's connection is not kept
        await pool.aclose()  # at shutdown the relay closes before the children stop
        got = await pool.fetch(child(port), "POST", "/slots/0?action=save", headers, final=True)
        assert got == (200, b"ok")
        # It exits, and the next child (another model's, here) takes its port.
        pool.gone("m", 1)
        with pytest.raises(Gone):
            await pool.fetch(child(port), "POST", "/slots/0?action=save", headers, final=True)
        assert len(seen) == 3  # nothing of the refused requests reached the port
        nursery.cancel_scope.cancel()


async def test_a_chunked_answers_connection_is_not_kept_so_a_post_after_a_stream_is_safe() -> None:
    # llama-server closes the connection right after a stream's last chunk (though it
    # says keep-alive); pooled, the next request would race that close and be lost.
    received: list[bytes] = []

    async def stream_then_close(stream: trio.SocketStream, _: int) -> None:
        request = await read_request(stream)
        received.append(request.split(b" ", 1)[0])
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n"
        )

    async with trio.open_nursery() as nursery:
        port, seen = await serve(nursery, stream_then_close)
        pool = UpstreamPool()
        assert await read_all(pool, port) == (200, b"ok")
        assert pool.idle_count == 0
        assert await read_all(pool, port, b'{"prompt": "x"}') == (200, b"ok")
        assert received == [b"POST", b"POST"]
        assert seen == [1, 2]
        await pool.aclose()
        nursery.cancel_scope.cancel()
