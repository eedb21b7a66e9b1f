"""`HttpServer`: accepting connections, counting requests in flight, and the drain.

The caps (against idle and slowloris floods): at ``max_connections`` (or a client address's
``max_per_client``), a new connection takes the place of the one resting longest,
one holding no request being served (`resting`, an insertion-ordered dict kept by
the connections: two O(1) steps per request; the scan for a client's own is only at
its cap); only when every one is serving does the new one get 503.

The drain, in the order a graceful stop needs it (`troupe.service.shutdown`): `stop_accepting`
closes the listening sockets; `close_idle` ends keep-alive connections that sit
between requests; `wait_requests_done` returns (an event, no polling) once no
request is in flight; `cancel_requests` is the hard stop at the deadline: every
handler is cancelled, and relays end an open SSE stream with a final event rather
than cutting it mid-chunk. `drain` runs the four under one deadline, then gives
connections a moment to close and cancels whatever is left: the stop is bounded.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence

import trio

from troupe.http.server.config import ServerConfig
from troupe.http.server.connection import Connection, Handler, error_bytes
from troupe.http.server.watch import ClientWatch

__all__ = ["HttpServer"]

log = logging.getLogger("troupe.http")

CLOSE_BOUND = 2.0  # seconds for connections to finish after the hard stop


class HttpServer:
    def __init__(self, handler: Handler, config: ServerConfig) -> None:
        self.handler = handler
        self.config = config
        self.connections: set[Connection] = set()  # counted against the caps
        # Connections holding no request being served, the longest resting first.
        self.resting: dict[Connection, None] = {}
        self.per_client: dict[str, int] = {}  # open connections per counted address
        self.reclaims = 0  # connections closed to make room, since the start
        self.urls: list[str] = []  # where it listens, once bound
        self.in_flight = 0
        self.draining = False  # no new connections; each closes after its request
        self.stopping = False  # handlers are being cancelled
        self.watch = ClientWatch()  # who notices a client leaving mid-request
        self._no_requests = trio.Event()
        self._no_connections = trio.Event()
        self._accept_scope: trio.CancelScope | None = None
        self._all_scope = trio.CancelScope()

    # -- serving ---------------------------------------------------------------------------

    async def serve(
        self,
        listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
        *,
        task_status: trio.TaskStatus[list[trio.abc.Listener[trio.abc.Stream]]] = (
            trio.TASK_STATUS_IGNORED
        ),
    ) -> None:
        """Accept on ``listeners`` until the drain; returns when every connection ended."""
        with self._all_scope:
            async with trio.open_nursery() as connections:
                self.watch.nursery = connections
                with trio.CancelScope() as accepting:
                    self._accept_scope = accepting
                    if self.draining:
                        accepting.cancel()
                    await trio.serve_listeners(
                        self._on_connection,
                        list(listeners),
                        handler_nursery=connections,
                        task_status=task_status,
                    )
            self.watch.nursery = None

    async def _on_connection(self, stream: trio.abc.Stream) -> None:
        if self.draining:
            await trio.aclose_forcefully(stream)
            return
        config = self.config
        client = self._client_of(stream)
        if (
            client
            and self.per_client.get(client, 0) >= config.max_per_client
            and not self._reclaim(client)
        ):
            await _turn_away(stream, FULL_FOR_CLIENT)
            return
        reserve = False
        if len(self.connections) >= config.max_connections and not self._reclaim(None):
            if len(self.connections) >= config.max_connections + config.health_reserve:
                await _turn_away(stream, FULL)
                return
            # Past the cap with every connection serving, a few more may still ask
            # GET /health (a probe must see that the router is alive and merely full);
            # others get the 503.
            reserve = True
        conn = Connection(self, stream, reserve=reserve, client=client)
        self.connections.add(conn)
        if client:
            self.per_client[client] = self.per_client.get(client, 0) + 1
        try:
            await conn.run()
        finally:
            self.forget(conn)

    def _client_of(self, stream: trio.abc.Stream) -> str:
        """The address counted against ``max_per_client``, or "" when not counted (no
        cap, a UNIX socket, loopback unless ``per_client_loopback``)."""
        config = self.config
        if config.max_per_client <= 0:
            return ""
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if not isinstance(stream, trio.SocketStream):
            return ""
        try:
            name = stream.socket.getpeername()
        except OSError:
            return ""
        if not isinstance(name, tuple):
            return ""
        host = str(name[0])
        if not config.per_client_loopback and (
            host.startswith(("127.", "::ffff:127.")) or host == "::1"
        ):
            return ""
        return host

    def rest(self, conn: Connection) -> None:
        """``conn`` holds no request being served (idle, or its head incomplete): it
        may make room for a new connection, the longest resting first."""
        self.resting[conn] = None
        conn.resting = True

    def busy(self, conn: Connection) -> None:
        """``conn``'s request head is complete: it serves, and is never reclaimed."""
        del self.resting[conn]
        conn.resting = False

    def _reclaim(self, client: str | None) -> bool:
        """At a cap, a new connection takes the place of the one resting longest (of
        ``client``'s own, at its cap), as nginx reuses idle keep-alive connections: a
        flood of idle or half-sent connections cannot lock clients out, and memory
        stays bounded. The scan is only at a cap; False when none rests."""
        for conn in self.resting:
            if client is None or conn.client == client:
                break
        else:
            return False
        self.forget(conn)  # counted no more, at once: it closes on its own
        conn.reclaim()
        self.reclaims += 1
        return True

    def forget(self, conn: Connection) -> None:
        """``conn`` no longer counts against the caps (it ended, or was reclaimed)."""
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        if conn.resting:
            self.busy(conn)
        if conn.client:
            left = self.per_client[conn.client] - 1
            if left:
                self.per_client[conn.client] = left
            else:
                del self.per_client[conn.client]
        if not self.connections and self.draining:
            self._no_connections.set()

    def request_started(self) -> None:
        self.in_flight += 1

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self.draining:
            self._no_requests.set()

    # -- stopping --------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Close the listening sockets; connections already open go on."""
        self.draining = True
        self.watch.close()
        if self.in_flight == 0:
            self._no_requests.set()
        if self._accept_scope is not None:
            self._accept_scope.cancel()

    def close_idle(self) -> None:
        """End every keep-alive connection that sits between requests."""
        for conn in list(self.connections):
            conn.cancel_idle()

    async def wait_requests_done(self) -> None:
        """Until no request is in flight (after `stop_accepting`)."""
        await self._no_requests.wait()

    def cancel_requests(self) -> None:
        """The hard stop: cancel every handler still running."""
        self.stopping = True
        for conn in list(self.connections):
            conn.cancel_request()
            conn.cancel_idle()

    async def drain(self, grace: float) -> None:
        """The whole graceful stop, bounded: ``grace`` seconds for requests in flight
        to finish, then the hard stop, then `CLOSE_BOUND` for connections to close."""
        self.stop_accepting()
        self.close_idle()
        with trio.move_on_after(grace if grace >= 0 else math.inf) as waited:
            await self.wait_requests_done()
        if waited.cancelled_caught:
            log.info("%d requests still running after %gs: cancelling them", self.in_flight, grace)
        self.cancel_requests()
        if self.connections:
            with trio.move_on_after(CLOSE_BOUND):
                await self._no_connections.wait()
        self._all_scope.cancel()


FULL = error_bytes(503, "too many open connections")
FULL_FOR_CLIENT = error_bytes(503, "too many open connections from this address")


async def _turn_away(stream: trio.abc.Stream, answer: bytes) -> None:
    """A connection past the cap and its reserve: 503 and the close, bounded, reading
    only what is already there (closing on unread bytes would reset the answer away)."""
    with trio.move_on_after(1.0):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.send_all(answer)
            if isinstance(stream, trio.SocketStream):
                await stream.send_eof()
                with trio.move_on_after(0.2):
                    while await stream.receive_some(65536):
                        pass
    await trio.aclose_forcefully(stream)
