"""The scheduler actor: carries out what `SchedulerCore` decides, and nothing else.

It owns the core (the only writer of the model table), the instance actors, and the
reply channels of everyone waiting. The rest of the program talks to it through the
methods here: `lease`, `load`, `unload`, `stop_all`, `subscribe`, `snapshot`.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol

import attrs
import trio

from troupe.actors.download_supervisor import DownloadLauncher, DownloadSupervisor
from troupe.actors.events import EventBus
from troupe.actors.instance import Instance, LaunchSpec
from troupe.actors.memory import MemorySampler
from troupe.child.ledger import PidLedger
from troupe.download.plan import DownloadPlan
from troupe.messages import (
    Acquire,
    BeginReload,
    ChildState,
    DownloadFailed,
    DownloadFinished,
    DownloadProgress,
    Exited,
    FinishReload,
    ForgetDownloads,
    LoadModel,
    MemorySampled,
    Message,
    Release,
    ReplyChannel,
    Spawned,
    StartDownload,
    StopAll,
    UnloadModel,
)
from troupe.sched import (
    Effect,
    Emit,
    Failure,
    Grant,
    ModelConfig,
    Reply,
    SampleMemory,
    SchedulerCore,
    Snapshot,
    Spawn,
    Stop,
)
from troupe.sched.memory import MemoryLedger

__all__ = ["Launcher", "ModelUnavailable", "Scheduler"]

log = logging.getLogger("troupe.scheduler")


class Launcher(Protocol):
    """Where the scheduler gets a model's command line (the catalogue)."""

    def launch_spec(self, model: str) -> LaunchSpec: ...

    def remember_memory(self, model: str, used: Mapping[str, int]) -> None:
        """What ``model`` was seen to hold once up (kept for the next estimate)."""


