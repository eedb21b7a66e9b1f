"""Fair admission (--drain-after): a model that gets no slot because every loaded model
is busy waits a bounded time, then the busy model with the least demand is drained for it."""

from __future__ import annotations

from schedcore_kit import Bench, Sse, answered, emits, grant_of, spawns, stops

from troupe.sched import ModelConfig, Spawn, Stop
from troupe.sched.reasons import StopCause, StopReason


def starving_b(b: Bench) -> tuple[int, int]:
    """a is up and busy (one lease) in the only slot; a request for b waits."""
    b.bring_up("a")
    lease = b.lease("a")
    wb = b.rid()
    assert b.acquire(wb, "b") == []
    return lease, wb


def test_without_drain_after_a_busy_model_keeps_its_slot_as_upstream() -> None:
    b = Bench(models_max=1)
    starving_b(b)
    assert b.core.next_deadline() is None
    assert b.view("b").wait_reason == "waiting for a slot: every loaded model is busy or pinned"


def test_a_starving_model_gets_the_slot_of_the_lru_busy_model_after_the_bound() -> None:
    b = Bench(models_max=1, drain_after=3.0)
    lease, wb = starving_b(b)
    deadline = b.core.next_deadline()
    assert deadline == b.now + 3.0
    out = b.core.on_time(deadline)
    assert Sse("a", "troupe_drain", {"for": "b", "in_flight": 1}) in emits(out)
    assert b.view("a").draining_for == "b"
    assert stops(out) == []  # its request in flight finishes first
    wa = b.rid()
    assert b.acquire(wa, "a") == []  # no new lease: it queues behind b, in arrival order
    assert b.core.snapshot().queue == (("b", 1), ("a", 1))
    (stop,) = stops(b.release(lease))
    assert stop == Stop("a", 1, kill=False, cause=StopCause(StopReason.DRAIN, "b"), save_slots=True)
    assert spawns(b.finish_stop(stop)) == [Spawn("b", 1, 0.0)]
    b.spawned("b")
    out = b.ready("b")
    assert answered(out) == {wb}
    # b serves what was queued for it, then gives the slot back to a's request.
    (stop,) = stops(b.release(wb))
    assert stop.cause == StopCause(StopReason.LRU, "a")
    assert spawns(b.finish_stop(stop)) == [Spawn("a", 2, 0.0)]
    b.spawned("a")
    assert grant_of(b.ready("a"), wa).model == "a"
    assert b.core.snapshot().swaps_since(b.now - 60) == 2


def test_a_pinned_busy_model_is_never_drained() -> None:
    b = Bench([ModelConfig("a", pin=True), ModelConfig("b")], models_max=1, drain_after=3.0)
    starving_b(b)
    out = b.core.on_time(b.core.next_deadline() or 0.0)
    assert b.view("a").draining_for is None
    assert [e for e in emits(out) if e.event == "troupe_drain"] == []


def test_the_drain_is_called_off_when_the_starving_request_leaves() -> None:
    b = Bench(models_max=1, drain_after=3.0)
    lease, wb = starving_b(b)
    b.core.on_time(b.core.next_deadline() or 0.0)
    wa = b.rid()
    b.acquire(wa, "a")  # queued behind b while a drains
    out = b.release(wb)  # b's client gives up
    assert grant_of(out, wa).model == "a"  # a serves again, nothing is stopped
    assert stops(out) == []
    assert b.view("a").draining_for is None
    b.release(lease)
    assert b.status("a").value == "loaded"


def test_a_drain_that_finds_no_victim_sets_no_new_timer_until_something_changes() -> None:
    b = Bench([ModelConfig("a", pin=True), ModelConfig("b")], models_max=1, drain_after=3.0)
    lease, _ = starving_b(b)
    b.core.on_time(b.core.next_deadline() or 0.0)
    assert b.core.next_deadline() is None  # no wake-up every drain_after behind a pinned model
    assert lease


def test_the_drained_models_own_waiters_get_an_idle_models_slot_in_the_same_step() -> None:
    # a is drained for b while c was still loading; a's next request waits behind b. When
    # a's last request ends, a goes for b, and c (idle by then) goes for a's waiter at once,
    # not after a's exit (found by a long run of the state machine).
    b = Bench(models_max=2, drain_after=3.0)
    b.bring_up("a")
    busy = b.lease("a")
    wc = b.rid()
    assert [s.model for s in spawns(b.acquire(wc, "c"))] == ["c"]  # c loads in slot two
    wb = b.rid()
    b.acquire(wb, "b")  # no slot: a busy, c still loading
    deadline = b.core.next_deadline()
    assert deadline is not None
    b.on_time(deadline)
    assert b.view("a").draining_for == "b"  # the only busy model that is up
    wa = b.rid()
    b.acquire(wa, "a")  # waits for a's next instance, behind b
    b.spawned("c")
    grant_of(b.ready("c"), wc)
    assert stops(b.release(wc)) == []  # c idle: nobody needs its slot yet
    out = b.release(busy)
    assert [(s.model, s.cause) for s in stops(out)] == [
        ("a", StopCause(StopReason.DRAIN, "b")),
        ("c", StopCause(StopReason.LRU, "a")),
    ]
