"""The scheduler actor: carries out what `SchedulerCore` decides, and nothing else.

It owns the core (the only writer of the model table), the catalog the table was
built from, the instance actors, and the reply channels of everyone waiting. The
rest of the program talks to it through the methods here: `lease`, `load`, `unload`,
`reload`, `remove`, `start_download`, `begin_shutdown`, `stop_all`, `subscribe`, `snapshot`.

Anything that spans an await and changes shared state (a reload waiting for stopped
children, a removal deleting files) is a message it carries out in its own nursery,
so a client that gives up half-way leaves nothing half-done.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol

import attrs
import trio

from troupe.actors.catalog import CatalogKeeper, Scanner
from troupe.actors.download_supervisor import DownloadLauncher
from troupe.actors.events import EventBus
from troupe.actors.instance import Instance
from troupe.actors.memory import MemorySampler
from troupe.actors.replies import Replies
from troupe.actors.scheduler_downloads import SchedulerDownloads
from troupe.actors.scheduler_effects import ChildTransport, EffectExecutor, Listener, Spawner
from troupe.actors.scheduler_memory import MemoryWork, Projector
from troupe.catalog.prepared import PreparedCatalog
from troupe.child.ledger import PidLedger
from troupe.download.plan import DownloadPlan
from troupe.messages import (
    Acquire,
    BeginShutdown,
    ChildState,
    Exited,
    KeepAlive,
    LoadModel,
    Measured,
    MeasureFailed,
    MemorySampled,
    MemorySampleFailed,
    Message,
    Release,
    Reload,
    RemoveModel,
    ReplyChannel,
    Rescanned,
    Spawned,
    StartDownload,
    StopAll,
    UnloadModel,
)
from troupe.modellog import about
from troupe.sched import Effect, Failure, Grant, Reply, SchedulerCore, Snapshot
from troupe.sched.events import SchedulerEvent
from troupe.sched.memory import MemoryLedger
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = ["ModelUnavailable", "Scheduler", "Specs"]

log = logging.getLogger("troupe.scheduler")


class ModelUnavailable(Exception):
    """The scheduler answered a request with an error (upstream-shaped)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class Specs(Spawner, Projector, Scanner, Protocol):
    """What the scheduler needs from the rest of the program (the composition root):
    how to start a model's child, how to measure it, how to read the model sources."""


