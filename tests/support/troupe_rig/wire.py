"""Raw bytes on a router's socket: for what a client library would not send (half a
head, a body that never comes, a forged line) and what it would hide (the exact answer)."""

from __future__ import annotations

import trio

from troupe_rig.router import RunningRouter

__all__ = ["connect", "exchange", "first_answer", "port_of", "until_closed"]


def port_of(router: RunningRouter) -> int:
    return int(router.url.rsplit(":", 1)[1])


async def connect(router: RunningRouter) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port_of(router))


async def first_answer(stream: trio.abc.Stream) -> bytes:
    """Bytes until the first response's head is complete (and what came with it)."""
    got = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in got:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            got += chunk
    return got


async def until_closed(stream: trio.abc.Stream) -> bytes:
    """Everything the server sends until it closes."""
    got = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            got += chunk
    return got


async def exchange(router: RunningRouter, wire: bytes) -> bytes:
    """``wire`` on a fresh connection, everything read until the server closes."""
    stream = await connect(router)
    try:
        await stream.send_all(wire)
        return await until_closed(stream)
    finally:
        await stream.aclose()
