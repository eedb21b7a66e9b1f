"""Small ASGI helpers shared by the front, the relay and the WebSocket bridge."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import trio

from troupe.http.errors import JSON_TYPE

__all__ = [
    "ASGIApp",
    "Receive",
    "Scope",
    "Send",
    "header",
    "query_params",
    "read_body",
    "send_response",
    "until_disconnect",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes), decoded as latin-1."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def query_params(scope: Scope) -> dict[str, str]:
    """Decoded query parameters; a repeated key keeps its first value (like httplib)."""
    out: dict[str, str] = {}
    raw = scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(raw, keep_blank_values=True):
        out.setdefault(key, value)
    return out


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; one over ``limit`` bytes is read to its end and dropped
    (a client still sending would not see the answer) and raises `BodyTooLarge`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        else:
            chunks.clear()
        if not message.get("more_body", False):
            if size > limit:
                raise BodyTooLarge
            return b"".join(chunks)


async def until_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` until it ends or the client disconnects (which cancels it).

    Plain ASGI apps are not cancelled by hypercorn when a client goes away; they only
    see ``http.disconnect`` on ``receive``. Call this once the body has been read.
    Returns True when the client disconnected.
    """
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await work()
        nursery.cancel_scope.cancel()
    return gone


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = JSON_TYPE,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode("latin-1")),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
