"""Noticing a client that leaves while its request is served, without a task per request.

A request that waits for its model or streams an answer must stop when its client goes
away (it leaves the queue; the child stops generating). Watching the socket costs a
task, a timer and syscalls, and most answers are over within a few milliseconds, so a
request is only watched once it has run `WATCH_AFTER`. One ticker per server
(`ClientWatch`) keeps the requests being served in arrival order and, when the oldest
has run that long, starts a watcher task for it (`Connection.wait_for_eof`), which
cancels the request's work if the client closes. A request that ends before that costs
a dict insertion and a removal: at thousands of requests a second, a nursery, a task
and a timer each was a tenth of troupe's CPU per proxied request (bench/proxy.py,
docs/performance.md). The ticker parks while nothing is being served.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from troupe.http.server.connection import Connection

__all__ = ["WATCH_AFTER", "ClientWatch", "Watched"]

log = logging.getLogger("troupe.http")

WATCH_AFTER = 0.02  # seconds before a request starts watching for its client leaving


class Watched:
    """One request being served: the scope of its work, and what its watch found."""

    __slots__ = ("conn", "done", "ended", "gone", "scope", "watcher")

    def __init__(self, conn: Connection, scope: trio.CancelScope) -> None:
        self.conn = conn
        self.scope = scope  # cancelled when the client leaves
        self.gone = False  # the client left while it ran
        self.ended = False  # the work is over: a watcher that starts now does nothing
        self.watcher: trio.CancelScope | None = None  # the running watcher's scope
        self.done: trio.Event | None = None  # set when a started watcher has ended


class ClientWatch:
    """The server's one ticker: requests that run past `WATCH_AFTER` get a watcher."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None  # the server's (set while it serves)
        self._pending: dict[Watched, float] = {}  # not yet watched -> started (in order)
        self._lot = trio.lowlevel.ParkingLot()
        self._parked = False
        self._ticking = False
        self.closed = False  # the server drains: the ticker ends once nothing is served

    def add(self, watched: Watched, now: float) -> None:
        """``watched`` starts; it gets a watcher if it is still running at ``now +
        WATCH_AFTER``. Needs `nursery`."""
        pending = self._pending
        pending[watched] = now
        if self._parked:
            self._parked = False
            self._lot.unpark()
        elif not self._ticking:
            assert self.nursery is not None
            self._ticking = True
            self.nursery.start_soon(self._tick)

    async def end(self, watched: Watched) -> None:
        """``watched``'s work is over: no watcher starts for it, and one that did is
        stopped (waited for, so nobody reads the connection once this returns)."""
        watched.ended = True
        if self._pending.pop(watched, None) is not None:
            return
        if watched.watcher is not None:
            watched.watcher.cancel()
        if watched.done is not None:
            with trio.CancelScope(shield=True):
                await watched.done.wait()

    def close(self) -> None:
        """The server drains: the ticker ends once no request waits to be watched."""
        self.closed = True
        if self._parked:
            self._parked = False
            self._lot.unpark()

    async def _tick(self) -> None:
        pending = self._pending
        try:
            while True:
                if not pending:
                    if self.closed:
                        return
                    self._parked = True
                    await self._lot.park()
                    continue
                watched, started = next(iter(pending.items()))  # the oldest
                due = started + WATCH_AFTER
                if due > trio.current_time():
                    await trio.sleep_until(due)
                    continue  # it may be over by now: look again
                del pending[watched]
                watched.done = trio.Event()
                assert self.nursery is not None
                self.nursery.start_soon(self._watch, watched)
        finally:
            self._ticking = self._parked = False

    @staticmethod
    async def _watch(watched: Watched) -> None:
        assert watched.done is not None
        try:
            if watched.ended:
                return
            with trio.CancelScope() as scope:
                watched.watcher = scope
                if await watched.conn.wait_for_eof():
                    watched.gone = True
                    watched.scope.cancel()
        except Exception:  # (a task of the server's: a bug here must not end it)
            log.exception("watching a client failed")
        finally:
            watched.watcher = None
            watched.done.set()
