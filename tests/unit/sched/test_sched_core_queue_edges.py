"""Admission-queue corner cases: a claim whose child never comes up, eviction labels,
and slots counted twice. Each test is a minimal event sequence."""

from __future__ import annotations

import pytest
from schedcore_kit import Bench, answered, failure_of, grant_of, reply_to, spawns, stops

from troupe.sched import Spawn, Stop
from troupe.sched.reasons import StopCause, StopReason


@pytest.mark.parametrize("fake_timing", [False, True])
def test_waiter_sharing_a_claim_whose_spawn_failed_is_not_stranded(fake_timing: bool) -> None:
    # With LLAMA_SERVER_DEBUG_FAKE_TIMING the spawn is delayed and the model stays
    # "unloaded" meanwhile, so a second request joins the claimed queue entry.
    b = Bench(fake_timing=fake_timing)
    w1, w2 = b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(w1, "a"))] == ["a"]
    assert b.acquire(w2, "a") == []
    out = b.exited("a", 1, expected=False)  # the actor could not start the child
    assert failure_of(out, w1).status == 500
    # w2 must either be answered or get a new instance; never wait on a dead claim
    if w2 not in answered(out):
        (spawn,) = spawns(out)
        assert (spawn.model, spawn.gen) == ("a", 2)
        b.spawned("a")
        assert grant_of(b.ready("a"), w2).gen == 2


def test_entry_of_a_failed_spawn_is_freed_when_its_waiters_leave() -> None:
    b = Bench(models_max=1)
    w1, w2, w3 = b.rid(), b.rid(), b.rid()
    b.acquire(w1, "a")
    b.acquire(w2, "a")
    b.acquire(w3, "b")  # behind a
    out = b.exited("a", 1, expected=False)
    out += b.release(w2)  # everyone who wanted a gives up
    assert b.core.snapshot().queue == (("b", 1),)
    assert "b" in [s.model for s in spawns(out)]


def test_request_arriving_while_a_loading_model_is_killed_gets_the_next_instance() -> None:
    # Upstream: "A request that arrives for a stopping model waits, via the queue, for the
    # next instance." Here the stopping model was claimed by an earlier waiter.
    b = Bench()
    w1 = b.rid()
    b.acquire(w1, "a")
    b.spawned("a")
    (stop,) = stops(b.unload(b.rid(), "a"))
    assert stop.kill
    w2 = b.rid()
    assert b.acquire(w2, "a") == []
    out = b.finish_stop(stop)
    assert failure_of(out, w1).message == "model name=a failed to load"
    assert spawns(out) == [Spawn("a", 2, 0.0)]
    b.spawned("a")
    assert grant_of(b.ready("a"), w2).gen == 2


def test_eviction_reason_names_the_entry_that_needs_the_slot() -> None:
    b = Bench(models_max=2)
    b.bring_up("c")
    wa, wb = b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(wa, "a"))] == ["a"]  # a claims the free slot
    out = b.acquire(wb, "b")  # b needs c's slot
    assert stops(out) == [
        Stop("c", 1, kill=False, cause=StopCause(StopReason.LRU, "b"), save_slots=True)
    ]


def test_queued_request_for_a_model_a_direct_load_started_evicts_nothing() -> None:
    # b's request waits in line behind a request for the stopping model a; POST
    # /models/load then starts b in a free slot. b's entry no longer needs a slot: the
    # idle model c must stay. (Upstream's tick counts every unclaimed entry as needing
    # one, so it shares this.)
    b = Bench(models_max=3)
    b.bring_up("c")
    b.bring_up("a")
    b.unload(b.rid(), "a")
    wa, wb = b.rid(), b.rid()
    assert b.acquire(wa, "a") == []  # waits for a's next instance
    assert b.acquire(wb, "b") == []
    rid = b.rid()
    out = b.load(rid, "b")
    assert reply_to(out, rid) is None
    assert [s.model for s in spawns(out)] == ["b"]
    assert stops(out) == []


def test_queued_request_for_a_model_already_coming_up_evicts_nothing() -> None:
    # POST /models/load started b; a request for b arrives before the child is up. b
    # already owns its slot, so the idle model a must stay.
    b = Bench(models_max=2)
    b.bring_up("a")
    b.load(b.rid(), "b")
    w = b.rid()
    out = b.acquire(w, "b")
    out += b.spawned("b")
    out += b.state("b", "loading", {"value": 0.5})
    out += b.ready("b")
    assert stops(out) == []
    assert grant_of(out, w).model == "b"


def _x_loading_with_y_behind(b: Bench) -> tuple[int, int, int]:
    """x loads in the only slot; y, then x again, queue behind it."""
    wx1, wy, wx2 = b.rid(), b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(wx1, "x"))] == ["x"]
    assert b.acquire(wy, "y") == []
    assert b.acquire(wx2, "x") == []
    assert b.core.snapshot().queue == (("x", 1), ("y", 1))  # the second x saw it loading
    b.spawned("x")
    return wx1, wy, wx2


def test_next_entry_loads_as_soon_as_the_entry_ahead_empties() -> None:
    # x comes up and its two waiters are granted; once both leases end, x is idle and
    # is evicted for y at once, and y spawns the moment x has exited. No step may wait
    # for some later, unrelated event.
    b = Bench(["x", "y"], models_max=1)
    wx1, _wy, wx2 = _x_loading_with_y_behind(b)
    out = b.ready("x")
    assert answered(out) == {wx1, wx2}
    assert b.core.snapshot().queue == (("y", 1),)
    assert spawns(out) == []  # x is busy: its slot is not free yet
    assert stops(b.release(wx1)) == []
    (stop,) = stops(b.release(wx2))
    assert (stop.model, stop.cause) == ("x", StopCause(StopReason.LRU, "y"))
    assert spawns(b.finish_stop(stop)) == [Spawn("y", 1, 0.0)]


def test_next_entry_loads_when_the_entry_ahead_fails() -> None:
    # Same, but x fails to load: no lease is left whose release would wake y later.
    b = Bench(["x", "y"], models_max=1)
    wx1, _wy, wx2 = _x_loading_with_y_behind(b)
    out = b.exited("x", 1, expected=False)
    assert answered(out) == {wx1, wx2}
    assert spawns(out) == [Spawn("y", 1, 0.0)]
