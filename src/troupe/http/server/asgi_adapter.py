"""The router's own routes run on a Quart app: this calls it as an ASGI server would.

`AsgiApp.handle` gives the app a scope, a ``receive`` that hands over the body the
server already read (then waits: a client that leaves cancels the app instead, as
quart-trio would on ``http.disconnect``) and a ``send`` that writes the response: a
response with a Content-Length goes out in one write with its first body part; one
without (``GET /models/sse``) is chunked, its head sent at once. `run_lifespan`
drives the ASGI lifespan (startup, then shutdown when asked).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from troupe.http.server.exchange import Exchange

__all__ = ["ASGIApp", "AsgiApp"]

log = logging.getLogger("troupe.http")

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]
# What the server sets itself; the app's own values for these are dropped.
_OURS = frozenset({b"server", b"access-control-allow-origin", b"connection", b"transfer-encoding"})
_ASGI = {"version": "3.0", "spec_version": "2.3"}
LIFESPAN_TIMEOUT = 10.0


class AsgiApp:
    def __init__(self, app: ASGIApp, *, scheme: str = "http") -> None:
        self.app = app
        self.scheme = scheme
        self._shutdown = trio.Event()
        self._stopped = trio.Event()

    # -- lifespan -------------------------------------------------------------------------

    async def run_lifespan(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Startup, report started, wait for `shutdown`; a failed startup raises."""
        started = trio.Event()
        failed: list[str] = []
        sent_startup = False

        async def receive() -> Message:
            nonlocal sent_startup
            if not sent_startup:
                sent_startup = True
                return {"type": "lifespan.startup"}
            await self._shutdown.wait()
            return {"type": "lifespan.shutdown"}

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                started.set()
            elif kind == "lifespan.startup.failed":
                failed.append(str(message.get("message", "")))
                started.set()
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self._stopped.set()

        async with trio.open_nursery() as nursery:

            async def run() -> None:
                try:
                    await self.app({"type": "lifespan", "asgi": _ASGI, "state": {}}, receive, send)
                finally:
                    self._stopped.set()
                    started.set()

            nursery.start_soon(run)
            with trio.fail_after(LIFESPAN_TIMEOUT):
                await started.wait()
            if failed:
                raise RuntimeError(f"the router's app failed to start: {failed[0]}")
            task_status.started()
            await self._stopped.wait()

    async def shutdown(self) -> None:
        """Ask the app to shut down and wait (bounded) until it has."""
        self._shutdown.set()
        with trio.move_on_after(LIFESPAN_TIMEOUT):
            await self._stopped.wait()

    # -- one request ----------------------------------------------------------------------

    def scope(self, exchange: Exchange) -> MutableMapping[str, Any]:
        request = exchange.request
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.http_version,
            "method": request.method,
            "scheme": self.scheme,
            "path": request.path,
            "raw_path": request.target.partition(b"?")[0],
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": None,
            "server": None,
            "extensions": {},
        }

    async def handle(self, exchange: Exchange) -> None:
        body_given = False
        head: list[bytes] = []  # the head, held back until the first body part
        length: list[bool] = []  # the app declared a Content-Length

        async def receive() -> Message:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": exchange.body, "more_body": False}
            await trio.sleep_forever()  # a disconnect cancels the app instead
            raise AssertionError

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                fields = []
                declared = None
                for key, value in message.get("headers", []):
                    name = bytes(key).lower()
                    if name in _OURS:
                        continue
                    if name == b"content-length":
                        declared = int(value)
                        continue
                    fields.append(b"%b: %b\r\n" % (bytes(key), bytes(value)))
                start = exchange.head(int(message["status"]), b"".join(fields), length=declared)
                if declared is None:
                    await exchange.send(start)  # a stream: its head goes out now
                else:
                    head.append(start)
                    length.append(True)
            elif kind == "http.response.body":
                data = bytes(message.get("body", b""))
                more = bool(message.get("more_body", False))
                exchange.sent += len(data)
                if length:
                    out = head.pop() + data if head else data
                else:
                    out = exchange.chunk(data)
                    if not more:
                        out += exchange.last_chunk
                if out:
                    await exchange.send(out)

        await exchange.until_client_leaves(lambda: self.app(self.scope(exchange), receive, send))
        if head:  # a start without any body message
            await exchange.send(head.pop())
