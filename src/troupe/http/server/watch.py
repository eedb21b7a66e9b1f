"""Noticing a client that leaves while its request is served, without a task per request.

A request that waits for its model or streams an answer must stop when its client goes
away (it leaves the queue; the child stops generating). Most answers are over within a
few milliseconds, so a request is only watched once it has run `WATCH_AFTER`. One task
per server (`ClientWatch`) does all of it: it keeps the requests being served in arrival
order and, every `SLACK` at most, puts those that have run that long into an epoll set of
its own, asking only for the peer's close (``EPOLLRDHUP``: bytes of a next, pipelined
request are left where they are, unread); when the set fires, the request's work is
cancelled. A request costs a dict insertion and a removal, and one that runs long two
``epoll_ctl`` calls: a nursery, a task and a timer per request were a tenth of troupe's
CPU per proxied request, and a watcher task per slow request as much again at 64
clients (bench/proxy.py, docs/performance.md). A TLS connection (no plain socket at
hand) gets a watcher task of its own, which reads ahead (`Connection.wait_for_eof`).
The task parks while nothing is being served.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from troupe.http.server.connection import Connection

__all__ = ["SLACK", "WATCH_AFTER", "ClientWatch", "Watched"]

log = logging.getLogger("troupe.http")

WATCH_AFTER = 0.02  # seconds before a request starts watching for its client leaving
SLACK = 0.005  # requests come under watch in batches, at most this much later
_CLOSED = getattr(select, "EPOLLRDHUP", 0x2000)
_BROKEN = getattr(select, "EPOLLHUP", 0x10) | getattr(select, "EPOLLERR", 0x8)


class Watched:
    """One request being served: the scope of its work, and what its watch found."""

    __slots__ = ("conn", "done", "ended", "fd", "gone", "scope", "watcher")

    def __init__(self, conn: Connection, scope: trio.CancelScope) -> None:
        self.conn = conn
        self.scope = scope  # cancelled when the client leaves
        self.gone = False  # the client left while it ran
        self.ended = False  # the work is over: a watcher that starts now does nothing
        self.fd = -1  # its socket, while in the epoll set
        self.watcher: trio.CancelScope | None = None  # a watcher task's scope (TLS)
        self.done: trio.Event | None = None  # set when a watcher task has ended


class ClientWatch:
    """The server's one watch over clients leaving mid-request (see the module)."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None  # the server's (set while it serves)
        self._pending: dict[Watched, float] = {}  # not yet watched -> started (in order)
        self._fds: dict[int, Watched] = {}  # in the epoll set
        self._epoll: select.epoll | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._parked = False
        self._running = False
        self._idle_wait: trio.CancelScope | None = None  # its wait while none is pending
        self.closed = False  # the server drains: the task ends once nothing is served

    def add(self, watched: Watched, now: float) -> None:
        """``watched`` starts; it is watched if it still runs ``WATCH_AFTER`` from
        ``now``. Needs `nursery`."""
        pending = self._pending
        if not pending:
            if self._parked:
                self._parked = False
                self._lot.unpark()
            elif self._idle_wait is not None:
                self._idle_wait.deadline = now + WATCH_AFTER + SLACK
            elif not self._running:
                assert self.nursery is not None
                self._running = True
                self.nursery.start_soon(self._run)
        pending[watched] = now

    async def end(self, watched: Watched) -> None:
        """``watched``'s work is over: it is watched no more (a watcher task is stopped
        and waited for, so nobody reads the connection once this returns)."""
        watched.ended = True
        if self._pending.pop(watched, None) is not None:
            return
        fd = watched.fd
        if fd >= 0:
            watched.fd = -1
            if self._fds.get(fd) is watched:
                del self._fds[fd]
                self._unregister(fd)
                if not self._fds and self._idle_wait is not None:
                    self._idle_wait.cancel()  # nothing left to wait on: park (or end)
            return
        if watched.watcher is not None:
            watched.watcher.cancel()
        if watched.done is not None:
            with trio.CancelScope(shield=True):
                await watched.done.wait()

    def close(self) -> None:
        """The server drains: the task ends once no request is left to watch."""
        self.closed = True
        if self._parked:
            self._parked = False
            self._lot.unpark()

    # -- the task ----------------------------------------------------------------------

    async def _run(self) -> None:
        pending, fds = self._pending, self._fds
        try:
            while True:
                if not pending and not fds:
                    if self.closed:
                        return
                    self._parked = True
                    await self._lot.park()
                    continue
                due = self._start_due(trio.current_time())
                with trio.CancelScope(deadline=due) as wait:
                    if due == math.inf:
                        self._idle_wait = wait  # `add` moves it up
                    try:
                        if fds and self._epoll is not None:
                            await trio.lowlevel.wait_readable(self._epoll.fileno())
                        else:
                            await trio.sleep_forever()
                    finally:
                        self._idle_wait = None
                if fds:
                    self._reap()
        finally:
            self._running = self._parked = False
            self._idle_wait = None
            if self._epoll is not None and not fds:
                self._epoll.close()
                self._epoll = None

    def _start_due(self, now: float) -> float:
        """Watch every request that has run `WATCH_AFTER`; when to look again."""
        pending = self._pending
        while pending:
            watched, started = next(iter(pending.items()))  # the oldest
            if started + WATCH_AFTER > now:
                return started + WATCH_AFTER + SLACK
            del pending[watched]
            self._start(watched)
        return math.inf

    def _start(self, watched: Watched) -> None:
        raw = watched.conn.raw
        if raw is not None:
            try:
                if self._epoll is None:
                    self._epoll = select.epoll()
                fd = raw.fileno()
                self._epoll.register(fd, _CLOSED)
            except (OSError, ValueError):
                pass  # (a socket closed meanwhile: the task below finds it)
            else:
                watched.fd = fd
                self._fds[fd] = watched
                return
        watched.done = trio.Event()
        assert self.nursery is not None
        self.nursery.start_soon(self._watch, watched)

    def _reap(self) -> None:
        """The clients that closed (or broke) their connection: their work is cancelled."""
        assert self._epoll is not None
        for fd, events in self._epoll.poll(0):
            watched = self._fds.pop(fd, None)
            self._unregister(fd)
            if watched is None:
                continue
            watched.fd = -1
            conn = watched.conn
            conn.eof = True
            if events & _BROKEN:
                conn.broken = True
            watched.gone = True
            watched.scope.cancel()

    def _unregister(self, fd: int) -> None:
        if self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):  # (closed: the kernel dropped it)
                self._epoll.unregister(fd)

    @staticmethod
    async def _watch(watched: Watched) -> None:
        """A watcher task, for a connection without a plain socket (TLS)."""
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
