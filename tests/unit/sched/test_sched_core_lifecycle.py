"""TTL expiry, crash-loop hold and shutdown in the core."""

from __future__ import annotations

from schedcore_kit import Bench, Sse, answered, emits, failure_of, grant_of, reply_to, spawns, stops

from troupe.sched import Failure, ModelConfig, Reply, Spawn, Status, Stop
from troupe.sched.reasons import StopCause, StopReason

# ----- TTL -----------------------------------------------------------------------------


def test_no_deadline_without_a_ttl() -> None:
    b = Bench()
    b.bring_up("a")
    assert b.core.next_deadline() is None
    assert b.on_time(1e9) == []


def test_next_deadline_is_ttl_after_the_model_became_idle() -> None:
    b = Bench([ModelConfig("a", ttl=30.0)])
    b.bring_up("a")  # ready at b.now, idle from then on
    ready_at = b.now
    assert b.core.next_deadline() == ready_at + 30.0


def test_on_time_stops_an_idle_model_after_its_ttl() -> None:
    b = Bench([ModelConfig("a", ttl=30.0), "b"])
    b.bring_up("a")
    b.bring_up("b")
    deadline = b.core.next_deadline()
    assert deadline is not None
    assert b.on_time(deadline - 0.001) == []
    out = b.on_time(deadline)
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.TTL), save_slots=True)
    ]
    assert b.view("a").last_eviction == "ttl"
    assert b.core.next_deadline() is None
    assert b.on_time(deadline + 100) == []  # once only


def test_ttl_counts_from_the_last_release() -> None:
    b = Bench([ModelConfig("a", ttl=30.0)])
    b.bring_up("a")
    lease = b.lease("a")
    assert b.core.next_deadline() is None  # busy: no deadline
    assert b.on_time(b.now + 1000) == []
    b.release(lease)
    released_at = b.now
    assert b.core.next_deadline() == released_at + 30.0
    assert b.on_time(released_at + 29) == []
    assert [s.cause for s in stops(b.on_time(released_at + 30))] == [StopCause(StopReason.TTL)]


def test_ttl_never_stops_a_model_with_a_request_in_flight() -> None:
    b = Bench([ModelConfig("a", ttl=5.0)])
    b.bring_up("a")
    b.lease("a")
    assert b.on_time(b.now + 10_000) == []
    assert not b.view("a").stopping


def test_ttl_never_stops_a_model_that_waiters_are_loading() -> None:
    b = Bench([ModelConfig("a", ttl=5.0)])
    b.bring_up("a")
    b.exited("a", 0)  # idle_since from the first instance is long gone
    w = b.rid()
    b.acquire(w, "a")
    b.spawned("a")
    assert b.core.next_deadline() is None
    assert b.on_time(b.now + 10_000) == []
    out = b.ready("a")
    assert grant_of(out, w).model == "a"
    assert b.on_time(b.now + 10_000) == []  # the waiter now holds a lease


def test_sleeping_model_also_expires() -> None:
    b = Bench([ModelConfig("a", ttl=5.0)])
    b.bring_up("a")
    b.state("a", "sleeping", {})
    assert [s.cause for s in stops(b.on_time(b.now + 6))] == [StopCause(StopReason.TTL)]


# ----- crash loop ----------------------------------------------------------------------


def _crash(b: Bench, model: str) -> None:
    w = b.rid()
    out = b.acquire(w, model)
    assert spawns(out), out
    b.spawned(model)
    out = b.exited(model, 1, expected=False, detail="boom")
    assert failure_of(out, w).status == 500


def test_three_unexpected_exits_within_the_window_hold_the_model_back() -> None:
    b = Bench(crash_limit=3, crash_window=60.0)
    for _ in range(3):
        _crash(b, "a")
    held = b.view("a").held_until
    assert held is not None
    rid = b.rid()
    out = b.acquire(rid, "a")
    assert spawns(out) == []
    f = failure_of(out, rid)
    assert f.status == 503
    assert f.type == "unavailable_error"
    assert "last error: boom" in f.message


def test_crash_hold_lifts_when_the_window_has_passed() -> None:
    b = Bench(crash_limit=3, crash_window=60.0)
    for _ in range(3):
        _crash(b, "a")
    held = b.view("a").held_until
    assert held is not None
    b.now = held - 2
    rid = b.rid()  # acquire ticks the clock one second: still held
    assert failure_of(b.acquire(rid, "a"), rid).status == 503
    b.now = held
    out = b.acquire(b.rid(), "a")
    assert spawns(out) == [Spawn("a", 4, 0.0)]


def test_explicit_load_lifts_the_crash_hold() -> None:
    b = Bench(crash_limit=3, crash_window=60.0)
    for _ in range(3):
        _crash(b, "a")
    rid = b.rid()
    out = b.load(rid, "a")
    assert reply_to(out, rid) is None
    assert [s.model for s in spawns(out)] == ["a"]
    assert b.view("a").held_until is None


def test_expected_exits_do_not_count_as_crashes() -> None:
    b = Bench(crash_limit=3, crash_window=60.0)
    for _ in range(5):
        b.bring_up("a")
        b.exited("a", 1, expected=True)  # killed by us
    assert b.view("a").held_until is None
    assert spawns(b.acquire(b.rid(), "a"))


def test_crashes_spread_over_more_than_the_window_do_not_hold() -> None:
    b = Bench(crash_limit=3, crash_window=60.0)
    for _ in range(6):
        _crash(b, "a")
        b.now += 40.0
    assert b.view("a").held_until is None


