"""A realtime session has a bounded life: troupe pings, and closes a session
whose client says nothing for --ws-idle-timeout, or answers no ping. The client is a
raw socket speaking RFC 6455 by hand, so every frame troupe sends is seen."""

from __future__ import annotations

import base64
import json
import os
import struct

import trio

from troupe_rig.router import RouterFactory, RunningRouter

PING, PONG, CLOSE, TEXT = 0x9, 0xA, 0x8, 0x1


async def open_raw(router: RunningRouter) -> tuple[trio.SocketStream, bytearray]:
    port = int(router.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16))
    await stream.send_all(
        b"GET /v1/realtime?model=a HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %b\r\n\r\n" % key
    )
    buf = bytearray()
    with trio.fail_after(10):
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive_some(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return stream, bytearray(rest)


async def frame(stream: trio.SocketStream, buf: bytearray) -> tuple[int, bytes]:
    """One frame from the server (unmasked): (opcode, payload); (-1, b"") at EOF."""

    async def need(n: int) -> bool:
        while len(buf) < n:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return False
            buf.extend(chunk)
        return True

    if not await need(2):
        return -1, b""
    opcode, size = buf[0] & 0x0F, buf[1] & 0x7F
    at = 2
    if size == 126:
        await need(4)
        size, at = struct.unpack("!H", buf[2:4])[0], 4
    elif size == 127:
        await need(10)
        size, at = struct.unpack("!Q", buf[2:10])[0], 10
    await need(at + size)
    payload = bytes(buf[at : at + size])
    del buf[: at + size]
    return opcode, payload


def masked(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


async def test_a_silent_client_is_pinged_then_closed_for_idleness(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--ws-idle-timeout", "1") as router:
        stream, buf = await open_raw(router)
        seen: list[int] = []
        with trio.fail_after(10):
            while True:
                opcode, payload = await frame(stream, buf)
                seen.append(opcode)
                if opcode == TEXT:
                    assert json.loads(payload)["type"] == "session.created"
                if opcode == PING:
                    await stream.send_all(masked(PONG, payload))  # alive, but says nothing
                if opcode in (CLOSE, -1):
                    break
        assert PING in seen
        assert seen[-1] == CLOSE
        code = struct.unpack("!H", payload[:2])[0]
        assert code == 1001
        assert b"idle" in payload
        await stream.aclose()


async def test_a_client_that_answers_no_ping_is_dropped(fake_router: RouterFactory) -> None:
    # Idle timeout long; pings every 20 s would be too slow for a test, so the idle
    # timeout (2 s) sets them to 1 s. The client never answers them.
    async with fake_router({"a": {}}, "--ws-idle-timeout", "2") as router:
        stream, buf = await open_raw(router)
        seen: list[int] = []
        with trio.fail_after(10):
            while True:
                opcode, payload = await frame(stream, buf)
                seen.append(opcode)
                if opcode == PING:
                    # A message (not a pong) each time: never idle, but no pong either.
                    await stream.send_all(masked(TEXT, b'{"type": "bogus.event"}'))
                if opcode in (CLOSE, -1):
                    break
        assert PING in seen
        assert seen[-1] == CLOSE
        assert b"pong" in payload
        await stream.aclose()
