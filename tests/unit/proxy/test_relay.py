"""The byte relay against raw children over real sockets, with a recording client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from troupe.proxy.client import ChildLost, RelayReport
from troupe.proxy.relay import Relay
from troupe.proxy.upstream import ChildRef, UpstreamPool

Handler = Callable[[trio.SocketStream], Awaitable[None]]


class Recorder:
    """The client side of one exchange: HTTP/1.1, chunked, every write kept."""

    method = "POST"
    path = "/completion"
    target = b"/completion?x=1"
    framing = False  # as the server's exchange: True once a stream's head is made
    started = False
    server_stopping = False
    last_chunk = b"0\r\n\r\n"

    def __init__(self) -> None:
        self.headers = [(b"host", b"client"), (b"content-type", b"application/json")]
        self.writes: list[bytes] = []

    def head(self, status: int, fields: bytes, *, length: int | None) -> bytes:
        self.started = True
        self.framing = length is None
        return b"HTTP/1.1 %d X\r\n%bTransfer-Encoding: chunked\r\n\r\n" % (status, fields)

    def chunk(self, data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data) if data else b""

    async def send(self, data: bytes) -> None:
        self.writes.append(data)
        await trio.lowlevel.checkpoint()

    async def respond(self, status: int, body: bytes, content_type: str | bytes = "") -> None:
        self.writes.append(b"%d %b" % (status, body))
        await trio.lowlevel.checkpoint()


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    return data


async def serve(nursery: trio.Nursery, handler: Handler) -> int:
    async def on_connection(stream: trio.SocketStream) -> None:
        async with stream:
            await handler(stream)

    listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def test_chunked_events_pass_through_byte_for_byte_one_write_per_read() -> None:
    events = [b"%x\r\ndata: %d\n\n\r\n" % (len(b"data: %d\n\n" % i), i) for i in range(5)]
    seen: list[bytes] = []

    async def child(stream: trio.SocketStream) -> None:
        seen.append(await read_request(stream))
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: *\r\n"
            b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"X-Custom: kept\r\n\r\n"
        )
        for event in events:
            await stream.send_all(event)
            await trio.sleep(0.01)  # a generator's pace, so each event is its own read
        await stream.send_all(b"0\r\n\r\n")

    async with trio.open_nursery() as nursery:
        port = await serve(nursery, child)
        relay, client = Relay(5.0), Recorder()
        await relay.relay(client, child=ChildRef("m", 1, port), body=b'{"model":"m"}')
        head = client.writes[0]
        assert head.startswith(b"HTTP/1.1 200")
        assert b"X-Custom: kept\r\n" in head
        assert b"X-Accel-Buffering: no\r\n" in head
        assert b"Content-Type: text/event-stream\r\n" in head
        assert b"Server" not in head  # the child's; ours is the server's to add
        assert b"Access-Control" not in head
        out = b"".join(client.writes)
        assert out[out.index(b"\r\n\r\n") + 4 :] == b"".join(events) + b"0\r\n\r\n"
        assert len(client.writes) >= len(events)  # as they came, not buffered
        request = seen[0]
        assert request.startswith(b"POST /completion?x=1 HTTP/1.1\r\nhost: 127.0.0.1:%d" % port)
        assert b"content-length: 13\r\n" in request
        # Finished, but not pooled: llama-server closes a connection after a chunked
        # answer (though it says keep-alive), and a request sent into it would be lost.
        assert relay.idle_connections == 0
        await relay.aclose()
        nursery.cancel_scope.cancel()


async def test_a_length_delimited_answer_is_framed_as_chunks() -> None:
    async def child(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n")
        await trio.sleep(0.01)
        await stream.send_all(b'{"ok":true}')

    async with trio.open_nursery() as nursery:
        port = await serve(nursery, child)
        relay, client = Relay(5.0), Recorder()
        await relay.relay(client, child=ChildRef("m", 1, port), body=b"")
        (only,) = client.writes  # head and body waited for each other: one write
        assert only.endswith(b'\r\n\r\nb\r\n{"ok":true}\r\n0\r\n\r\n')
        assert b"Content-Type: application/json; charset=utf-8\r\n" in only
        await relay.aclose()
        nursery.cancel_scope.cancel()


async def test_a_truncated_json_answer_stays_truncated() -> None:
    async def child(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')

    async with trio.open_nursery() as nursery:
        port = await serve(nursery, child)
        relay, client = Relay(5.0), Recorder()
        with pytest.raises(ChildLost):
            await relay.relay(client, child=ChildRef("m", 1, port), body=b"")
        assert not b"".join(client.writes).endswith(b"0\r\n\r\n")  # no clean end
        assert relay.idle_connections == 0
        await relay.aclose()
        nursery.cancel_scope.cancel()


async def test_a_child_silent_mid_stream_past_the_timeout_ends_it_with_an_error_event() -> None:
    async def child(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n8\r\ndata: 1\n\r\n"
        )
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await serve(nursery, child)
        relay, client = Relay(0.3), Recorder()
        with trio.fail_after(5):
            await relay.relay(client, child=ChildRef("m", 1, port), body=b"")
        out = b"".join(client.writes)
        assert b"data: 1\n" in out
        assert b'"code":500' in out
        assert out.endswith(b"\r\n0\r\n\r\n")
        await relay.aclose()
        nursery.cancel_scope.cancel()


async def test_a_child_that_cannot_be_reached_is_a_plain_proxy_error() -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        client = Recorder()
        await Relay(1.0).relay(client, child=ChildRef("m", 1, port), body=b"")
    assert client.writes == [
        b"500 proxy error: Could not establish connection (Connection refused)"
    ]


async def test_a_peer_nodes_stream_cut_mid_chunk_ends_after_its_last_whole_event() -> None:
    # Another node's SSE answer: its chunks are its reads of its child's stream, so they
    # need not end where an event does. It breaks off inside a chunk, inside an event:
    # the client gets the whole events, then an error event saying why, framed cleanly
    # (passed through as it came, the error event would land inside a chunk).
    def chunk(data: bytes, declared: int | None = None) -> bytes:
        return b"%x\r\n%b" % (declared or len(data), data) + (b"" if declared else b"\r\n")

    async def peer(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        await stream.send_all(chunk(b"data: 1\n\ndata"))  # an event and a half
        await trio.sleep(0.01)
        await stream.send_all(chunk(b": 2\n\ndata: 3", declared=64))  # then half a chunk

    async with trio.open_nursery() as nursery:
        port = await serve(nursery, peer)
        pool = UpstreamPool("127.0.0.1", 5.0, 5.0)
        upstream = await pool.send(ChildRef("peer", 0, port), b"GET / HTTP/1.1\r\n\r\n")

        async def why() -> str:
            return "node n2 stopped answering"

        relay, client = Relay(5.0), Recorder()
        report = RelayReport()
        with trio.fail_after(5):
            await relay.answer(client, upstream, 0, report, why)
        out = b"".join(client.writes)
        body, pieces = out[out.index(b"\r\n\r\n") + 4 :], []
        while True:  # the client's chunks, checked as a client's parser reads them
            size, _, rest = body.partition(b"\r\n")
            if int(size, 16) == 0:
                assert rest == b"\r\n"
                break
            pieces.append(rest[: int(size, 16)])
            assert rest[int(size, 16) : int(size, 16) + 2] == b"\r\n"
            body = rest[int(size, 16) + 2 :]
        assert all(p.endswith(b"\n\n") for p in pieces), pieces
        error = (
            b'data: {"error":{"code":500,"message":"the model\'s server closed the connection: '
            b'node n2 stopped answering","type":"server_error"}}\n\n'
        )
        assert b"".join(pieces) == b"data: 1\n\ndata: 2\n\n" + error
        assert "n2 stopped answering" in (report.error or "")
        assert report.bytes_out == len(b"data: 1\n\ndata: 2\n\n")
        await pool.aclose()
        await relay.aclose()
        nursery.cancel_scope.cancel()