class ModelUnavailable(Exception):
    """The scheduler answered a request with an error (upstream-shaped)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class Scheduler:
    def __init__(
        self,
        core: SchedulerCore,
        launcher: Launcher,
        bus: EventBus | None = None,
        ledger: PidLedger | None = None,
        inbox_size: int = 1024,
        sampler: MemorySampler | None = None,
        downloads: DownloadLauncher | None = None,
    ) -> None:
        self._core = core
        self._launcher = launcher
        self.bus = bus or EventBus()
        self._ledger = ledger
        self._send, self._recv = trio.open_memory_channel[Message](inbox_size)
        self._ids = itertools.count(1)
        self._replies: dict[int, ReplyChannel] = {}
        self._instances: dict[str, Instance] = {}
        self._nursery: trio.Nursery | None = None
        self._snapshot = core.snapshot()
        self._stale = False  # the core changed since _snapshot was built
        self._watchers: list[tuple[Callable[[Snapshot], bool], trio.Event]] = []
        self._sampler = sampler
        self._remembered: dict[str, Mapping[str, int]] = {}
        # Download jobs hold no child and no slot: their table lives beside the core.
        self._downloads = DownloadSupervisor(downloads, self._send.clone())

    # ----- reading -------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The table as of the last message; immutable, safe to read from anywhere.
        Built when first read after a change, not after every message (the hot path
        changes in-flight counts twice per request)."""
        if self._stale:
            self._snapshot = self._core.snapshot()
            if self._downloads.table.views():
                self._snapshot = attrs.evolve(self._snapshot, downloads=self._downloads.views())
            self._stale = False
        return self._snapshot

    @property
    def ledger(self) -> MemoryLedger | None:
        """The memory ledger (None without memory admission); owned by the core."""
        return self._core.memory

    @property
    def sampler(self) -> MemorySampler | None:
        return self._sampler

    def instance(self, model: str) -> Instance | None:
        return self._instances.get(model)

    async def wait_until(self, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Wait (no polling) until a published snapshot satisfies ``predicate``."""
        if predicate(self.snapshot):
            return self.snapshot
        event = trio.Event()
        entry = (predicate, event)
        self._watchers.append(entry)
        try:
            await event.wait()
        finally:
            if entry in self._watchers:
                self._watchers.remove(entry)
        return self.snapshot

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

    async def acquire(
        self, model: str, *, autoload: bool = True, update_last_used: bool = True
    ) -> tuple[int, Grant]:
        """The two halves of `lease`, for callers that must shield only the wait."""
        rid = next(self._ids)
        if self._nursery is not None and self._core.grants_at_once(model, autoload):
            # The hot path: a model that is up is leased right here, without a trip
            # through the inbox. Still the scheduler's own code changing its own core,
            # with no await in between, so nothing can interleave; and taking a lease
            # only ever removes TTL deadlines, so the loop's wait stays right.
            now = trio.current_time()
            effects = self._core.acquire(
                rid, model, now, autoload=autoload, update_last_used=update_last_used
            )
            grant = next(e.result for e in effects if isinstance(e, Reply) and e.to == rid)
            self._apply([e for e in effects if not (isinstance(e, Reply) and e.to == rid)], now)
            self._publish()
            assert isinstance(grant, Grant)
            return rid, grant
        send, recv = trio.open_memory_channel[Grant | Failure | None](1)
        await self._send.send(Acquire(rid, model, autoload, update_last_used, send))
        try:
            result = await recv.receive()
        except BaseException:
            await self.release(rid)
            raise
        if not isinstance(result, Grant):
            assert isinstance(result, Failure)
            raise ModelUnavailable(result)
        return rid, result

    async def release(self, rid: int) -> None:
        # Shielded: a cancelled request must still give back what it holds. Through the
        # inbox: a release can make a model idle, which the loop's TTL wait must see.
        with trio.CancelScope(shield=True):
            await self._send.send(Release(rid))

    async def load(self, model: str) -> None:
        """``POST /models/load``; raises `ModelUnavailable` with upstream's error."""
        await self._ask(lambda rid, reply: LoadModel(rid, model, reply))

    async def unload(self, model: str) -> None:
        await self._ask(lambda rid, reply: UnloadModel(rid, model, reply))

    async def stop_all(self) -> None:
        """Stop every child (each through its ladder) and return when none runs."""
        await self._ask(StopAll)

    async def begin_reload(self, restart: tuple[str, ...]) -> None:
        """Hold new loads and stop ``restart``; returns at once (see `wait_until`)."""
        await self._ask(lambda rid, reply: BeginReload(rid, restart, reply))

    async def finish_reload(self, models: tuple[ModelConfig, ...]) -> None:
        await self._ask(lambda rid, reply: FinishReload(rid, models, reply))

    async def start_download(
        self, name: str, plan: DownloadPlan | None, error: str = "", error_status: int = 0
    ) -> None:
        """``POST /models``: a ``downloading`` entry and its job; `ModelUnavailable` (400)
        when the name exists or its files are being written by another download."""
        await self._ask(
            lambda rid, reply: StartDownload(rid, name, plan, error, error_status, reply)
        )

    async def forget_downloads(self, jobs: Mapping[str, int]) -> None:
        await self._ask(lambda rid, reply: ForgetDownloads(rid, jobs, reply))

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
            self._downloads.nursery = nursery
            task_status.started()
            while True:
                deadline = self._core.next_deadline()
                message: Message | None = None
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    message = await self._recv.receive()
                now = trio.current_time()
                if message is None:
                    effects = self._core.on_time(now)
                else:
                    effects = self._dispatch(message, now)
                self._apply(effects, now)
                self._publish()

    def _dispatch(self, msg: Message, now: float) -> list[Effect]:
        core = self._core
        match msg:
            case Acquire():
                self._replies[msg.rid] = msg.reply
                return core.acquire(
                    msg.rid,
                    msg.model,
                    now,
                    autoload=msg.autoload,
                    update_last_used=msg.update_last_used,
                )
            case Release():
                return core.release(msg.rid, now)
            case LoadModel():
                self._replies[msg.rid] = msg.reply
                return core.load(msg.rid, msg.model, now)
            case UnloadModel() if msg.model in self._downloads:
                self._replies[msg.rid] = msg.reply
                return list(self._downloads.cancel(msg.rid, msg.model))
            case UnloadModel():
                self._replies[msg.rid] = msg.reply
                return core.unload(msg.rid, msg.model, now)
            case StopAll():
                self._replies[msg.rid] = msg.reply
                self._downloads.stop_all()
                return core.stop_all(msg.rid, now)
            case StartDownload() | ForgetDownloads():
                self._replies[msg.rid] = msg.reply
                return list(self._downloads.dispatch(msg))
            case DownloadProgress() | DownloadFinished() | DownloadFailed():
                return list(self._downloads.dispatch(msg))
            case BeginReload():
                self._replies[msg.rid] = msg.reply
                effects = core.begin_reload(msg.restart, now)
                return [*effects, Reply(msg.rid, None)]
            case FinishReload():
                self._replies[msg.rid] = msg.reply
                effects = core.finish_reload(msg.models, now)
                return [*effects, Reply(msg.rid, None)]
            case Spawned():
                return core.spawned(msg.model, msg.gen, msg.port, msg.pid, now)
            case ChildState():
                return core.child_state(msg.model, msg.gen, msg.state, msg.payload, now)
            case Exited():
                inst = self._instances.get(msg.model)
                if inst is not None and inst.gen == msg.gen:
                    del self._instances[msg.model]
                return core.exited(
                    msg.model,
                    msg.gen,
                    msg.code,
                    now,
                    expected=msg.expected,
                    detail=msg.detail,
                    oom=msg.oom,
                )
            case MemorySampled():
                effects = core.memory_sampled(msg.sample, msg.version, now)
                self._remember_memory()
                return effects
        raise AssertionError(f"unknown message {msg!r}")

    def _apply(self, effects: list[Effect], now: float) -> None:
        work = list(effects)
        while work:
            effect = work.pop(0)
            match effect:
                case Spawn():
                    work += self._spawn(effect, now)
                case Stop():
                    inst = self._instances.get(effect.model)
                    if inst is not None and inst.gen == effect.gen:
                        log.info("stopping %s (%s)", effect.model, effect.reason)
                        inst.stop(kill=effect.kill)
                case Reply():
                    work += self._reply(effect, now)
                case SampleMemory():
                    assert self._nursery is not None
                    self._nursery.start_soon(self._sample_memory, effect)
                case Emit():
                    if effect.event in ("troupe_evict", "troupe_memory"):
                        log.info("%s: %s %s", effect.model, effect.event, effect.data)
                    event: dict[str, Any] = {"model": effect.model, "event": effect.event}
                    if effect.data is not None:
                        event["data"] = effect.data
                    self.bus.publish(event)

    def _spawn(self, effect: Spawn, now: float) -> list[Effect]:
        assert self._nursery is not None
        try:
            spec = self._launcher.launch_spec(effect.model)
        except Exception as exc:  # a model that cannot be rendered fails alone
            log.exception("cannot prepare %s", effect.model)
            return self._core.exited(
                effect.model, effect.gen, 1, now, expected=False, detail=f"cannot start: {exc}"
            )
        inst = Instance(spec, effect.gen, self._send.clone(), self._ledger)
        self._instances[effect.model] = inst
        self._nursery.start_soon(inst.run, effect.delay)
        return []

    def _reply(self, effect: Reply, now: float) -> list[Effect]:
        channel = self._replies.pop(effect.to, None)
        if channel is None:
            return []
        try:
            channel.send_nowait(effect.result)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            # The asker is gone: a lease nobody will use must not stay counted in flight.
            if isinstance(effect.result, Grant):
                return self._core.release(effect.to, now)
        finally:
            channel.close()
        return []

    async def _sample_memory(self, effect: SampleMemory) -> None:
        if self._sampler is None:
            return
        try:
            sample = await self._sampler.asample(effect.pids)
        except Exception:  # a broken reading must not take the scheduler down
            log.exception("memory sampling failed")
            return
        await self._send.send(MemorySampled(sample, effect.version))

    def _remember_memory(self) -> None:
        ledger = self._core.memory
        if ledger is None:
            return
        for model, used in ledger.effective.items():
            if self._remembered.get(model) != used:
                self._remembered[model] = dict(used)
                self._launcher.remember_memory(model, used)

    def _publish(self) -> None:
        self._stale = True
        for predicate, event in list(self._watchers):
            if predicate(self.snapshot):
                event.set()
                self._watchers.remove((predicate, event))
