"""Hypothesis drives `SchedulerCore` the way the scheduler actor would.

The machine plays every other party: clients (arrivals, lease releases, disconnects
while waiting, POST /models/load and /unload, shutdown), the instance actors (a `Spawn`
becomes a pending start that later reports `spawned` or fails; a `Stop` becomes a
pending stop that later reports `exited`; a live child reports states or crashes) and
the clock. Pending operations complete in any order, and stale events from older
children are thrown in.

After every step the machine checks the effects against its own model of the world
(who waits, which child is up, which leases are out, how often a model crashed) and
the core's state against a few invariants: the --models-max limit, FIFO admission,
evictions only of idle unwanted models for someone who still waits, one reply per
request, in-flight counts, snapshot consistency, and that no event leaves work undone
(a claim or eviction that could happen now). At teardown the children behave,
everything pending completes, and every request still waiting must be answered.

Time is kept in whole seconds so that window and TTL boundaries compare exactly.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
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
    Spawn,
    Status,
    Stop,
)
from troupe.sched.lru import evictions_needed, pick_victim

NAMES = ("m0", "m1", "m2", "m3", "m4")
CRASH_LIMIT = 3
CRASH_WINDOW = 20.0
FAILURE_KINDS = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
    503: "unavailable_error",
}
LOADING_PAYLOADS = st.sampled_from(
    [None, {}, {"stages": ["text_model"], "current": "text_model", "value": 0.5}]
)
READY_PAYLOADS = st.sampled_from([None, {}, {"id": "x", "object": "model"}])
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

    kind: str  # acquire | load | unload | stop_all
    model: str
    autoload: bool = True
    post: bool = True  # a POST: using the model makes it recently used (§6.3 last_used)
    step: int = 0  # the step it arrived in (a reply in a later step means it waited)


class SchedulerMachine(RuleBasedStateMachine):
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
        self.last_used: dict[str, float] = {}  # set at spawn and by each POST it serves
        self.reloading = False
        self.out: list[Effect] = []
        self.clean = True

    def check_invariants(self, *args: Any, **kwargs: Any) -> None:
        super().check_invariants(*args, **kwargs)  # type: ignore[misc]
        self.clean = True

    # ----- set-up ---------------------------------------------------------------------

    @initialize(
        n=st.integers(3, 5),
        models_max=st.integers(0, 3),
        pins=st.lists(st.sampled_from([False, False, True]), min_size=5, max_size=5),
        ttls=st.lists(st.sampled_from([None, None, 5.0, 30.0]), min_size=5, max_size=5),
        warm=st.lists(st.booleans(), min_size=5, max_size=5),
        fake_timing=st.sampled_from([False, False, True]),
        queue_max=st.sampled_from([0, 0, 0, 4]),
    )
    def setup(
        self,
        n: int,
        models_max: int,
        pins: list[bool],
        ttls: list[float | None],
        warm: list[bool],
        fake_timing: bool,
        queue_max: int,
    ) -> None:
        # A pinned model never also has a TTL here: which of the two wins is a policy
        # question, not one of the invariants checked.
        configs = [
            ModelConfig(name, pin=pins[i], ttl=None if pins[i] else ttls[i])
            for i, name in enumerate(NAMES[:n])
        ]
        self.configs = {c.name: c for c in configs}
        self.names = [c.name for c in configs]
        self.models_max = models_max
        self.fake_timing = fake_timing
        self.queue_max = queue_max
        self.core = SchedulerCore(
            configs,
            models_max,
            crash_limit=CRASH_LIMIT,
            crash_window=CRASH_WINDOW,
            fake_timing=fake_timing,
            queue_max=queue_max,
        )
        self.gen = dict.fromkeys(self.names, 0)
        self.crashes = {name: [] for name in self.names}
        # Start some models up front, so that full and busy tables are common.
        for name, on in zip(self.names, warm, strict=False):
            if on and (models_max <= 0 or len(self.children) < models_max):
                rid = self.ask("load", name)
                self.step(self.core.load(rid, name, self.tick()))
                self.start_child(name, self.children[name])
                self.children[name].status = Status.LOADED
                self.step(self.core.child_state(name, self.gen[name], "ready", {}, self.tick()))

    # ----- the world's own bookkeeping ----------------------------------------------------

    def tick(self, dt: float = 1.0) -> float:
        self.clean = False  # set again once the step and the invariants have passed
        self.now += dt
        self.step_no += 1
        return self.now

    def ask(self, kind: str, model: str, autoload: bool = True, post: bool = True) -> int:
        rid = next(self.rids)
        self.waiting[rid] = Ask(kind, model, autoload, post, self.step_no + 1)
        return rid

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

    def upstream_events(
        self, model: str, events: tuple[str, ...] = ("model_status", "status_change")
    ) -> list[Emit]:
        """Upstream's SSE events about ``model`` in the last step (a queued request's
        spawn, set off by the same event, announces itself too: left out here)."""
        spawned = {s.model for s in self.of_type(Spawn)}
        return [
            e
            for e in self.of_type(Emit)
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
                self.on_emit(e)
            else:
                raise AssertionError(f"unknown effect {e!r}")
        if stop_all_answered:
            assert not self.children, f"shutdown answered while {self.children} run"
        self.check_claims(loads_done)
        self.check_troupe_events()
        self.check_stops([e for e in effects if isinstance(e, Stop)])
        self.check_nothing_left_undone()
        return effects

    def check_claims(self, loads_done: list[str]) -> None:
        """A Spawn that no POST /models/load answered came from the queue: only the head
        entry may claim, and it is marked as loading."""
        assert self.core is not None
        entries = self.core._queue.entries
        for e in self.of_type(Spawn):
            if e.model in loads_done:
                loads_done.remove(e.model)
                continue
            if e.model in self.oom_retry:
                self.oom_retry.discard(e.model)
                continue
            assert entries, f"{e} with nobody queued"
            assert entries[0].model == e.model, f"{e} but the head is {entries}"
            assert entries[0].loading, f"{e} from an entry not marked loading: {entries}"

    def check_troupe_events(self) -> None:
        """troupe's own SSE events: ``troupe_evict`` with each stop the scheduler decided
        on, ``troupe_queue`` whenever an entry's waiters or position changed."""
        assert self.core is not None
        evicts = [e for e in self.of_type(Emit) if e.event == "troupe_evict"]
        decided = [
            s for s in self.of_type(Stop) if s.reason.startswith(("lru for ", "ttl", "memory"))
        ]
        assert sorted((e.model, (e.data or {}).get("reason")) for e in evicts) == sorted(
            (s.model, s.reason) for s in decided
        ), (evicts, decided)
        now_seen = {e.model: (e.waiters, i + 1) for i, e in enumerate(self.core._queue.entries)}
        queue_events = {e.model: e.data for e in self.of_type(Emit) if e.event == "troupe_queue"}
        changed = {
            m: now_seen.get(m)
            for m in now_seen.keys() | self.queue_seen.keys()
            if now_seen.get(m) != self.queue_seen.get(m)
        }
        assert set(queue_events) == set(changed), (queue_events, changed)
        for m, state in changed.items():
            waiters, position = state if state is not None else (0, None)
            assert queue_events[m] == {"waiting": waiters, "position": position}
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
        if not delayed:
            self.last_used[e.model] = self.now
        if not delayed:  # upstream's load() says "loading" as it spawns
            said = [x for x in self.of_type(Emit) if x.model == e.model]
            assert Emit(e.model, "model_status", {"status": "loading"}) in said, self.out

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
            self.leases[e.to] = (r.model, r.gen)
            if ask.post:
                self.last_used[r.model] = self.now
        elif isinstance(r, Failure):
            assert FAILURE_KINDS[r.status] == r.type, r
            assert ask.kind != "stop_all", e
        else:
            assert ask.kind in ("load", "unload", "stop_all"), (ask, e)

    def on_emit(self, e: Emit) -> None:
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
        entries = core._queue.entries
        queued = {e.model for e in entries}
        needy = {
            e.model
            for e in entries
            if not e.loading
            and (not core._models[e.model].is_running or core._models[e.model].stopping)
        } | {d.model for d in core._direct.values()}
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
        for_loads = {d.victim for d in core._direct.values()}
        lru = [s for s in issued if s.reason.startswith("lru for ")]
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
            if s.reason.startswith("memory for "):
                busy = [r for r, lease in self.leases.items() if lease == (s.model, s.gen)]
                assert not busy, f"{s} while requests {busy} are in flight"
                assert s.model not in queued, f"{s} while requests are queued for it"
                assert not self.configs[s.model].pin, f"pinned model evicted: {s}"
                continue
            if not (s.reason == "ttl" or s.reason.startswith("lru for ")):
                continue
            busy = [rid for rid, lease in self.leases.items() if lease == (s.model, s.gen)]
            assert not busy, f"{s} while requests {busy} are in flight"
            assert s.model not in queued, f"{s} while requests are queued for it"
            assert not self.wanted(s.model, ("acquire",)), f"{s} while requests wait for it"
            if s.reason == "ttl":
                ttl = self.configs[s.model].ttl
                assert ttl is not None, s
                assert core._models[s.model].idle_since + ttl <= self.now, s
                continue
            assert not self.configs[s.model].pin, f"pinned model evicted: {s}"
            target = s.reason.removeprefix("lru for ")
            assert self.wanted(target), f"{s} but nobody waits for {target}"
            assert target in needy, f"{s} but {target} needs no slot; queue={entries}"
            victim = snap[s.model]
            for other in eligible:
                assert (victim.last_used, victim.name) <= (other.last_used, other.name), (
                    f"{s} evicts {victim.name} (used {victim.last_used}) before "
                    f"{other.name} (used {other.last_used})"
                )

    def check_nothing_left_undone(self) -> None:
        """After any event the core is at rest: nothing it could do now is left for a
        later, unrelated event (no polling, DESIGN principle 3)."""
        assert self.core is not None
        core = self.core
        entries = core._queue.entries
        has_slot = core.models_max <= 0 or core.running_count() < core.models_max
        if entries and not entries[0].loading and has_slot and not core._reloading:
            m = core._models[entries[0].model]
            held = m.held_until is not None and self.now < m.held_until
            retry = m.respawn_after_evictions
            if m.status is Status.UNLOADED and not m.spawn_pending and not held and not retry:
                raise AssertionError(f"the head {entries[0]} could load now but waits")
        need = evictions_needed(core._models, core._queue, core.models_max)
        if need > 0:
            victim = pick_victim(core._models, core._queue)
            assert victim is None, f"{need} slots needed and {victim} is idle: {entries}"
        for rid, d in core._direct.items():
            if core._reloading:
                continue  # upstream's load() waits for the reload to finish, too
            assert d.victim is not None, f"load {rid} parked with no victim and no reload"
            child = self.children.get(d.victim)
            gen = child.gen if child is not None else None
            victim, seen_gen = self.direct_victims.setdefault(rid, (d.victim, gen or -1))
            assert (victim, gen) == (d.victim, seen_gen), (
                f"load {rid} still waits for {d.victim}, whose child {seen_gen} is gone"
            )

    # ----- clients -------------------------------------------------------------------------

    @rule(
        i=st.integers(0, 4),
        autoload=st.sampled_from([True, True, True, False]),
        post=st.booleans(),
    )
    def acquire(self, i: int, autoload: bool, post: bool) -> None:
        assert self.core is not None
        model = self.names[i % len(self.names)]
        child = self.children.get(model)
        waiting_before = sum(1 for a in self.waiting.values() if a.kind == "acquire")
        rid = self.ask("acquire", model, autoload, post)
        now = self.tick()
        held = child is None and self.held(model)
        self.step(self.core.acquire(rid, model, now, autoload=autoload, update_last_used=post))
        r = self.replies_to(rid)
        if self.closing:
            assert [x.result for x in r] == [Failure.unavailable("server is shutting down")]
        elif not autoload:
            if child is None:
                assert [x.result for x in r] == [Failure.bad_request("model is not loaded")]
            elif child.started:
                assert isinstance(self.one_result(r), Grant), r
            elif not child.delayed:  # "loading" but no port yet: the child's own answer
                assert [x.result.status for x in r] == [503], r  # type: ignore[union-attr]
        elif (
            child is not None
            and child.started
            and child.stop is None
            and child.status
            in (
                Status.LOADED,
                Status.SLEEPING,
            )
        ):
            assert isinstance(self.one_result(r), Grant), r
        elif held:
            failure = self.one_result(r)
            assert isinstance(failure, Failure), r
            assert failure.status == 503, r
        elif self.queue_max > 0 and waiting_before >= self.queue_max:
            failure = self.one_result(r)
            assert isinstance(failure, Failure), r
            assert failure.status == 503, r
            assert failure.retry_after, r
        else:
            assert r == [], f"{model} is not ready, yet {rid} was answered at once: {r}"

    # Arrivals are the common event: weigh them up against the admin calls below.
    @rule(i=st.integers(0, 2))
    def acquire_again(self, i: int) -> None:
        self.acquire(i, autoload=True, post=True)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 50))
    def release_lease(self, i: int) -> None:
        assert self.core is not None
        rid = sorted(self.leases)[i % len(self.leases)]
        del self.leases[rid]
        self.step(self.core.release(rid, self.tick()))
        assert self.replies_to(rid) == []

    @precondition(lambda self: any(a.kind in ("acquire", "load") for a in self.waiting.values()))
    @rule(i=st.integers(0, 50))
    def disconnect_waiter(self, i: int) -> None:
        assert self.core is not None
        rids = sorted(r for r, a in self.waiting.items() if a.kind in ("acquire", "load"))
        rid = rids[i % len(rids)]
        del self.waiting[rid]
        self.left.add(rid)
        self.step(self.core.release(rid, self.tick()))

    @rule(i=st.integers(0, 9), op=st.sampled_from(["load", "unload"]))
    def admin(self, i: int, op: str) -> None:
        """POST /models/load or /models/unload (9 is a name the catalogue lacks).

        Mostly of a model where the call does something: load one that is not running,
        unload one that is."""
        assert self.core is not None
        useful = [n for n in self.names if (n in self.children) == (op == "unload")]
        if i == 9:
            model = "no-such-model"
        elif i in (7, 8) or not useful:
            model = self.names[i % len(self.names)]
        else:
            model = useful[i % len(useful)]
        child = self.children.get(model)
        rid = self.ask(op, model)
        if op == "load":
            if model in self.crashes and child is None:
                self.crashes[model].clear()  # an explicit load lifts a crash-loop hold
            self.step(self.core.load(rid, model, self.tick()))
            r = [x.result for x in self.replies_to(rid)]
            if self.closing:
                assert r == [Failure.unavailable("server is shutting down")], r
            elif model not in self.configs:
                assert r == [Failure.not_found("model is not found")]
            elif child is not None:
                assert r == [Failure.bad_request("model is already running")]
            elif self.reloading:  # upstream's load() waits for the reload to finish
                assert r == [], r
            elif r and r[0] is None:
                assert [s.model for s in self.of_type(Spawn)] == [model], self.out
            elif r:
                assert r == [Failure.server_error("model limit reached, try again later")]
            else:
                assert [s.reason for s in self.of_type(Stop)] == [f"lru for {model}"]
            return
        had_stop = child is not None and child.stop is not None
        self.step(self.core.unload(rid, model, self.tick()))
        r = [x.result for x in self.replies_to(rid)]
        stops = self.of_type(Stop)
        if model not in self.configs:
            assert r == [Failure.bad_request("model is not found")]
        elif child is None or not child.status.is_running:
            # nothing runs yet (or, under fake timing, not yet: upstream sleeps first)
            assert r == [Failure.bad_request("model is not running")]
            assert stops == []
        else:
            assert r == [None], r
            if not had_stop:
                assert len(stops) == 1, stops
                assert (stops[0].model, stops[0].reason) == (model, "unload request")
            else:
                assert stops == []

    @rule(dice=st.integers(0, 15))
    def stop_all(self, dice: int) -> None:
        assert self.core is not None
        if dice != 13:
            return  # shutdown is rare: most runs should exercise the live service
        self.closing = True
        victims = {m for m, c in self.children.items() if c.stop is None}
        rid = self.ask("stop_all", "*")
        self.step(self.core.stop_all(rid, self.tick()))
        assert {s.model for s in self.of_type(Stop)} == victims
        assert not any(a.kind in ("acquire", "load") for a in self.waiting.values())

    # ----- instance actors -------------------------------------------------------------

    def pick(self, pred: Any, i: int) -> tuple[str, Child]:
        items = sorted((m, c) for m, c in self.children.items() if pred(c))
        return items[i % len(items)]

    @precondition(lambda self: any(not c.started for c in self.children.values()))
    @rule(i=st.integers(0, 50), ok=st.integers(0, 5))
    def spawn_completes(self, i: int, ok: int) -> None:
        model, child = self.pick(lambda c: not c.started, i)
        if ok:
            self.start_child(model, child)
        else:
            self.child_gone(model, child, 1)  # could not start (no port, exec failed)

    def start_child(self, model: str, child: Child) -> None:
        assert self.core is not None
        port = next(self.ports)
        said_loading = child.status is Status.LOADING
        child.started, child.port = True, port
        now = self.tick()
        if child.status is Status.UNLOADED:
            child.status = Status.LOADING
            self.last_used[model] = now  # a delayed spawn starts loading only now
        self.step(self.core.spawned(model, child.gen, port, port + 1, now))
        upstream = self.upstream_events(model)
        if said_loading:
            assert upstream == [], "loading was announced with the Spawn"
        else:
            assert upstream == [Emit(model, "model_status", {"status": "loading"})]

    def child_gone(self, model: str, child: Child, code: int, *, oom: bool = False) -> None:
        assert self.core is not None
        del self.children[model]
        expected = child.stop is not None
        now = self.tick()
        self.step(self.core.exited(model, child.gen, code, now, expected=expected, oom=oom))
        if any(s.reason == f"memory for {model}" for s in self.of_type(Stop)):
            # out of memory while loading: idle models go and the load is tried once more
            assert oom, self.out
            assert not expected, self.out
            assert child.status is Status.LOADING, self.out
            self.oom_retry.add(model)
        elif not expected:
            self.crashes[model].append(now)
        emitted = self.upstream_events(model, ("status_change",))
        if child.status.is_running:
            assert emitted == [
                Emit(model, "status_change", {"status": "unloaded", "exit_code": code})
            ]
        else:
            assert emitted == []

    @precondition(lambda self: any(c.stop for c in self.children.values()))
    @rule(i=st.integers(0, 50), timed_out=st.booleans())
    def stop_completes(self, i: int, timed_out: bool) -> None:
        model, child = self.pick(lambda c: c.stop is not None, i)
        assert child.stop is not None
        # a kill, or a graceful stop that ran past stop-timeout, is reported as 1
        self.child_gone(model, child, 1 if child.stop.kill or timed_out else 0)

    @precondition(lambda self: any(c.started for c in self.children.values()))
    @rule(
        i=st.integers(0, 50),
        state=st.sampled_from(["ready", "loading", "ready", "sleeping", "crash", "oom", "bogus"]),
        loading=LOADING_PAYLOADS,
        ready=READY_PAYLOADS,
        code=st.integers(0, 3),
    )
    def child_reports(self, i: int, state: str, loading: Any, ready: Any, code: int) -> None:
        """A live child reports a state line, or dies on its own with some exit code."""
        assert self.core is not None
        model, child = self.pick(lambda c: c.started, i)
        if state in ("crash", "oom"):
            self.child_gone(model, child, code if state == "crash" else 1, oom=state == "oom")
            return
        payload = {"loading": loading, "ready": ready}.get(state, {})
        child.status = REPORTED.get(state, child.status)
        self.step(self.core.child_state(model, child.gen, state, payload, self.tick()))
        if state not in REPORTED:
            assert self.out == [], "an unknown state is ignored"
            return
        data: dict[str, Any] = {"status": str(child.status)}
        if state == "loading" and payload is not None:
            data["progress"] = payload
        if state == "ready" and payload:
            data["info"] = payload
        assert self.upstream_events(model) == [Emit(model, "status_change", data)]

    @precondition(lambda self: any(g >= 2 for g in self.gen.values()))
    @rule(
        i=st.integers(0, 50),
        back=st.integers(1, 3),
        event=st.sampled_from(["spawned", "loading", "ready", "sleeping", "exited"]),
    )
    def stale_event(self, i: int, back: int, event: str) -> None:
        """An event from an older child of the model (the actor's race with a respawn)."""
        assert self.core is not None
        models = sorted(m for m, g in self.gen.items() if g >= 2)
        model = models[i % len(models)]
        old = max(1, self.gen[model] - back)
        now = self.tick()
        if event == "spawned":
            out = self.core.spawned(model, old, 1, 1, now)
        elif event == "exited":
            out = self.core.exited(model, old, 1, now, expected=False)
        else:
            out = self.core.child_state(model, old, event, {}, now)
        assert out == [], f"stale {event} of {model} gen {old} had effects {out}"

    # ----- catalogue reload (§6.9) ---------------------------------------------------------

    @precondition(lambda self: self.core is not None and not self.reloading)
    @rule(restart=st.lists(st.integers(0, 4), max_size=2))
    def reload_begins(self, restart: list[int]) -> None:
        """A reload starts; the models whose preset changed are stopped."""
        assert self.core is not None
        names = sorted({self.names[i % len(self.names)] for i in restart})
        to_stop = {n for n in names if n in self.children and self.children[n].stop is None}
        self.reloading = True
        self.step(self.core.begin_reload(names, self.tick()))
        assert {(s.model, s.reason) for s in self.of_type(Stop)} == {
            (n, "preset changed") for n in to_stop
        }

    @precondition(lambda self: self.reloading)
    @rule()
    def reload_finishes(self) -> None:
        """The same catalogue comes back; loads held during the reload go on."""
        assert self.core is not None
        for name in self.names:
            if name not in self.children:
                self.crashes[name].clear()  # a reload clears "failed" and crash counts
        self.reloading = False
        self.step(self.core.finish_reload(list(self.configs.values()), self.tick()))
        assert Emit("*", "models_reload") in self.out

    # ----- the clock -----------------------------------------------------------------------

    @rule(dt=st.sampled_from([1.0, 4.0, 10.0, 31.0, 70.0]))
    def time_passes(self, dt: float) -> None:
        assert self.core is not None
        self.step(self.core.on_time(self.tick(dt)))
        self.check_no_expired_ttl()

    @precondition(lambda self: self.core is not None and self.core.next_deadline() is not None)
    @rule()
    def ttl_deadline(self) -> None:
        assert self.core is not None
        deadline = self.core.next_deadline()
        assert deadline is not None
        self.tick(0.0)
        self.now = max(self.now, deadline)
        self.step(self.core.on_time(self.now))
        self.check_no_expired_ttl()

    def check_no_expired_ttl(self) -> None:
        assert self.core is not None
        deadline = self.core.next_deadline()
        assert deadline is None or deadline > self.now, (deadline, self.now)
        for s in self.of_type(Stop):
            assert s.reason == "ttl", s
            assert self.configs[s.model].ttl is not None, s

    # ----- invariants ----------------------------------------------------------------------

    @invariant()
    def running_within_limit(self) -> None:
        if self.core is None:
            return
        core_running = {n for n, m in self.core._models.items() if m.is_running}
        assert core_running == set(self.children), (core_running, self.children)
        assert self.core.running_count() == len(self.children)
        if self.models_max > 0:
            assert len(self.children) <= self.models_max, self.children

    @invariant()
    def queue_is_fifo(self) -> None:
        if self.core is None:
            return
        entries = list(self.core._queue.entries)
        ids = [id(e) for e in entries]
        survivors = [id(e) for e in self.prev_entries if id(e) in ids]
        assert ids[: len(survivors)] == survivors, "queue entries changed order"
        assert len({e.model for e in entries}) == len(entries), "two entries for one model"
        for e in entries[1:]:
            assert not e.loading, f"an entry behind the head claimed: {entries}"
        for e in entries:
            assert e.waiters > 0, entries
        self.prev_entries = entries  # keeps them alive, so ids stay unique

    @invariant()
    def waiters_match_requests(self) -> None:
        if self.core is None:
            return
        core = self.core
        acquiring = {r for r, a in self.waiting.items() if a.kind == "acquire"}
        loading = {r for r, a in self.waiting.items() if a.kind == "load"}
        assert set(core._waiters) == acquiring, (core._waiters, acquiring)
        assert set(core._direct) == loading, (core._direct, loading)
        assert set(core._leases) == set(self.leases)
        for rid, w in core._waiters.items():
            assert w.model == self.waiting[rid].model
        for e in core._queue.entries:
            queued = [r for r, w in core._waiters.items() if w.queued and w.model == e.model]
            assert e.waiters == len(queued), (e, queued)
        for rid, w in core._waiters.items():
            if w.queued:
                assert core._queue.find(w.model) is not None, (rid, w)

    @invariant()
    def in_flight_counts_live_leases(self) -> None:
        if self.core is None:
            return
        for name, m in self.core._models.items():
            if m.status.is_running:
                live = sum(1 for lease in self.leases.values() if lease == (name, m.gen))
                assert m.in_flight == live, (name, m.in_flight, live)
            else:
                assert m.in_flight == 0, (name, m)

    @invariant()
    def snapshot_is_consistent(self) -> None:
        if self.core is None:
            return
        snap = self.core.snapshot()
        entries = self.core._queue.entries
        assert snap.queue == tuple((e.model, e.waiters) for e in entries)
        assert snap.models_max == self.models_max
        assert snap.running == sum(1 for c in self.children.values() if c.status.is_running)
        assert list(snap.models) == sorted(self.names)
        for name, v in snap.models.items():
            m = self.core._models[name]
            child = self.children.get(name)
            if child is not None:
                assert v.status is child.status, (name, v.status, child)
                if child.started:
                    assert v.port == child.port
            else:
                assert v.status is Status.UNLOADED, (name, v.status, child)
            assert v.stopping == (child is not None and child.stop is not None), (name, v, child)
            assert v.in_flight == m.in_flight
            assert v.last_used == self.last_used.get(name, 0.0), (name, v.last_used)
            assert v.failed == (v.status is Status.UNLOADED and v.exit_code != 0)
            pos = next((i + 1 for i, e in enumerate(entries) if e.model == name), None)
            assert v.queue_position == pos
            assert v.waiting == (entries[pos - 1].waiters if pos else 0)
            assert (v.pin, v.ttl) == (self.configs[name].pin, self.configs[name].ttl)

    # ----- teardown: children behave, everything completes, everyone is answered -------------

    def settle_world(self) -> None:
        assert self.core is not None
        for _ in range(500):
            moved = False
            for model, child in sorted(self.children.items()):
                if self.children.get(model) is not child:
                    continue
                if child.stop is not None:
                    self.child_gone(model, child, 1 if child.stop.kill else 0)
                elif not child.started:
                    self.start_child(model, child)
                elif child.status is Status.LOADING:
                    child.status = Status.LOADED
                    self.step(self.core.child_state(model, child.gen, "ready", {}, self.tick()))
                else:
                    continue
                moved = True
            for rid in sorted(self.leases):
                moved = True
                del self.leases[rid]
                self.step(self.core.release(rid, self.tick()))
            self.running_within_limit()
            self.queue_is_fifo()
            self.waiters_match_requests()
            if not moved:
                return
        raise AssertionError("the world never settled")

    def teardown(self) -> None:
        if self.core is None or not self.clean:
            return  # a step already failed: let its error be the one reported
        if self.reloading:
            self.reload_finishes()
        self.settle_world()
        stuck = {r: a for r, a in self.waiting.items() if a.kind in ("acquire", "load")}
        if stuck:
            # The only legitimate reason to wait now: every slot is held by a pinned model.
            running = sorted(self.children)
            full = self.models_max > 0 and len(running) >= self.models_max
            assert full, (
                f"requests {stuck} still wait with free slots; running={running}, "
                f"queue={self.core._queue.entries}"
            )
            assert all(self.configs[m].pin for m in running), (
                f"requests {stuck} still wait though {running} could be evicted"
            )
            assert all(a.kind == "acquire" for a in stuck.values()), stuck
        self.closing = True
        rid = self.ask("stop_all", "*")
        self.step(self.core.stop_all(rid, self.tick()))
        self.settle_world()
        assert not self.children
        assert self.waiting == {}, f"never answered: {self.waiting}"


SchedulerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerCoreStateful = SchedulerMachine.TestCase
