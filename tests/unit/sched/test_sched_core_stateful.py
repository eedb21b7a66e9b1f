"""Hypothesis drives `SchedulerCore` the way the scheduler actor would.

The machine plays every other party: clients (arrivals, lease releases, disconnects
while waiting, POST /models/load and /unload, shutdown), the instance actors (a `Spawn`
becomes a pending start that later reports `spawned` or fails; a `Stop` becomes a
pending stop that later reports `exited`; a live child reports states or crashes) and
the clock. Pending operations complete in any order, and stale events from older
children are thrown in.

After every step the machine checks the effects against its own model of the world
(schedcore_world.World: who waits, which child is up, which leases are out, how often
a model crashed) and
the core's state against a few invariants: the --models-max limit, FIFO admission,
evictions only of idle unwanted models for someone who still waits, one reply per
request, in-flight counts, snapshot consistency, and that no event leaves work undone
(a claim or eviction that could happen now). At teardown the children behave,
everything pending completes, and every request still waiting must be answered.

Time is kept in whole seconds so that window and TTL boundaries compare exactly.
"""

from __future__ import annotations

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
from schedcore_kit import Sse
from schedcore_world import CRASH_LIMIT, CRASH_WINDOW, REPORTED, World

from troupe.sched import (
    Failure,
    Grant,
    ModelConfig,
    Phase,
    Restart,
    RestartKey,
    SchedulerCore,
    Spawn,
    Status,
    Stop,
)
from troupe.sched.cpu import CpuCore, CpuLedger, CpuTopology
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.terms import TenantTerms
from troupe.sched.views import status_of

NAMES = ("m0", "m1", "m2", "m3", "m4")
# ``troupe.phase`` in GET /models: the words it showed when each was a phase of its own.
SHOWN_PHASES = frozenset(
    {
        "unloaded",
        "failed",
        "held",
        "retrying",
        "replanning",
        "delayed",
        "starting",
        "loading",
        "loaded",
        "sleeping",
        "draining",
        "aborting",
        "stopping",
    }
)
LOADING_PAYLOADS = st.sampled_from(
    [None, {}, {"stages": ["text_model"], "current": "text_model", "value": 0.5}]
)
READY_PAYLOADS = st.sampled_from([None, {}, {"id": "x", "object": "model"}])


