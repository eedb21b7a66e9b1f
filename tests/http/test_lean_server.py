"""The lean HTTP server over real sockets, raw bytes in and out: framing, limits, TLS,
UNIX sockets, the drain, the door's errors (upstream-shaped JSON, then the close)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import trio
import trio_websocket

from troupe.http.errors import NOT_FOUND_BODY
from troupe.sched import Status
from troupe_rig.router import RouterFactory, RunningRouter


def port_of(router: RunningRouter) -> int:
    return int(router.url.rsplit(":", 1)[1])


async def connect(router: RunningRouter) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port_of(router))


async def start_stream(stream: trio.abc.Stream, tokens: int) -> bytes:
    """A streamed completion of ``tokens`` on ``stream``; what arrived up to its first
    event."""
    body = json.dumps({"model": "a", "prompt": "x", "n_predict": tokens, "stream": True})
    await stream.send_all(
        b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body.encode())
    )
    with trio.fail_after(10):
        got = b""
        while b"data: " not in got:
            got += await stream.receive_some(65536)
    return got


async def read_until_closed(stream: trio.abc.Stream, limit: float = 10) -> bytes:
    """Everything until the server closes; then closes our end too."""
    data = b""
    with trio.fail_after(limit):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    return data


async def read_response(stream: trio.abc.Stream, buf: bytearray) -> tuple[bytes, bytes]:
    """One response (Content-Length or chunked, de-chunked) off ``buf`` + ``stream``."""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive_some(65536)
        end = buf.index(b"\r\n\r\n")
        head = bytes(buf[:end])
        del buf[: end + 4]
        lowered = head.lower()
        if b"transfer-encoding: chunked" in lowered:
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += await stream.receive_some(65536)
                line_end = buf.index(b"\r\n")
                size = int(bytes(buf[:line_end]), 16)
                while len(buf) < line_end + 2 + size + 2:
                    buf += await stream.receive_some(65536)
                body += bytes(buf[line_end + 2 : line_end + 2 + size])
                del buf[: line_end + 2 + size + 2]
                if size == 0:
                    return head, body
        length = int(lowered.split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(buf) < length:
            buf += await stream.receive_some(65536)
        body = bytes(buf[:length])
        del buf[:length]
        return head, body


def tokenize(content: str = "hi") -> bytes:
    body = json.dumps({"model": "a", "content": content}).encode()
    return (
        b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )


async def test_pipelined_requests_on_one_connection_are_answered_in_order(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
            + tokenize()
            + b"GET /no/such HTTP/1.1\r\nHost: localhost\r\n\r\n"
            + b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost:5173\r\n\r\n"
        )
        buf = bytearray()
        answers = [await read_response(stream, buf) for _ in range(4)]
        statuses = [head.split(b" ")[1] for head, _ in answers]
        assert statuses == [b"200", b"200", b"404", b"200"]
        assert answers[0][1] == b'{"status":"ok"}'
        assert "tokens" in json.loads(answers[1][1])
        assert answers[2][1] == NOT_FOUND_BODY
        for head, _ in answers:
            assert b"\r\nServer: llama.cpp" in head
        assert b"Access-Control-Allow-Origin: http://localhost:5173" in answers[3][0]
        await stream.aclose()


async def test_a_stream_passes_the_childs_chunks_through(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-tps": "500"}}) as router:
        stream = await connect(router)
        body = json.dumps({"model": "a", "prompt": "x", "n_predict": 5, "stream": True}).encode()
        await stream.send_all(
            b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%b"
            % (len(body), body)
        )
        head, data = await read_response(stream, bytearray())
        lowered = head.lower()
        assert b"transfer-encoding: chunked" in lowered
        assert b"content-length" not in lowered
        assert b"x-accel-buffering: no" in lowered
        assert lowered.count(b"server:") == 1
        events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
        assert len(events) >= 5
        await stream.aclose()
        with trio.fail_after(5):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)


async def test_a_client_that_leaves_mid_stream_frees_the_model_at_once(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-tps": "5"}}) as router:
        stream = await connect(router)
        await start_stream(stream, 500)
        assert router.snapshot.models["a"].in_flight == 1
        await stream.aclose()  # the next token is 200 ms away: only the watch can notice
        with trio.fail_after(1):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)


async def test_a_client_reset_mid_stream_is_no_error(
    fake_router: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_router({"a": {"fake-tps": "5000"}}) as router:
        body = json.dumps({"model": "a", "prompt": "x", "n_predict": 100000, "stream": True})
        for _ in range(3):
            stream = await connect(router)
            await stream.send_all(
                b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body.encode())
            )
            with trio.fail_after(10):
                await stream.receive_some(100)
            linger = (1).to_bytes(4, "little") + (0).to_bytes(4, "little")
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            await stream.aclose()  # a reset: the relay's next write fails at once
            with trio.fail_after(5):
                await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize(
    ("wire", "status"),
    [
        (b"BREW /pot HTTP/1.1\r\nHost: localhost\r\n\r\n", b"400"),
        (b"GET / HTTP/9.9\r\n\r\n", b"400"),
        (b"GET /\x00 HTTP/1.1\r\n\r\n", b"400"),
        (
            b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            b"\r\nzz\r\n",
            b"400",
        ),
        (b"GET / HTTP/1.1\r\n" + b"X-Flood: 1\r\n" * 150 + b"\r\n", b"431"),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", b"414"),
    ],
)
async def test_bad_bytes_get_a_json_error_and_the_close(
    fake_router: RouterFactory, wire: bytes, status: bytes
) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        await stream.send_all(wire)
        data = await read_until_closed(stream)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == status
        assert b"Connection: close" in head
        error = json.loads(body)["error"]
        assert list(error) == ["code", "message", "type"]
        assert error["code"] == int(status)
        # The server still serves.
        async with router.client() as http:
            assert (await http.get("/health")).status_code == 200


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--max-body-mib", "1") as router:
        stream = await connect(router)
        await stream.send_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Length: 100000000000\r\n\r\n"
        )
        data = await read_until_closed(stream)  # no body sent: the answer comes anyway
        assert data.startswith(b"HTTP/1.1 413 ")
        assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == 413


async def test_expect_100_continue_gets_its_interim_answer(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        body = json.dumps({"model": "a", "content": "hi"}).encode()
        await stream.send_all(
            b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        with trio.fail_after(5):
            got = await stream.receive_some(65536)
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
        await stream.send_all(body)
        head, answer = await read_response(stream, bytearray())
        assert head.startswith(b"HTTP/1.1 200")
        assert b"tokens" in answer
        await stream.aclose()


async def test_a_deeply_nested_body_is_a_400_not_a_500(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        for depth in (300_000, 3_000):  # the first is parsed in a worker thread
            resp = await http.post("/v1/completions", content=b"[" * depth + b"]" * depth)
            assert resp.status_code == 400
            assert "nested too deeply" in resp.json()["error"]["message"]
        assert router.snapshot.running == 0


async def test_a_large_body_is_parsed_off_the_loop_and_relayed_whole(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router, router.client() as http:
        content = "word " * 200_000  # 1 MB
        resp = await http.post("/tokenize", json={"model": "a", "content": content})
        assert resp.status_code == 200
        assert len(resp.json()["tokens"]) > 1000


async def test_a_chunked_request_body_is_read_and_forwarded(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        body = json.dumps({"model": "a", "content": "hello"}).encode()
        await stream.send_all(
            b"POST /tokenize HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%b\r\n" % (5, body[:5])
            + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body) - 5, body[5:])
        )
        head, answer = await read_response(stream, bytearray())
        assert head.startswith(b"HTTP/1.1 200")
        assert "tokens" in json.loads(answer)
        await stream.aclose()


async def test_the_drain_ends_an_open_stream_with_a_final_event(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-tps": "20"}}) as router:
        stream = await connect(router)
        idle = await connect(router)
        got = await start_stream(stream, 5000)
        server = router.ctx.http_server
        assert server is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.drain, 0.2)
            rest = await read_until_closed(stream)
            assert await read_until_closed(idle) == b""  # the idle one is closed at once
        data = got + rest
        assert data.endswith(b"\r\n0\r\n\r\n")  # ended at a chunk boundary, properly
        last = [line for line in data.split(b"\n") if line.startswith(b"data: ")][-1]
        error = json.loads(last[6:])["error"]
        assert error["code"] == 503
        assert error["type"] == "unavailable_error"
        with trio.fail_after(5):
            await router.ctx.scheduler.wait_until(lambda s: s.models["a"].in_flight == 0)
        with pytest.raises(OSError, match="connect"):
            await connect(router)  # no longer accepting


async def test_a_websocket_upgrade_on_an_unknown_path_is_the_json_404(
    fake_router: RouterFactory,
) -> None:
    # Every upgrade goes to troupe's realtime door; a path it does not serve is the 404
    # every unknown route gets.
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)  # ours to close (trio-websocket leaves a rejected one)
        rejected: list[trio_websocket.ConnectionRejected] = []
        async with stream:
            try:
                async with trio.open_nursery() as nursery:
                    await trio_websocket.wrap_client_stream(
                        nursery, stream, "127.0.0.1", "/v1/not-realtime?model=a"
                    )
            except* trio_websocket.ConnectionRejected as group:
                rejected = [
                    e for e in group.exceptions if isinstance(e, trio_websocket.ConnectionRejected)
                ]
        assert rejected
        assert rejected[0].status_code == 404
        assert rejected[0].body == NOT_FOUND_BODY


async def test_unix_socket_and_ipv6_hosts(fake_router: RouterFactory, tmp_path: Path) -> None:
    path = tmp_path / "troupe.sock"
    async with fake_router({"a": {}}, "--host", f"{path},::1") as router:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.connect(str(path))
        stream = trio.SocketStream(sock)
        await stream.send_all(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        data = await read_until_closed(stream)
        assert data.startswith(b"HTTP/1.1 200")
        assert data.endswith(b'{"status":"ok"}')
        assert router.url.startswith("unix:")
        assert router.ctx.http_server is not None
        v6 = await trio.open_tcp_stream(
            "::1", int(router.ctx.http_server.urls[1].rsplit(":", 1)[1])
        )
        await v6.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert (await read_until_closed(v6)).startswith(b"HTTP/1.1 200")
    assert not path.exists()  # removed when the server stopped


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_tls(fake_router: RouterFactory, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    args = ("--ssl-cert-file", str(cert), "--ssl-key-file", str(key))
    async with fake_router({"a": {}}, *args) as router:
        assert router.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        tcp = await trio.open_tcp_stream("127.0.0.1", port_of(router))
        async with tcp:
            tls = trio.SSLStream(tcp, context, server_hostname="localhost")
            await tls.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" + tokenize())
            buf = bytearray()
            assert (await read_response(tls, buf))[1] == b'{"status":"ok"}'
            head, body = await read_response(tls, buf)
            assert head.startswith(b"HTTP/1.1 200")
            assert b"tokens" in body
            await trio.aclose_forcefully(tls)
        await router.wait_for_status("a", Status.LOADED)


@pytest.mark.parametrize(
    ("key", "version", "status"),
    [("!", "13", 400), ("c2hvcnQ=", "13", 400), ("dGhlIHNhbXBsZSBub25jZQ==", "8", 426)],
)
async def test_a_broken_websocket_handshake_is_answered_as_http(
    fake_router: RouterFactory, key: str, version: str, status: int
) -> None:
    async with fake_router({"a": {}}) as router:
        stream = await connect(router)
        async with stream:
            await stream.send_all(
                b"GET /v1/realtime?model=a HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Version: %b\r\nSec-WebSocket-Key: %b\r\n\r\n"
                % (version.encode(), key.encode())
            )
            data = await read_until_closed(stream)
        assert data.startswith(b"HTTP/1.1 %d" % status)
        assert b'"type":"invalid_request_error"' in data
