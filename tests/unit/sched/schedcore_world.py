"""The world around `SchedulerCore`, as the stateful test models it.

`World` keeps what the scheduler actor and its clients would know: which child runs
for each model (started or not, stopping or not), who waits for a reply, which leases
are out, when each model crashed and was last used. `step` takes the effects of one
event, carries them out on this model and checks each of them (one reply per request,
a Stop only for a live child and only once, evictions only of idle unwanted models,
FIFO claims, troupe's own SSE events), then checks that the core is at rest.
The rules that produce events live in test_sched_core_stateful.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
from schedcore_kit import Sse, sse

from troupe.sched import (
    Effect,
    Emit,
    Failure,
    Grant,
    ModelConfig,
    ModelView,
    Phase,
    Prefetch,
    Reply,
    Restart,
    RestartKey,
    SampleMemory,
    SchedulerCore,
    Spawn,
    Status,
    Stop,
)
from troupe.sched.effects import Reloaded
from troupe.sched.fair import DEFAULT_SLOTS
from troupe.sched.lru import demand, evictions_needed, pick_victim
from troupe.sched.placement import WIDEN_AFTER
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.terms import TenantTerms
from troupe.sched.views import status_of

__all__ = ["CRASH_LIMIT", "CRASH_WINDOW", "REPORTED", "Ask", "Child", "World"]

# Stops for idleness: the preset's ttl, or a client's keep_alive (its own words).
_IDLE_STOPS = (StopReason.TTL, StopReason.KEEP_ALIVE)
CRASH_LIMIT = 3
CRASH_WINDOW = 20.0
FAILURE_KINDS = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
    503: "unavailable_error",
}
REPORTED = {"loading": Status.LOADING, "ready": Status.LOADED, "sleeping": Status.SLEEPING}


@attrs.define
class Child:
    """One child as its instance actor sees it."""

    gen: int
    delayed: bool = False  # LLAMA_SERVER_DEBUG_FAKE_TIMING: "loading" only once started
    started: bool = False  # False: the Spawn is still being carried out
    status: Status = Status.UNLOADED  # what the table must say (a start says "loading")
    port: int = 0
    stop: Stop | None = None  # a Stop the actor is carrying out


@attrs.define
class Ask:
    """A request waiting for its one reply."""

    kind: str  # acquire | load | unload | stop_all | reload | keep_alive
    model: str
    autoload: bool = True
    post: bool = True  # a POST: using the model makes it recently used (upstream's last_used)
    step: int = 0  # the step it arrived in (a reply in a later step means it waited)
    tenant: int = 0  # whose request: an index into World.tenants
    slot: bool = False  # it occupies one of the child's slots (fair queuing)


class World:
    """Everything but the rules: state, the actor's part, and the per-step checks."""

    def __init__(self) -> None:
        super().__init__()
        self.core: SchedulerCore | None = None
        self.now = 0.0
        self.step_no = 0
        self.rids = itertools.count(1)
        self.ports = itertools.count(20000)
        self.children: dict[str, Child] = {}
        self.gen: dict[str, int] = {}
        self.crashes: dict[str, list[float]] = {}
        self.closing = False
        self.waiting: dict[int, Ask] = {}
        self.leases: dict[int, tuple[str, int]] = {}
        self.answered: set[int] = set()
        self.left: set[int] = set()
        self.prev_entries: list[Any] = []
        self.queue_seen: dict[str, tuple[int, int]] = {}
        self.direct_victims: dict[int, tuple[str, int]] = {}  # load rid -> victim, its gen
        self.oom_retry: set[str] = set()  # models to be spawned again after an OOM death
        self.replanning: set[str] = set()  # stopped to be spawned again on a narrower lane
        self.last_used: dict[str, float] = {}  # set at spawn and by each POST it serves
        self.reloading = False
        self.restart: set[str] = set()  # models the reload under way stops
        self.out: list[Effect] = []
        self.clean = True

        self.configs: dict[str, ModelConfig] = {}
        self.table_keys: dict[str, RestartKey] = {}  # each model's key in the core's table
        # POST /models/load rid -> its model, and when its fake-timing sleep ends
        self.load_due: dict[int, tuple[str, float]] = {}
        self.gone_waits: dict[int, tuple[str, int]] = {}  # keep_alive 0 rid -> its child
        self.key_version = 0
        self.kept: dict[str, tuple[int, float]] = {}  # a request's keep_alive: (gen, seconds)
        self.names: list[str] = []
        self.models_max = 0
        self.fake_timing = False
        self.queue_max = 0
        # Fair queuing: the tenants requests come from, each child's slots, and for each
        # slot-using lease its tenant; how often each waiting tenant was passed over.
        self.tenants: list[TenantTerms] = [TenantTerms()]
        self.slots = DEFAULT_SLOTS
        self.slot_leases: dict[int, tuple[str, int, int]] = {}  # rid -> model, gen, tenant
        self.bypassed: dict[int, int] = {}
        self.max_bypass = 32

    # ----- the world's own bookkeeping ----------------------------------------------------

    def tick(self, dt: float = 1.0) -> float:
        self.clean = False  # set again once the step and the invariants have passed
        self.now += dt
        self.step_no += 1
        return self.now

    def ask(
        self,
        kind: str,
        model: str,
        autoload: bool = True,
        post: bool = True,
        tenant: int = 0,
        slot: bool = False,
    ) -> int:
        rid = next(self.rids)
        self.waiting[rid] = Ask(kind, model, autoload, post, self.step_no + 1, tenant, slot)
        return rid

    # ----- fair queuing, as the world sees it -------------------------------------------------

    def tenant_slots(self, tenant: int) -> int:
        return sum(1 for _, _, t in self.slot_leases.values() if t == tenant)

    def slot_free(self, model: str, tenant: int) -> bool:
        """May a slot-using request of ``tenant`` take a slot of ``model``'s child now: a
        free slot, under its max_parallel, not one kept for a class above its own."""
        child = self.children.get(model)
        if child is None:
            return False
        terms = self.tenants[tenant]
        on = [t for m, g, t in self.slot_leases.values() if (m, g) == (model, child.gen)]
        if len(on) >= self.slots:
            return False
        if terms.max_parallel is not None and self.tenant_slots(tenant) >= terms.max_parallel:
            return False
        kept = min(terms.held_back, self.slots - 1)
        above = sum(1 for t in on if self.tenants[t].priority > terms.priority)
        return self.slots - len(on) > max(0, kept - above)

    def serves(self, model: str) -> bool:
        """Its child takes new leases (up, not stopping, not draining)."""
        assert self.core is not None
        child = self.children.get(model)
        if child is None or not child.started or child.stop is not None:
            return False
        return self.core.table.models[model].phase.serves

    def check_slot_grant(self, rid: int, ask: Ask, grant: Grant) -> None:
        """A slot of ``grant.model`` went to ``rid``: nobody of a higher class that could
        have taken it waits, and every tenant of its class with an earlier request that
        could have taken it is passed over once more, never more than the bound."""
        tenant = self.tenants[ask.tenant]
        for other, a in self.waiting.items():
            if a.kind != "acquire" or not a.slot or a.model != grant.model:
                continue
            if not self.slot_free(a.model, a.tenant):
                continue
            terms = self.tenants[a.tenant]
            assert terms.priority <= tenant.priority, (
                f"{rid} ({tenant}) took a slot while {other} ({terms}) of a higher class waits"
            )
        passed = {
            a.tenant
            for other, a in self.waiting.items()
            if a.kind == "acquire"
            and a.slot
            and a.model == grant.model
            and other < rid
            and a.tenant != ask.tenant
            and self.tenants[a.tenant].priority == tenant.priority
            and self.slot_free(a.model, a.tenant)
        }
        for t in passed:
            self.bypassed[t] = self.bypassed.get(t, 0) + 1
            bound = self.max_bypass + len(self.tenants) - 1
            assert self.bypassed[t] <= bound, (
                f"tenant {t} passed over {self.bypassed[t]} times (bound {bound})"
            )
        self.bypassed.pop(ask.tenant, None)

    def held(self, model: str) -> bool:
        """The crash-loop rule, independently: CRASH_LIMIT unexpected exits closer than
        CRASH_WINDOW hold the model back until the first of them is a window old."""
        cs = self.crashes[model]
        k = CRASH_LIMIT
        until = [
            cs[i] + CRASH_WINDOW
            for i in range(len(cs) - k + 1)
            if cs[i + k - 1] - cs[i] < CRASH_WINDOW
        ]
        return bool(until) and self.now < max(until)

    def replies_to(self, rid: int) -> list[Reply]:
        return [e for e in self.out if isinstance(e, Reply) and e.to == rid]

    def only_reply(self, rid: int) -> Grant | Failure | None:
        found = self.replies_to(rid)
        assert len(found) == 1, f"expected one reply to {rid} in {self.out}"
        return found[0].result

    def one_result(self, replies: list[Reply]) -> Grant | Failure | None:
        assert len(replies) == 1, replies
        return replies[0].result

    def of_type(self, kind: type) -> list[Any]:
        return [e for e in self.out if isinstance(e, kind)]

    def events(self) -> list[Sse]:
        """The last step's SSE events, as subscribers see them."""
        return [sse(e) for e in self.out if isinstance(e, Emit)]

    def upstream_events(
        self, model: str, events: tuple[str, ...] = ("model_status", "status_change")
    ) -> list[Sse]:
        """Upstream's SSE events about ``model`` in the last step (a queued request's
        spawn, set off by the same event, announces itself too: left out here)."""
        spawned = {s.model for s in self.of_type(Spawn)}
        return [
            e
            for e in self.events()
            if e.model == model
            and e.event in events
            and not (e.event == "model_status" and model in spawned)
        ]

    # ----- the actor: carrying out effects and checking them --------------------------------

    def step(self, effects: list[Effect]) -> list[Effect]:
        assert self.core is not None
        self.out = effects
        stop_all_answered = False
        loads_done: list[str] = []
        for e in effects:
            assert not isinstance(e, SampleMemory), f"no memory ledger, yet {e}"
            if isinstance(e, Spawn):
                self.on_spawn(e)
            elif isinstance(e, Stop):
                self.on_stop(e)
            elif isinstance(e, Reply):
                ask = self.waiting.get(e.to)
                stop_all_answered |= ask is not None and ask.kind == "stop_all"
                if ask is not None and ask.kind == "load" and e.result is None:
                    loads_done.append(ask.model)
                self.on_reply(e)
            elif isinstance(e, Emit):
                self.on_emit(sse(e))
            elif isinstance(e, Reloaded):
                self.on_reloaded(e)
            elif isinstance(e, Prefetch):
                # Read ahead only for a model a request waits for, with no child to serve it.
                child = self.children.get(e.model)
                assert self.wanted(e.model, ("acquire",)), f"{e} but nobody waits for it"
                assert child is None or child.stop is not None, f"{e} while {child} serves it"
            else:
                raise AssertionError(f"unknown effect {e!r}")
        if stop_all_answered:
            assert not self.children, f"shutdown answered while {self.children} run"
        self.check_claims(loads_done)
        self.check_troupe_events()
        self.check_stops([e for e in effects if isinstance(e, Stop)])
        self.check_nothing_left_undone()
        self.check_lanes()
        waiting = {a.tenant for a in self.waiting.values() if a.kind == "acquire"}
        self.bypassed = {t: n for t, n in self.bypassed.items() if t in waiting}
        for name in list(self.replanning):  # a second start called off (unload, shutdown)
            back = self.core.table.models[name].restart is Restart.REPLAN
            if not back and name not in self.children:
                self.replanning.discard(name)
        return effects

    def on_reloaded(self, e: Reloaded) -> None:
        """The new catalog is in: no model the reload stopped may still run."""
        assert self.reloading, f"{e} with no reload under way"
        assert e.rid in e.rids, e
        assert Sse("*", "models_reload") in self.events(), self.out
        for name in self.restart:
            assert name not in self.children, f"{e} while {name} still runs"
        for name in self.names:
            if name not in self.children:
                self.crashes[name].clear()  # a reload clears "failed" and crash counts
                self.replanning.discard(name)  # and calls off a start on a narrower lane
        self.reloading = False
        self.restart = set()
        self.table_keys = {n: c.restart_key for n, c in self.configs.items()}

    def check_claims(self, loads_done: list[str]) -> None:
        """A Spawn that no POST /models/load answered came from the queue: only the first
        entry not loading yet may claim (arrival order), and it is marked as loading."""
        assert self.core is not None
        entries = self.core.queue.entries
        for e in self.of_type(Spawn):
            if e.model in loads_done:
                loads_done.remove(e.model)
                continue
            if e.model in self.oom_retry:
                self.oom_retry.discard(e.model)
                continue
            if e.model in self.replanning:
                self.replanning.discard(e.model)
                continue
            assert entries, f"{e} with nobody queued"
            idx = next((i for i, x in enumerate(entries) if x.model == e.model), None)
            assert idx is not None, f"{e} but no entry for it: {entries}"
            assert entries[idx].loading, f"{e} from an entry not marked loading: {entries}"
            assert all(x.loading for x in entries[:idx]), f"{e} jumped the line: {entries}"

    def check_troupe_events(self) -> None:
        """troupe's own SSE events: ``troupe_evict`` with each stop the scheduler decided
        on, ``troupe_queue`` whenever an entry's waiters or position changed."""
        assert self.core is not None
        evicts = [e for e in self.events() if e.event == "troupe_evict"]
        decided = [s for s in self.of_type(Stop) if s.cause.reason.is_eviction]
        assert sorted((e.model, (e.data or {}).get("reason")) for e in evicts) == sorted(
            (s.model, s.cause.describe()) for s in decided
        ), (evicts, decided)
        now_seen = {e.model: (e.waiters, i + 1) for i, e in enumerate(self.core.queue.entries)}
        queue_events = {e.model: e.data for e in self.events() if e.event == "troupe_queue"}
        changed = {
            m: now_seen.get(m)
            for m in now_seen.keys() | self.queue_seen.keys()
            if now_seen.get(m) != self.queue_seen.get(m)
        }
        # One event per change of waiters or position; more when only the reason changed.
        assert set(changed) <= set(queue_events), (queue_events, changed)
        for m, data in queue_events.items():
            state = now_seen.get(m)
            waiters, position = state if state is not None else (0, None)
            assert data is not None
            assert (data["waiting"], data["position"]) == (waiters, position), data
            assert isinstance(data["reason"], str) == (state is not None), data
        self.queue_seen = now_seen

    def on_spawn(self, e: Spawn) -> None:
        assert not self.closing, f"spawn during shutdown: {e}"
        assert not self.reloading, f"spawn while a reload is under way: {e}"
        assert e.model in self.configs, e
        assert e.model not in self.children, f"second child for {e.model}: {e}"
        assert e.gen > self.gen[e.model], f"generation did not grow: {e}"
        assert e.delay in ((0.0, 2.0) if self.fake_timing else (0.0,)), e
        self.gen[e.model] = e.gen
        delayed = e.delay > 0
        status = Status.UNLOADED if delayed else Status.LOADING
        self.children[e.model] = Child(e.gen, delayed=delayed, status=status)
        if not delayed and e.model not in self.replanning:
            # A load is a use; a start again on a narrower CPU lane is not (it keeps the
            # model's place in the LRU order).
            self.last_used[e.model] = self.now
        if not delayed:  # upstream's load() says "loading" as it spawns
            said = [x for x in self.events() if x.model == e.model]
            assert Sse(e.model, "model_status", {"status": "loading"}) in said, self.out

    def on_stop(self, e: Stop) -> None:
        child = self.children.get(e.model)
        assert child is not None, f"Stop for a model with no child: {e}"
        assert child.gen == e.gen, f"Stop for the wrong generation: {e} vs {child}"
        assert child.stop is None, f"second Stop for one child: {e} after {child.stop}"
        loading = not child.started or child.status is Status.LOADING
        assert e.kill == loading, f"kill={e.kill} for a child in {child}"
        child.stop = e

    def on_reply(self, e: Reply) -> None:
        assert e.to not in self.left, f"reply to a request that left: {e}"
        assert e.to not in self.answered, f"second reply: {e}"
        ask = self.waiting.pop(e.to, None)
        assert ask is not None, f"reply to nobody: {e}"
        self.answered.add(e.to)
        r = e.result
        if isinstance(r, Grant):
            assert ask.kind == "acquire", (ask, e)
            assert r.model == ask.model, (ask, e)
            child = self.children.get(r.model)
            assert child is not None, f"grant without a child: {e}"
            assert child.started, f"grant before the child is up: {e}"
            assert (r.gen, r.port) == (child.gen, child.port), (e, child)
            if ask.autoload:
                assert child.status in (Status.LOADED, Status.SLEEPING), (e, child)
                assert child.stop is None, f"grant on a stopping model: {e}"
            assert r.waited == (ask.step != self.step_no), (e, ask, self.step_no)
            lease = self.core.requests.leases[e.to] if self.core is not None else None
            assert lease is not None
            # A grant with autoload is of a child that serves: a slot is taken. Without,
            # one still loading answers 503 itself and takes none.
            if ask.slot and ask.autoload:
                assert lease.slot, (e, ask, lease)
            assert ask.slot or not lease.slot, (e, ask, lease)
            if lease.slot:
                self.check_slot_grant(e.to, ask, r)
                self.slot_leases[e.to] = (r.model, r.gen, ask.tenant)
            self.leases[e.to] = (r.model, r.gen)
            if ask.post:
                self.last_used[r.model] = self.now
        elif isinstance(r, Failure):
            assert FAILURE_KINDS[r.status] == r.type, r
            assert ask.kind != "stop_all", e
        else:
            assert ask.kind in ("load", "unload", "stop_all", "reload", "keep_alive"), (ask, e)

    def on_emit(self, e: Sse) -> None:
        if e.event.startswith("troupe_"):
            return  # checked as a whole by check_troupe_events
        if e.event == "models_reload":
            assert (e.model, e.data) == ("*", None), e
            return
        assert e.model in self.configs, e
        assert e.event in ("model_status", "status_change"), e
        assert e.data is not None
        if e.event == "model_status":
            assert e.data == {"status": "loading"}, e
            return
        status = e.data["status"]
        assert status in ("loading", "loaded", "sleeping", "unloaded"), e
        assert set(e.data) <= {"status", "exit_code", "info", "progress"}, e
        assert ("exit_code" in e.data) == (status == "unloaded"), e
        if "info" in e.data:
            assert status == "loaded", e
            assert isinstance(e.data["info"], dict), e
            assert e.data["info"], e
        if "progress" in e.data:
            assert status == "loading", e

    def wanted(self, model: str, kinds: tuple[str, ...] = ("acquire", "load")) -> bool:
        return any(a.kind in kinds and a.model == model for a in self.waiting.values())

    def check_stops(self, issued: list[Stop]) -> None:
        """Evictions and TTL stops: only idle, unwanted, unpinned models, the least
        recently used first, and only for a request that still waits and needs a slot."""
        assert self.core is not None
        core = self.core
        entries = core.queue.entries
        queued = {e.model for e in entries}
        needy = {
            e.model
            for e in entries
            if not e.loading
            and (not core.table.models[e.model].is_running or core.table.models[e.model].stopping)
        } | {d.model for d in core.requests.direct.values()}
        snap = core.snapshot().models
        eligible = [
            v
            for v in snap.values()
            if v.status.is_ready_or_sleeping
            and not v.in_flight
            and not v.stopping
            and not v.pin
            and v.name not in queued
        ]
        # No more evictions than the queue needs, counting slots the world's way. An
        # eviction for POST /models/load is exempt: upstream's unload_lru evicts whenever
        # the running count, stopping models included, is at the limit.
        for_loads = {d.victim for d in core.requests.direct.values()}
        lru = [s for s in issued if s.cause.reason is StopReason.LRU]
        by_tick = [s for s in lru if s.model not in for_loads]
        if by_tick:
            stopping = sum(1 for c in self.children.values() if c.stop is not None)
            free = self.models_max - len(self.children) + stopping - (len(lru) - len(by_tick))
            lacking = [
                e.model
                for e in entries
                if e.model not in self.children or self.children[e.model].stop is not None
            ]
            assert free <= len(lacking), (
                f"{by_tick} leave {free} slots free for {lacking}; queue={entries}"
            )
        for s in issued:
            # Slots are saved before every stop but a kill, a removal and a reload's.
            going = s.cause.reason in (StopReason.REMOVE, StopReason.RELOAD, StopReason.DROPPED)
            assert s.save_slots is (not s.kill and not going), s
            if s.cause.reason is StopReason.REPLAN:
                # Narrowed (or widened) between requests, never while it serves.
                busy = [r for r, lease in self.leases.items() if lease == (s.model, s.gen)]
                assert not busy, f"{s} while requests {busy} are in flight"
                assert core.cpu is not None, s
                if s.cause.for_model is None:  # widened: idle, unwanted, long enough
                    assert s.model not in queued, f"{s} while requests are queued for it"
                    m = core.table.models[s.model]
                    assert m.idle_since + WIDEN_AFTER <= self.now, (s, m.idle_since)
                    continue
                # Narrowed for a model that took the cores it gives up, or waits for them.
                taker = core.table.models[s.cause.for_model]
                assert self.wanted(taker.name) or taker.is_running, f"{s} but nobody needs it"
                continue
            if s.cause.reason is StopReason.DRAIN:
                # Fair admission: a busy model drained for a starving one, stopped only
                # once its last request ended, never a pinned one.
                busy = [r for r, lease in self.leases.items() if lease == (s.model, s.gen)]
                assert not busy, f"{s} while requests {busy} are in flight"
                assert not self.configs[s.model].pin, f"pinned model drained: {s}"
                assert self.core.drain_after is not None, s
                continue
            if s.cause.reason is StopReason.MEMORY:
                busy = [r for r, lease in self.leases.items() if lease == (s.model, s.gen)]
                assert not busy, f"{s} while requests {busy} are in flight"
                assert s.model not in queued, f"{s} while requests are queued for it"
                assert not self.configs[s.model].pin, f"pinned model evicted: {s}"
                continue
            if not (s.cause.reason in _IDLE_STOPS or s.cause.reason is StopReason.LRU):
                continue
            busy = [rid for rid, lease in self.leases.items() if lease == (s.model, s.gen)]
            assert not busy, f"{s} while requests {busy} are in flight"
            assert s.model not in queued, f"{s} while requests are queued for it"
            assert not self.wanted(s.model, ("acquire",)), f"{s} while requests wait for it"
            if s.cause.reason in _IDLE_STOPS:
                ttl = self.ttl_of(s.model)
                assert ttl is not None, s
                assert core.table.models[s.model].idle_since + ttl <= self.now, s
                continue
            assert not self.configs[s.model].pin, f"pinned model evicted: {s}"
            target = s.cause.for_model
            assert self.wanted(target), f"{s} but nobody waits for {target}"
            assert target in needy, f"{s} but {target} needs no slot; queue={entries}"
            victim = snap[s.model]
            # A POST /models/load picks its victim as upstream's unload_lru does, by
            # recency alone (sched.settle `_advance_direct`), fair admission or not.
            by_load = any(
                (d.model, d.victim, d.victim_gen) == (target, s.model, s.gen)
                for d in core.requests.direct.values()
            )
            for other in eligible:
                # With fair admission the least demand goes first (sched.lru), else LRU.
                fair = not by_load
                assert self.victim_key(victim, fair) <= self.victim_key(other, fair), (
                    f"{s} evicts {victim.name} (used {victim.last_used}) before "
                    f"{other.name} (used {other.last_used})"
                )

    def victim_key(self, v: ModelView, fair: bool = True) -> tuple[float, float, str]:
        assert self.core is not None
        fair = fair and self.core.drain_after is not None
        wanted = demand(self.core.table.models[v.name], self.now) if fair else 0.0
        return (wanted, v.last_used, v.name)

    def check_nothing_left_undone(self) -> None:
        """After any event the core is at rest: nothing it could do now is left for a
        later, unrelated event (no polling, ARCHITECTURE.md principle 3)."""
        assert self.core is not None
        core = self.core
        entries = core.queue.entries
        has_slot = core.models_max <= 0 or core.running_count() < core.models_max
        first = core.queue.next_to_claim()
        if first is not None and has_slot and not core.changes.reloading:
            m = core.table.models[first.model]
            held = m.held_until is not None and self.now < m.held_until
            retry = m.restart is Restart.OOM
            if status_of(m) is Status.UNLOADED and not m.spawn_pending and not held and not retry:
                # It may wait for its CPU lane only while a wider child is being narrowed.
                assert self.replan_under_way(), f"{first} is next in line, could load, waits"
        for rid, a in self.waiting.items():
            # Fair queuing is work-conserving: a slot free to a waiting request is taken.
            if a.kind == "acquire" and a.slot and self.serves(a.model):
                assert not self.slot_free(a.model, a.tenant), (
                    f"{rid} ({self.tenants[a.tenant]}) waits while {a.model} has a slot for it"
                )
        need = evictions_needed(core.table.models, core.queue, core.models_max)
        if need > 0:
            victim = pick_victim(core.table.models, core.queue, now=core.clock.demand_now(self.now))
            assert victim is None, f"{need} slots needed and {victim} is idle: {entries}"
        for rid, d in core.requests.direct.items():
            due = self.load_due[rid][1] if rid in self.load_due else None
            deadline = core.next_deadline()
            if due is not None and deadline is not None and deadline <= due:
                # It sleeps out LLAMA_SERVER_DEBUG_FAKE_TIMING (or has, and an event that
                # settled nothing came first): the core wakes up for it, at once if due.
                continue
            if core.changes.reloading:
                continue  # upstream's load() waits for the reload to finish, too
            if d.victim is None and self.replan_under_way():
                continue  # it waits for its CPU lane: a wider child is being narrowed
            assert d.victim is not None, f"load {rid} parked with no victim and no reload"
            child = self.children.get(d.victim)
            gen = child.gen if child is not None else None
            victim, seen_gen = self.direct_victims.setdefault(rid, (d.victim, gen or -1))
            assert (victim, gen) == (d.victim, seen_gen), (
                f"load {rid} still waits for {d.victim}, whose child {seen_gen} is gone"
            )

    def replan_under_way(self) -> bool:
        assert self.core is not None
        for m in self.core.table:
            if m.restart is Restart.REPLAN:
                return True
            if m.phase is Phase.DRAINING and m.drain_reason is StopReason.REPLAN:
                return True
            if m.stopping and m.last_stop is not None and m.last_stop.reason is StopReason.REPLAN:
                return True
            if self.core.cpu is not None and status_of(m) is Status.LOADING and m.in_flight:
                return True  # a wider child still loading, a request on it: narrowed after
            if m.restarting:
                return True  # started again narrower: a load's victim is chosen once it is up
        return False

    def check_lanes(self) -> None:
        """Children troupe placed never share a core, unless their lanes say so."""
        assert self.core is not None
        lanes = [
            (m.name, m.cpu)
            for m in self.core.table
            if m.is_running and not m.stopping and m.cpu is not None
        ]
        for i, (a, pa) in enumerate(lanes):
            for b, pb in lanes[i + 1 :]:
                assert pa is not None
                assert pb is not None
                if not (pa.shared or pb.shared):
                    assert set(pa.cores).isdisjoint(pb.cores), (a, pa, b, pb)

    # ----- the instance actors' part -------------------------------------------------------

    def pick(self, pred: Any, i: int) -> tuple[str, Child]:
        items = sorted((m, c) for m, c in self.children.items() if pred(c))
        return items[i % len(items)]

    def start_child(self, model: str, child: Child) -> None:
        assert self.core is not None
        port = next(self.ports)
        said_loading = child.status is Status.LOADING
        child.started, child.port = True, port
        now = self.tick()
        if child.status is Status.UNLOADED:
            child.status = Status.LOADING
            self.last_used[model] = now  # a delayed spawn starts loading only now
        self.step(self.core.spawned(model, child.gen, port, port + 1, now, slots=self.slots))
        upstream = self.upstream_events(model)
        if said_loading:
            assert upstream == [], "loading was announced with the Spawn"
        else:
            assert upstream == [Sse(model, "model_status", {"status": "loading"})]

    def child_gone(self, model: str, child: Child, code: int, *, oom: bool = False) -> None:
        assert self.core is not None
        del self.children[model]
        expected = child.stop is not None
        if child.stop is not None and child.stop.cause.reason is StopReason.REPLAN:
            self.replanning.add(model)  # it comes back at once, narrower (maybe this step)
        now = self.tick()
        retried_before = self.core.table.models[model].oom_retried
        self.step(self.core.exited(model, child.gen, code, now, expected=expected, oom=oom))
        for rid, gone in list(self.gone_waits.items()):
            if gone == (model, child.gen):  # its keep_alive 0 is answered with the exit
                assert rid in self.answered or rid in self.left, f"{rid} waits for {gone}"
                del self.gone_waits[rid]
        retried = self.core.table.models[model].oom_retried and not retried_before
        if retried or any(
            s.cause == StopCause(StopReason.MEMORY, model) for s in self.of_type(Stop)
        ):
            # out of memory while loading: idle models go and the load is tried once more
            assert oom, self.out
            assert not expected, self.out
            assert child.status is Status.LOADING, self.out
            self.oom_retry.add(model)
        elif model in self.replanning:
            pass
        elif not expected:
            self.crashes[model].append(now)
        emitted = self.upstream_events(model, ("status_change",))
        if child.status.is_running:
            assert emitted == [
                Sse(model, "status_change", {"status": "unloaded", "exit_code": code})
            ]
        else:
            assert emitted == []

    def ttl_of(self, name: str) -> float | None:
        """The TTL in force: a request's keep_alive for the running child, else its config's
        (a config's pin beats it)."""
        kept = self.kept.get(name)
        child = self.children.get(name)
        config = self.configs[name]
        if kept is None or config.pin or child is None or kept[0] != child.gen:
            return config.ttl
        return kept[1]

    def loads_awake(self) -> set[str]:
        """Models of the POST /models/load calls that have slept out fake timing (and
        still wait, or were answered in this step)."""
        answered = {r.to for r in self.of_type(Reply)}
        return {
            model
            for rid, (model, due) in self.load_due.items()
            if due <= self.now and (rid in self.waiting or rid in answered)
        }

    def check_no_expired_ttl(self) -> None:
        assert self.core is not None
        deadline = self.core.next_deadline()
        assert deadline is None or deadline > self.now, (deadline, self.now)
        for s in self.of_type(Stop):
            if s.cause.reason is StopReason.LRU and self.core.drain_after is not None:
                continue  # the drain timer ended a hold for a model still loading (lru.py)
            if s.cause == StopCause(StopReason.REPLAN):
                continue  # a narrow child widened after idling (check_stops checks it)
            if s.cause.reason in (StopReason.LRU, StopReason.REPLAN) and (
                s.cause.for_model in self.loads_awake()
            ):
                continue  # a POST /models/load that slept out fake timing makes room
            assert s.cause.reason in _IDLE_STOPS, s
            assert self.ttl_of(s.model) is not None, s