class Scheduler:
    """The scheduler actor. Its parts, each owning its own state: the core (the model
    table and every decision), the effect executor (children, replies, events), the
    memory work, the catalog keeper (reloads, removals) and the downloads."""

    def __init__(
        self,
        core: SchedulerCore,
        specs: Specs,
        catalog: PreparedCatalog,
        bus: EventBus | None = None,
        ledger: PidLedger | None = None,
        inbox_size: int = 1024,
        sampler: MemorySampler | None = None,
        transport: ChildTransport | None = None,
        downloads: DownloadLauncher | None = None,
    ) -> None:
        send, recv = trio.open_memory_channel[Message](inbox_size)
        self._core = core
        self._send = send
        self._recv = recv
        self._ids = itertools.count(1)
        self._replies = Replies()
        self.bus = bus or EventBus()
        self._memory = MemoryWork(core, specs, sampler, send)
        self._keeper = CatalogKeeper(specs, catalog, send, self._publish_event)
        self._effects = EffectExecutor(
            core, specs, self._keeper, self._memory, self._replies, self.bus, ledger,
            send, transport,
        )  # fmt: skip
        self._downloads = SchedulerDownloads(
            downloads, self._keeper, self._replies, send, lambda: next(self._ids)
        )
        self._nursery: trio.Nursery | None = None
        self._wait: trio.CancelScope | None = None  # the loop's wait for a message
        self._snapshot = core.snapshot()
        self._stale = False  # the core changed since _snapshot was built
        # Each waiter's predicate, its event and the snapshot that satisfied it.
        self._watchers: list[tuple[Callable[[Snapshot], bool], trio.Event, list[Snapshot]]] = []

    def _publish_event(self, event: SchedulerEvent) -> None:
        self._effects.publish(event)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` with every event as it is emitted, inside the scheduler (for
        counters, which must see every event; the SSE bus drops slow subscribers). It
        must be quick and never block; an exception it raises is logged and ignored."""
        self._effects.add_listener(listener)

    @property
    def prepared(self) -> PreparedCatalog:
        """The catalog the model table was built from; replaced whole on reload."""
        return self._keeper.current

    def instance(self, model: str) -> Instance | None:
        return self._effects.instances.get(model)

    # ----- reading -------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The table as of the last message; immutable, safe to read from anywhere.
        Built when first read after a change, not after every message (the hot path
        changes in-flight counts twice per request)."""
        if self._stale:
            self._snapshot = self._core.snapshot()
            if downloads := self._downloads.views():
                self._snapshot = attrs.evolve(self._snapshot, downloads=downloads)
            self._stale = False
        return self._snapshot

    @property
    def ledger(self) -> MemoryLedger | None:
        """The memory ledger (None without memory admission); owned by the core."""
        return self._core.ledger

    @property
    def sampler(self) -> MemorySampler | None:
        return self._memory.sampler

    def not_loaded(self, model: str) -> Failure | None:
        """The scheduler's refusal of a request for ``model`` that may not load it (see
        `SchedulerCore.not_loaded`): asked, never derived from the snapshot."""
        return self._core.not_loaded(model)

    async def wait_until(self, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Wait (no polling) until a published snapshot satisfies ``predicate``; returns
        that snapshot (the state may have moved on by the time the waiter runs)."""
        snap = self.snapshot
        if predicate(snap):
            return snap
        event = trio.Event()
        matched: list[Snapshot] = []
        entry = (predicate, event, matched)
        self._watchers.append(entry)
        try:
            await event.wait()
        finally:
            if entry in self._watchers:
                self._watchers.remove(entry)
        return matched[0]

    @contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        with self.bus.subscribe() as events:
            yield events

    # ----- asking --------------------------------------------------------------------

    @asynccontextmanager
    async def lease(
        self, model: str, *, autoload: bool = True, update_last_used: bool = True
    ) -> AsyncIterator[Grant]:
        """Wait until ``model`` can serve, then hold it (counted in flight) inside the block.

        Raises `ModelUnavailable` with upstream's error when it cannot be served. A caller
        cancelled while waiting leaves the queue; any slot freed for it goes to the next.
        """
        rid, grant = await self.acquire(model, autoload=autoload, update_last_used=update_last_used)
        try:
            yield grant
        finally:
            await self.release(rid)

    @asynccontextmanager
    async def lease_if_ready(self, model: str) -> AsyncIterator[Grant | None]:
        """Hold ``model`` inside the block if it is loaded right now, else yield None:
        never waits, never loads (the resumable-stream routes, ``/v1/stream``)."""
        try:
            rid, grant = await self.acquire(model, ready_only=True, update_last_used=False)
        except ModelUnavailable:
            yield None
            return
        try:
            yield grant
        finally:
            await self.release(rid)

    async def acquire(
        self,
        model: str,
        *,
        autoload: bool = True,
        update_last_used: bool = True,
        ready_only: bool = False,
        terms: TenantTerms = DEFAULT_TERMS,
        slot: bool = False,
    ) -> tuple[int, Grant]:
        """The two halves of `lease`, for callers that must shield only the wait.
        ``terms``: whose request; ``slot``: it occupies one of the child's slots, so it
        waits while they are all taken (fair queuing across tenants, `troupe.sched.fair`)."""
        rid = next(self._ids)
        if self._nursery is not None and self._core.grants_at_once(
            model, autoload, ready_only, terms, slot
        ):
            # The hot path: a model that is up is leased right here, without a trip
            # through the inbox. Still the scheduler's own code changing its own core,
            # with no await in between, so nothing can interleave; and taking a lease
            # only ever removes TTL deadlines, so the loop's wait stays right.
            now = trio.current_time()
            effects = self._core.acquire(
                rid,
                model,
                now,
                autoload=autoload,
                update_last_used=update_last_used,
                ready_only=ready_only,
                terms=terms,
                slot=slot,
            )
            grant = next(e.result for e in effects if isinstance(e, Reply) and e.to == rid)
            rest = [e for e in effects if not (isinstance(e, Reply) and e.to == rid)]
            self._effects.apply(rest, now)
            self._publish()
            assert isinstance(grant, Grant)
            return rid, grant
        send, recv = trio.open_memory_channel[Grant | Failure | None](1)
        await self._send.send(
            Acquire(rid, model, autoload, update_last_used, send, ready_only, terms, slot)
        )
        try:
            result = await recv.receive()
        except BaseException:
            await self._release_queued(rid, None)  # (its Acquire may not be read yet)
            raise
        if not isinstance(result, Grant):
            assert isinstance(result, Failure)
            raise ModelUnavailable(result)
        return rid, result

    async def release(self, rid: int, tokens: int | None = None) -> None:
        """``tokens``: what the answer used, prompt + generated (None: unknown): its
        tenant's attained service (fair queuing)."""
        wait = self._wait
        if wait is None:  # the loop is not running
            await self._release_queued(rid, tokens)
            return
        # The hot path, as acquire's: released right here, after its grant (so its
        # Acquire was read), without a trip through the inbox: the core changed in the
        # caller's task with no await in between, and nothing to shield. A release can
        # make a model idle (a TTL to wait for): the loop's wait is moved up to it.
        now = trio.current_time()
        self._replies.drop(rid)
        self._effects.apply(self._core.release(rid, now, tokens), now)
        self._publish()
        deadline = self._core.next_deadline()
        if deadline is not None and deadline < wait.deadline:
            wait.deadline = deadline

    async def _release_queued(self, rid: int, tokens: int | None) -> None:
        # Shielded: a cancelled request must still give back what it holds. Through the
        # inbox: behind the request's own Acquire, if that was not read yet.
        with trio.CancelScope(shield=True):
            await self._send.send(Release(rid, tokens))

    async def keep_alive(self, model: str, gen: int | None, seconds: float) -> None:
        """How long ``model``'s child ``gen`` stays loaded once idle (`SchedulerCore.keep_alive`).
        Sent by a request while it holds its lease, so the release that follows sees it;
        returns once it is in effect (and in the snapshot)."""
        with trio.CancelScope(shield=True):  # it must not be lost with a client that left
            await self._ask(lambda rid, reply: KeepAlive(rid, model, gen, seconds, reply))

    async def unload_once_idle(self, model: str) -> None:
        """Ollama's ``keep_alive: 0`` with nothing to generate: ``model``'s child unloads as
        soon as its requests end; returns once it is gone (at once when nothing runs or its
        preset pins it: the scheduler decides). A caller that leaves calls nothing off."""
        rid = next(self._ids)
        send, recv = trio.open_memory_channel[Grant | Failure | None](1)
        with trio.CancelScope(shield=True):  # it must not be lost with a client that left
            await self._send.send(KeepAlive(rid, model, None, 0, send, until_gone=True))
        try:
            await recv.receive()
        except BaseException:
            await self._release_queued(rid, None)  # no longer waited for; the unload goes on
            raise

    async def load(self, model: str) -> None:
        """``POST /models/load``; raises `ModelUnavailable` with upstream's error."""
        await self._ask(lambda rid, reply: LoadModel(rid, model, reply))

    async def unload(self, model: str) -> None:
        await self._ask(lambda rid, reply: UnloadModel(rid, model, reply))

    async def reload(self) -> None:
        """Re-scan the sources and reconcile the table (as upstream); returns once the new
        catalog is in effect. Carried out whether or not the caller waits for it."""
        await self._ask(Reload)

    async def remove(self, model: str) -> None:
        """``DELETE /models``: stop ``model``, delete its cache files, reload (as upstream)."""
        await self._ask(lambda rid, reply: RemoveModel(rid, model, reply))

    async def start_download(
        self, name: str, plan: DownloadPlan | None, error: str = "", error_status: int = 0
    ) -> None:
        """``POST /models``: a ``downloading`` entry and its job; `ModelUnavailable` (400)
        when the name exists or its files are being written by another download."""
        await self._ask(
            lambda rid, reply: StartDownload(rid, name, plan, error, error_status, reply)
        )

    async def begin_shutdown(self) -> None:
        """Shutdown's first step: every waiter is answered, no load starts, leases held
        now may finish (see `wait_until` for in-flight counts)."""
        await self._ask(BeginShutdown)

    async def stop_all(self) -> None:
        """Stop every child (each through its ladder) and return when none runs."""
        await self._ask(StopAll)

    async def _ask(self, make: Callable[[int, ReplyChannel], Message]) -> None:
        rid = next(self._ids)
        send, recv = trio.open_memory_channel[Grant | Failure | None](1)
        await self._send.send(make(rid, send))
        result = await recv.receive()
        if isinstance(result, Failure):
            raise ModelUnavailable(result)

    # ----- the actor -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for part in (self._effects, self._memory, self._keeper, self._downloads):
                part.nursery = nursery
            task_status.started()
            now = trio.current_time()
            self._effects.apply(self._core.start(now), now)
            self._publish()
            while True:
                deadline = self._core.next_deadline()
                message: Message | None = None
                with trio.move_on_at(math.inf if deadline is None else deadline) as wait:
                    self._wait = wait
                    message = await self._recv.receive()
                self._wait = None
                now = trio.current_time()
                if message is None:
                    effects = self._core.on_time(now)
                else:
                    effects = self._dispatch(message, now)
                self._effects.apply(effects, now)
                self._publish()

    def _dispatch(self, msg: Message, now: float) -> list[Effect]:
        core = self._core
        if (effects := self._downloads.dispatch(msg)) is not None:
            return effects
        expect = self._replies.expect
        match msg:
            case Acquire():
                expect(msg.rid, msg.reply)
                return core.acquire(
                    msg.rid,
                    msg.model,
                    now,
                    autoload=msg.autoload,
                    update_last_used=msg.update_last_used,
                    ready_only=msg.ready_only,
                    terms=msg.terms,
                    slot=msg.slot,
                )
            case Release():
                self._replies.drop(msg.rid)  # an asker that gave up waiting
                return core.release(msg.rid, now, msg.tokens)
            case KeepAlive():
                expect(msg.rid, msg.reply)
                return core.keep_alive(
                    msg.model, msg.gen, msg.seconds, now, rid=msg.rid, until_gone=msg.until_gone
                )
            case LoadModel():
                expect(msg.rid, msg.reply)
                return core.load(msg.rid, msg.model, now)
            case UnloadModel():
                expect(msg.rid, msg.reply)
                return core.unload(msg.rid, msg.model, now)
            case StopAll():
                expect(msg.rid, msg.reply)
                self._downloads.stop_all()  # paused: the journal resumes them next start
                return core.stop_all(msg.rid, now)
            case BeginShutdown():
                expect(msg.rid, msg.reply)
                return [*core.begin_shutdown(now), Reply(msg.rid, None)]
            case Reload():
                expect(msg.rid, msg.reply)
                self._keeper.rescan(msg.rid)
                return []
            case RemoveModel():
                expect(msg.rid, msg.reply)
                return self._keeper.remove(msg.rid, msg.model, core, now)
            case Rescanned():
                return self._keeper.rescanned(msg, core, now)
            case Spawned():
                self._effects.child_started(msg.model, msg.gen, msg.port, msg.connections)
                return core.spawned(msg.model, msg.gen, msg.port, msg.pid, now, slots=msg.slots)
            case ChildState():
                return core.child_state(msg.model, msg.gen, msg.state, msg.payload, now)
            case Exited():
                self._effects.child_gone(msg.model, msg.gen)
                return core.exited(
                    msg.model,
                    msg.gen,
                    msg.code,
                    now,
                    expected=msg.expected,
                    detail=msg.detail,
                    oom=msg.oom,
                    oom_device=msg.oom_device,
                )
            case MemorySampled():
                effects = core.memory_sampled(msg.sample, msg.version, now)
                self._memory.remember()
                return effects
            case MemorySampleFailed():
                return core.memory_sample_failed(msg.version, now)
            case Measured():
                self._memory.measure_done(msg.model, msg.fingerprint)
                return core.measured(msg.model, msg.fingerprint, msg.need, msg.high, now)
            case MeasureFailed():
                self._memory.measure_done(msg.model, msg.fingerprint)
                about(log, msg.model).info("no projection from the engine: %s", msg.reason)
                return core.measure_failed(msg.model, msg.fingerprint, msg.reason, now)
        raise AssertionError(f"unknown message {msg!r}")

    def _publish(self) -> None:
        self._stale = True
        for entry in list(self._watchers):
            predicate, event, matched = entry
            snap = self.snapshot
            if predicate(snap):
                matched.append(snap)
                event.set()
                self._watchers.remove(entry)