class SchedulerMachine(World, RuleBasedStateMachine):
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
        drain_after=st.sampled_from([None, None, 3.0]),
        cores=st.sampled_from([None, None, 2, 3]),
        slots=st.sampled_from([1, 2, 4]),
        priorities=st.lists(st.sampled_from([0, 0, 1]), min_size=3, max_size=3),
        reserved=st.sampled_from([0, 1]),
        max_parallel=st.lists(st.sampled_from([None, None, 1, 2]), min_size=3, max_size=3),
        weights=st.lists(st.sampled_from([1.0, 2.0]), min_size=3, max_size=3),
        max_bypass=st.sampled_from([1, 2, 32]),
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
        drain_after: float | None,
        cores: int | None,
        slots: int,
        priorities: list[int],
        reserved: int,
        max_parallel: list[int | None],
        weights: list[float],
        max_bypass: int,
    ) -> None:
        # A pinned model never also has a TTL here: which of the two wins is a policy
        # question, not one of the invariants checked.
        configs = [
            ModelConfig(name, pin=pins[i], ttl=None if pins[i] else ttls[i])
            for i, name in enumerate(NAMES[:n])
        ]
        self.configs = {c.name: c for c in configs}
        self.table_keys = {c.name: c.restart_key for c in configs}  # the running children's
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
            drain_after=drain_after,
            cpu=CpuLedger(CpuTopology(tuple(CpuCore((i,)) for i in range(cores))))
            if cores
            else None,
        )
        # Three tenants (fair queuing): priority 1 is a class that keeps ``reserved``
        # slots per model for itself; tenant 0 is sometimes the keyless "" tenant.
        self.slots = slots
        self.max_bypass = self.core.fair.max_bypass = max_bypass
        self.tenants = [
            TenantTerms(
                f"t{i}" if i or weights[0] == 1.0 else "",
                weight=weights[i],
                priority=priorities[i],
                reserved_slots=reserved if priorities[i] else 0,
                max_parallel=max_parallel[i],
                held_back=reserved if not priorities[i] and 1 in priorities else 0,
            )
            for i in range(3)
        ]
        self.gen = dict.fromkeys(self.names, 0)
        self.crashes = {name: [] for name in self.names}
        # Start some models up front, so that full and busy tables are common.
        for name, on in zip(self.names, warm, strict=False):
            if on and (models_max <= 0 or len(self.children) < models_max):
                rid = self.ask("load", name)
                now = self.tick()
                if fake_timing:  # upstream's load() sleeps 2 s first
                    self.load_due[rid] = (name, now + 2.0)
                self.step(self.core.load(rid, name, now))
                if fake_timing:
                    self.step(self.core.on_time(self.tick(2.0)))
                if name not in self.children:  # it waits for a CPU lane: let it settle
                    self.settle_world()
                    continue
                self.start_child(name, self.children[name])
                self.children[name].status = Status.LOADED
                self.step(self.core.child_state(name, self.gen[name], "ready", {}, self.tick()))

    # ----- clients -------------------------------------------------------------------------

    @rule(
        i=st.integers(0, 4),
        autoload=st.sampled_from([True, True, True, False]),
        post=st.booleans(),
        tenant=st.integers(0, 2),
        slot=st.sampled_from([True, True, False]),
    )
    def acquire(self, i: int, autoload: bool, post: bool, tenant: int, slot: bool) -> None:
        assert self.core is not None
        model = self.names[i % len(self.names)]
        child = self.children.get(model)
        waiting_before = sum(1 for a in self.waiting.values() if a.kind == "acquire")
        terms = self.tenants[tenant]
        # Fair queuing: a slot-using request for a child that serves waits while no slot
        # is free to it (the world's own count).
        no_slot = slot and self.serves(model) and not self.slot_free(model, tenant)
        rid = self.ask("acquire", model, autoload, post, tenant, slot)
        now = self.tick()
        held = child is None and self.held(model)
        # the actor's inline fast path
        at_once = self.core.grants_at_once(model, autoload, terms=terms, slot=slot)
        view = self.core.snapshot().models.get(model)
        drained = view is not None and view.draining_for is not None  # no new lease
        self.step(
            self.core.acquire(
                rid, model, now, autoload=autoload, update_last_used=post, terms=terms, slot=slot
            )
        )
        r = self.replies_to(rid)
        if at_once:
            assert isinstance(self.one_result(r), Grant), r
        if self.closing:
            assert [x.result for x in r] == [Failure.unavailable("server is shutting down")]
        elif not autoload:
            if child is None:
                assert [x.result for x in r] == [Failure.bad_request("model is not loaded")]
            elif no_slot:
                assert r == [], r  # it waits for a slot of the child
            elif child.started:
                assert isinstance(self.one_result(r), Grant), r
            elif not child.delayed:  # "loading" but no port yet: the child's own answer
                assert [x.result.status for x in r] == [503], r  # type: ignore[union-attr]
        elif drained and autoload and not (self.queue_max > 0 and waiting_before >= self.queue_max):
            assert r == [], r  # it queues for the next instance, behind the starving model
        elif no_slot:
            assert r == [], r  # every slot it may take is taken: it waits its turn
        elif (
            not drained
            and child is not None
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
    @rule(i=st.integers(0, 2), tenant=st.integers(0, 2))
    def acquire_again(self, i: int, tenant: int) -> None:
        self.acquire(i, autoload=True, post=True, tenant=tenant, slot=True)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 50), tokens=st.sampled_from([None, 0, 40, 400]))
    def release_lease(self, i: int, tokens: int | None) -> None:
        """A lease ends; its answer used ``tokens`` (None: unknown)."""
        assert self.core is not None
        rid = sorted(self.leases)[i % len(self.leases)]
        del self.leases[rid]
        self.slot_leases.pop(rid, None)
        self.step(self.core.release(rid, self.tick(), tokens))
        assert self.replies_to(rid) == []

    @precondition(lambda self: self.children)
    @rule(i=st.integers(0, 50), seconds=st.sampled_from([0.0, 5.0, 60.0]))
    def keep_alive(self, i: int, seconds: float) -> None:
        """A request's keep_alive (Ollama's API): the running child's TTL from now on."""
        assert self.core is not None
        name = sorted(self.children)[i % len(self.children)]
        child = self.children[name]
        self.step(self.core.keep_alive(name, child.gen, seconds, self.tick(0.0)))
        if child.stop is None:  # a stopping child keeps what it had
            self.kept[name] = (child.gen, seconds)

    @rule(i=st.integers(0, 50))
    def keep_alive_zero(self, i: int) -> None:
        """Ollama's keep_alive 0 with nothing to generate: the running child goes once
        idle, and the asker is answered when it is gone (at once if nothing goes)."""
        assert self.core is not None
        name = self.names[i % len(self.names)]
        child = self.children.get(name)
        rid = self.ask("keep_alive", name)
        now = self.tick(0.0)
        self.step(self.core.keep_alive(name, None, 0.0, now, rid=rid, until_gone=True))
        answered = bool(self.replies_to(rid))
        if child is None or self.configs[name].pin:
            assert answered, f"keep_alive 0 of {name} ({child}) not answered at once"
        elif child.stop is None:
            assert not answered, f"keep_alive 0 answered while {child} runs"
            self.kept[name] = (child.gen, 0.0)
        if not answered:
            self.gone_waits[rid] = (name, child.gen if child is not None else -1)

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
        """POST /models/load or /models/unload (9 is a name the catalog lacks).

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
            now = self.tick()
            if self.fake_timing:  # upstream's load() first sleeps 2 s
                self.load_due[rid] = (model, now + 2.0)
            self.step(self.core.load(rid, model, now))
            r = [x.result for x in self.replies_to(rid)]
            if self.closing:
                assert r == [Failure.unavailable("server is shutting down")], r
            elif model not in self.configs:
                assert r == [Failure.not_found("model is not found")]
            elif child is not None:
                assert r == [Failure.bad_request("model is already running")]
            elif self.reloading:  # upstream's load() waits for the reload to finish
                assert r == [], r
            elif self.fake_timing:  # upstream's load() first sleeps 2 s: nothing yet
                assert r == [], r  # (an earlier load awake by now may act: check_claims)
            elif r and r[0] is None:
                spawned = [s.model for s in self.of_type(Spawn)]
                if self.core.cpu is None:
                    assert spawned == [model], self.out
                else:
                    # With placement, a parked load or a re-planned model that now has
                    # its lane may start in the same step (check_claims checks those).
                    assert model in spawned, self.out
            elif r:
                assert r == [Failure.server_error("model limit reached, try again later")]
            else:
                # It waits for the LRU victim to be gone (upstream), or (CPU placement)
                # for a wider child to be narrowed, or for one being narrowed already.
                causes = [s.cause for s in self.of_type(Stop)]
                replan = StopCause(StopReason.REPLAN, model)
                assert causes in ([StopCause(StopReason.LRU, model)], [replan], []), causes
                if not causes:
                    assert self.replan_under_way(), self.out
            return
        had_stop = child is not None and child.stop is not None
        # POST /models/load calls parked with no victim yet (CPU placement: they wait
        # while a model started again on a narrower lane comes back).
        parked = {d.model for d in self.core.requests.direct.values() if d.victim is None}
        self.step(self.core.unload(rid, model, self.tick()))
        r = [x.result for x in self.replies_to(rid)]
        stops = self.of_type(Stop)
        if self.core.cpu is not None:
            # Its stop frees cores: a wider child may be narrowed in the same step (a
            # re-plan, which check_stops checks); and a parked load whose wait the unload
            # ended (it stopped the model being started again) picks its LRU victim now,
            # counting the stopping one as upstream does (check_stops checks that victim).
            # The unload's own stops are the others.
            stops = [
                s
                for s in stops
                if s.cause.reason is not StopReason.REPLAN
                and not (s.cause.reason is StopReason.LRU and s.cause.for_model in parked)
            ]
        # A POST /models/load that has slept out fake timing meanwhile may evict for itself.
        awake = self.loads_awake()
        stops = [
            s
            for s in stops
            if not (s.cause.reason is StopReason.LRU and s.cause.for_model in awake)
        ]
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
                assert (stops[0].model, stops[0].cause) == (model, StopCause(StopReason.UNLOAD))
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

    @precondition(lambda self: any(not c.started for c in self.children.values()))
    @rule(i=st.integers(0, 50), ok=st.integers(0, 5))
    def spawn_completes(self, i: int, ok: int) -> None:
        model, child = self.pick(lambda c: not c.started, i)
        if ok:
            self.start_child(model, child)
        else:
            self.child_gone(model, child, 1)  # could not start (no port, exec failed)

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
        assert self.upstream_events(model) == [Sse(model, "status_change", data)]

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

    # ----- catalog reload ---------------------------------------------------------------

    @precondition(lambda self: self.core is not None)
    @rule(restart=st.lists(st.integers(0, 4), max_size=2), always=st.booleans())
    def reload(self, restart: list[int], always: bool) -> None:
        """A reload: the running models whose preset changed (their restart key; or one
        that restarts at every reload) are stopped; once they are gone the catalog comes
        back and loads held meanwhile go on. A reload asked for while one is under way is
        folded into it (compared with the table's catalog: the one before both)."""
        assert self.core is not None
        edited = {self.names[i % len(self.names)] for i in restart}
        self.key_version += 1
        for name in edited:  # always: a reserved option written into its section
            key = RestartKey(f"v{self.key_version}", always=always)
            self.configs[name] = attrs.evolve(self.configs[name], restart_key=key)
        names = {
            n
            for n in self.names
            if self.configs[n].restart_key.always
            or self.configs[n].restart_key.digest != self.table_keys[n].digest
        }
        to_stop = {n for n in names if n in self.children and self.children[n].stop is None}
        rid = self.ask("reload", "*")
        self.reloading = True
        self.restart |= names
        self.step(self.core.reload(rid, list(self.configs.values()), self.tick()))
        # (an eviction that time made possible may come with it: check_stops checks those)
        assert {
            s.model for s in self.of_type(Stop) if s.cause == StopCause(StopReason.RELOAD)
        } == set(to_stop)
        if not any(n in self.children for n in self.restart):
            assert not self.reloading, "nothing to wait for, yet the reload is not done"

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

    # ----- invariants ----------------------------------------------------------------------

    @invariant()
    def running_within_limit(self) -> None:
        if self.core is None:
            return
        core_running = {n for n, m in self.core.table.models.items() if m.is_running}
        assert core_running == set(self.children), (core_running, self.children)
        assert self.core.running_count() == len(self.children)
        if self.models_max > 0:
            assert len(self.children) <= self.models_max, self.children

    @invariant()
    def slots_and_max_parallel_hold(self) -> None:
        """Never more slot-using leases on a child than its slots, nor of a tenant than its
        max_parallel (the core's own leases, against the world's figures)."""
        if self.core is None:
            return
        on: dict[tuple[str, int], int] = {}
        of: dict[str, int] = {}
        for lease in self.core.requests.leases.values():
            if lease.slot:
                on[(lease.model, lease.gen)] = on.get((lease.model, lease.gen), 0) + 1
                of[lease.tenant] = of.get(lease.tenant, 0) + 1
        for child, n in on.items():
            assert n <= self.slots, (child, n, self.slots)
        for terms in self.tenants:
            if terms.max_parallel is not None:
                assert of.get(terms.tenant, 0) <= terms.max_parallel, (terms, of)
        assert sum(on.values()) == len(self.slot_leases), (on, self.slot_leases)

    @invariant()
    def queue_is_fifo(self) -> None:
        if self.core is None:
            return
        entries = list(self.core.queue.entries)
        ids = [id(e) for e in entries]
        survivors = [id(e) for e in self.prev_entries if id(e) in ids]
        assert ids[: len(survivors)] == survivors, "queue entries changed order"
        assert len({e.model for e in entries}) == len(entries), "two entries for one model"
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
        assert set(core.requests.waiters) == acquiring, (core.requests.waiters, acquiring)
        assert set(core.requests.direct) == loading, (core.requests.direct, loading)
        assert set(core.requests.leases) == set(self.leases)
        for rid, w in core.requests.waiters.items():
            assert w.model == self.waiting[rid].model
        for e in core.queue.entries:
            queued = [
                r for r, w in core.requests.waiters.items() if w.queued and w.model == e.model
            ]
            assert e.waiters == len(queued), (e, queued)
        for rid, w in core.requests.waiters.items():
            if w.queued:
                assert core.queue.find(w.model) is not None, (rid, w)

    @invariant()
    def in_flight_counts_live_leases(self) -> None:
        if self.core is None:
            return
        for name, m in self.core.table.models.items():
            if status_of(m).is_running:
                live = sum(1 for lease in self.leases.values() if lease == (name, m.gen))
                assert m.in_flight == live, (name, m.in_flight, live)
            else:
                assert m.in_flight == 0, (name, m)

    @invariant()
    def snapshot_is_consistent(self) -> None:
        if self.core is None:
            return
        snap = self.core.snapshot()
        entries = self.core.queue.entries
        assert snap.queue == tuple((e.model, e.waiters) for e in entries)
        assert snap.models_max == self.models_max
        assert snap.running == sum(1 for c in self.children.values() if c.status.is_running)
        assert list(snap.models) == sorted(self.names)
        for name, v in snap.models.items():
            m = self.core.table.models[name]
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
            assert (v.pin, v.ttl) == (self.configs[name].pin, self.ttl_of(name))
            # The lifecycle phase and the data beside it agree with the world: a child
            # exactly while running, not started exactly while a spawn is pending (a spawn
            # or a stop before its process started), a drain only of a model that still
            # serves, a restart pending only without a child.
            assert v.phase.is_running == (child is not None), (name, v.phase, child)
            if child is not None:
                assert m.spawn_pending == (not child.started), (name, v.phase, child)
            assert not m.spawn_pending or m.phase in (Phase.STARTING, Phase.STOPPING), (name, m)
            assert m.delay_until is None or m.spawn_pending, (name, m)
            draining = v.draining_for is not None and not v.stopping
            assert (v.phase is Phase.DRAINING) == draining, (name, v.phase, v.draining_for)
            if v.phase is Phase.HELD:
                assert v.held_until is not None, (name, v)
            if m.restart is not None:
                assert v.phase is Phase.UNLOADED, (name, v.phase, m.restart)
            if m.restart is Restart.OOM:
                assert name in self.oom_retry, (name, self.oom_retry)
            # /models' lifecycle word is one of the thirteen it has always shown.
            assert v.shown_phase in SHOWN_PHASES, (name, v.shown_phase)
            if v.shown_phase == "failed":
                assert v.exit_code != 0, (name, v)

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
                self.slot_leases.pop(rid, None)
                self.step(self.core.release(rid, self.tick()))
            self.running_within_limit()
            self.queue_is_fifo()
            self.waiters_match_requests()
            if not moved:
                # Nothing moves by itself; a deadline (a residency ending, a drain) may.
                deadline = self.core.next_deadline()
                waiting = any(a.kind in ("acquire", "load") for a in self.waiting.values())
                if deadline is None or not waiting:
                    return
                self.now = max(self.now, deadline)
                self.step(self.core.on_time(self.now))
        raise AssertionError("the world never settled")

    def teardown(self) -> None:
        if self.core is None or not self.clean:
            return  # a step already failed: let its error be the one reported
        self.settle_world()
        assert not self.reloading, "the reload never finished"
        for rid, (name, gen) in self.gone_waits.items():  # kept by a later keep_alive
            child = self.children.get(name)
            assert child is not None, (rid, name, gen)
            assert child.gen == gen, (rid, name, gen, child)
        stuck = {r: a for r, a in self.waiting.items() if a.kind in ("acquire", "load")}
        if stuck:
            # The only legitimate reason to wait now: every slot is held by a pinned model.
            running = sorted(self.children)
            full = self.models_max > 0 and len(running) >= self.models_max
            assert full, (
                f"requests {stuck} still wait with free slots; running={running}, "
                f"queue={self.core.queue.entries}"
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
    report_multiple_bugs=False,  # shrink one failure only: keeps a failing run short
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedulerCoreStateful = SchedulerMachine.TestCase