def test_queued_waiter_gets_503_when_its_model_becomes_held_back() -> None:
    b = Bench(models_max=0, crash_limit=1, crash_window=60.0)
    b.bring_up("c")
    b.unload(b.rid(), "c")
    b.acquire(b.rid(), "c")  # c is stopping: its request waits in line for the next c
    w = b.rid()
    assert spawns(b.acquire(w, "a")) == []  # a waits behind c
    assert [s.model for s in spawns(b.load(b.rid(), "a"))] == ["a"]
    out = b.exited("a", 1, expected=False, detail="cannot exec")  # the spawn failed
    f = failure_of(out, w)
    assert (f.status, f.type) == (503, "unavailable_error")
    assert b.core.snapshot().queue == (("c", 1),)


# ----- shutdown ------------------------------------------------------------------------


def test_stop_all_with_nothing_running_replies_at_once() -> None:
    b = Bench()
    rid = b.rid()
    assert b.stop_all(rid) == [Reply(rid, None)]


def test_stop_all_fails_waiters_stops_everything_and_replies_once_none_runs() -> None:
    b = Bench(models_max=2)
    b.bring_up("a")
    lease_a = b.lease("a")
    b.bring_up("b")
    b.state("b", "sleeping", {})
    w_c = b.rid()
    b.acquire(w_c, "c")  # queued; evicts b
    w_d = b.rid()
    b.load(b.rid(), "c")
    b.acquire(w_d, "a", autoload=False)  # granted: a is running
    done = b.rid()
    out = b.stop_all(done)
    f = failure_of(out, w_c)
    assert (f.status, f.type) == (503, "unavailable_error")
    assert done not in answered(out)
    by_model = {s.model: s for s in stops(out)}
    assert set(by_model) == {"a"}  # b was already stopping for c
    assert by_model["a"] == Stop(
        "a", 1, kill=False, cause=StopCause(StopReason.SHUTDOWN), save_slots=True
    )
    assert b.core.snapshot().queue == ()
    assert done not in answered(b.finish_stop(by_model["a"]))
    assert done not in answered(b.release(lease_a))
    out = b.exited("b", 0)
    assert reply_to(out, done) is None
    assert spawns(out) == []


def test_stop_all_kills_models_still_loading_and_pending_spawns() -> None:
    b = Bench()
    b.load(b.rid(), "a")
    b.spawned("a")
    w = b.rid()
    b.acquire(w, "b")  # spawn of b pending
    done = b.rid()
    out = b.stop_all(done)
    assert failure_of(out, w).status == 503
    assert sorted(stops(out), key=lambda s: s.model) == [
        Stop("a", 1, kill=True, cause=StopCause(StopReason.SHUTDOWN), save_slots=False),
        Stop("b", 1, kill=True, cause=StopCause(StopReason.SHUTDOWN), save_slots=False),
    ]
    b.exited("a", 1)
    out = b.exited("b", 1)  # the pending spawn is cancelled
    assert reply_to(out, done) is None


def test_acquire_during_shutdown_is_503() -> None:
    b = Bench()
    b.bring_up("a")
    b.stop_all(b.rid())
    rid = b.rid()
    f = failure_of(b.acquire(rid, "a"), rid)
    assert (f.status, f.message) == (503, "server is shutting down")


def test_stop_all_status_is_unloaded_for_everything_at_the_end() -> None:
    b = Bench()
    b.bring_up("a")
    b.bring_up("b")
    out = b.stop_all(b.rid())
    for s in stops(out):
        b.finish_stop(s)
    assert all(v.status is Status.UNLOADED for v in b.core.snapshot().models.values())
    assert b.core.running_count() == 0


# ----- LLAMA_SERVER_DEBUG_FAKE_TIMING ----------------------------------------------------


def test_fake_timing_delays_every_load() -> None:
    # Upstream's load() sleeps 2 s before spawning: a queued load's Spawn carries it.
    b = Bench(fake_timing=True)
    out = b.acquire(b.rid(), "a")
    assert spawns(out) == [Spawn("a", 1, 2.0)]
    assert b.status("a") is Status.UNLOADED  # upstream is still asleep in load()
    assert emits(b.spawned("a")) == [Sse("a", "model_status", {"status": "loading"})]
    assert b.status("a") is Status.LOADING
    # POST /models/load: "already running" is answered at once, before the sleep...
    running = b.rid()
    assert failure_of(b.load(running, "a"), running) == Failure.bad_request(
        "model is already running"
    )
    # ...any other load waits it out in the core, then goes on (here: spawns at once).
    rid = b.rid()
    assert b.load(rid, "b") == []
    due = b.now + 2.0
    assert b.core.next_deadline() == due
    assert b.on_time(due - 0.5) == []
    out = b.on_time(due)
    assert spawns(out) == [Spawn("b", 1, 0.0)]
    assert reply_to(out, rid) is None
    assert b.core.next_deadline() is None


def test_a_model_loaded_while_its_load_sleeps_out_fake_timing_is_a_success() -> None:
    # Upstream: after the sleep, a model that is no longer unloaded is left as it is.
    b = Bench(fake_timing=True)
    rid = b.rid()
    assert b.load(rid, "a") == []
    due = b.now + 2.0
    assert spawns(b.acquire(b.rid(), "a")) == [Spawn("a", 1, 2.0)]  # a request loads it
    out = b.on_time(due)
    assert spawns(out) == []
    assert reply_to(out, rid) is None


def test_stop_all_waits_for_a_delayed_spawn_to_be_called_off() -> None:
    b = Bench(fake_timing=True)
    b.acquire(b.rid(), "a")
    done = b.rid()
    out = b.stop_all(done)
    assert stops(out) == [
        Stop("a", 1, kill=True, cause=StopCause(StopReason.SHUTDOWN), save_slots=False)
    ]
    assert done not in answered(out)
    out = b.exited("a", 1)
    assert reply_to(out, done) is None
