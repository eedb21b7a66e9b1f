"""Answers the router's own routes give, written on the lean server's `Exchange`.

Whole answers (JSON, upstream's error shapes, a scheduler `Failure` with its
``Retry-After``), the bodies they read (bounded: a local route takes a small JSON
document, a larger one is a JSON 413), and SSE streams (head at once, one chunk per
event). `watched` runs a handler that waits (on the scheduler, the hub, a child) so
that a client going away cancels it, as every wait in troupe is cancelled.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from functools import wraps
from typing import Any

from troupe.api import dumps
from troupe.assembly import Troupe
from troupe.http.errors import error_body, failure_body, status_of
from troupe.http.routing import Handler
from troupe.http.server.exchange import Exchange
from troupe.sched import Failure

__all__ = [
    "LOCAL_MAX_BODY",
    "local_body",
    "retry_after",
    "send_error",
    "send_failure",
    "send_json",
    "send_stream",
    "watched",
]

LOCAL_MAX_BODY = 16 << 20  # the router's own routes take small JSON documents

Fields = Iterable[tuple[bytes, bytes]]


async def send_json(ex: Exchange, value: Any, status: int = 200, headers: Fields = ()) -> None:
    await ex.respond(status, dumps(value), headers=headers)


async def send_error(ex: Exchange, message: str, type_: str) -> None:
    """``{"error":{"code","message","type"}}`` with the status upstream gives ``type_``."""
    await ex.respond(status_of(type_), error_body(message, type_))


def retry_after(failure: Failure) -> list[tuple[bytes, bytes]]:
    """``Retry-After`` when the failure has one, and its own headers (a tenant's
    ``x-ratelimit-*``)."""
    if failure.retry_after is None:
        return list(failure.headers)
    seconds = str(max(1, math.ceil(failure.retry_after))).encode()
    return [(b"Retry-After", seconds), *failure.headers]


async def send_failure(ex: Exchange, failure: Failure) -> None:
    await ex.respond(failure.status, failure_body(failure), headers=retry_after(failure))


async def local_body(ex: Exchange) -> bytes | None:
    """The request's body, or None once a JSON 413 went out (over `LOCAL_MAX_BODY`)."""
    if len(ex.body) <= LOCAL_MAX_BODY:
        return ex.body
    message = f"request body is larger than the limit of {LOCAL_MAX_BODY} bytes"
    error = {"error": {"code": 413, "message": message, "type": "invalid_request_error"}}
    ex.keep_alive = False
    await ex.respond(413, dumps(error))
    return None


async def send_stream(ex: Exchange, fields: bytes, events: AsyncGenerator[bytes, None]) -> None:
    """An SSE stream: the head now (``fields`` after the content type), then each
    piece ``events`` yields as one chunk, then the end of the stream. ``events`` is
    closed here whatever happens (a client gone, a cancelled stream), never left to
    the garbage collector."""
    async with aclosing(events):
        await ex.send(ex.head(200, b"Content-Type: text/event-stream\r\n" + fields, length=None))
        if ex.request.head_only:
            return  # HEAD: what the GET's head would be, and no stream
        async for data in events:
            ex.sent += len(data)
            await ex.send(ex.chunk(data))
    await ex.send(ex.last_chunk)


def watched(handler: Handler) -> Handler:
    """``handler``, cancelled if the client goes away meanwhile."""

    @wraps(handler)
    async def run(router: Troupe, ex: Exchange) -> None:
        await ex.until_client_leaves(lambda: handler(router, ex))

    return run
