"""Demand-aware eviction (with fair admission on): the model with the least demand goes,
not whichever popular model happened to be idle for a moment; without it, upstream LRU."""

from __future__ import annotations

from schedcore_kit import Bench, spawns, stops

from troupe.sched import Effect, Prefetch, Stop
from troupe.sched.lru import HOLD_FOR, demand
from troupe.sched.reasons import StopCause, StopReason


def popular_and_rare(b: Bench) -> None:
    """a and b are up; a was asked for three times, b once, b last."""
    b.bring_up("a")
    for _ in range(3):
        b.release(b.lease("a"))
    b.bring_up("b")
    b.release(b.lease("b"))


def test_fair_admission_evicts_the_least_demanded_idle_model_not_the_lru_one() -> None:
    b = Bench(models_max=2, drain_after=1.0)
    popular_and_rare(b)
    (stop,) = stops(b.acquire(b.rid(), "c"))
    assert stop.model == "b"  # used last, but asked for least


def test_without_fair_admission_the_lru_model_goes_as_upstream() -> None:
    b = Bench(models_max=2)
    popular_and_rare(b)
    (stop,) = stops(b.acquire(b.rid(), "c"))
    assert stop.model == "a"


def test_a_popular_model_idle_for_a_moment_is_not_evicted_while_a_rare_one_can_go() -> None:
    # m-c (rare) was loaded in a's place and serves what it was loaded for; a's requests
    # now wait. b (popular) goes idle between two requests: evicting it would be a second
    # swap for nothing, since c goes as soon as its request is done.
    b = Bench(models_max=2, drain_after=1.0)
    b.bring_up("b")
    for _ in range(10):
        b.release(b.lease("b"))
    b.bring_up("c")
    rare = b.lease("c")
    busy_b = b.lease("b")
    for _ in range(8):
        b.acquire(b.rid(), "a")  # a is in demand: eight requests wait for it
    assert stops(b.release(busy_b)) == []  # b idle for a moment: kept
    (stop,) = stops(b.release(rare))  # c done: it goes for a
    assert stop == Stop(
        "c", b.gen["c"], kill=False, cause=StopCause(StopReason.LRU, "a"), save_slots=True
    )
    out = b.finish_stop(stop)
    assert [s.model for s in spawns(out)] == ["a"]
    assert b.view("b").status.value == "loaded"


def test_a_busy_model_with_under_half_the_demand_is_waited_for_and_others_are_not() -> None:
    # The more popular model goes idle for a moment while a rare one waits: it is kept
    # when the busy one has under half its demand (11:5), which can go once done; at 11:8
    # (a trace's 0.55/0.40) the idle one goes at once, or the rare model would wait for
    # the other popular one to go idle (bench/swaps.py: p99 up to 750 ms, see sched.lru).
    for asked_b, held in ((5, True), (8, False)):
        b = Bench(models_max=2, drain_after=1.0)
        b.bring_up("a")
        b.bring_up("b")
        for i in range(11):  # interleaved, so that both decay alike
            b.release(b.lease("a"))
            if i < asked_b:
                b.release(b.lease("b"))
        busy_b = b.lease("b")
        busy_a = b.lease("a")
        more, less = b.core.table.models["a"], b.core.table.models["b"]
        assert (demand(less, b.now) * HOLD_FOR < demand(more, b.now)) is held  # the premise
        assert stops(b.acquire(b.rid(), "c")) == []  # both busy
        evicted = stops(b.release(busy_a))
        if held:
            assert evicted == []
            (stop,) = stops(b.release(busy_b))
            assert stop.model == "b"
        else:
            assert [s.model for s in evicted] == ["a"]


def test_the_wait_for_the_rare_model_is_bounded_by_the_drain_timer() -> None:
    b = Bench(models_max=2, drain_after=1.0)
    b.bring_up("b")
    for _ in range(10):
        b.release(b.lease("b"))
    b.bring_up("c")
    rare = b.lease("c")  # never released: a client that keeps c busy
    for _ in range(8):
        b.acquire(b.rid(), "a")
    deadline = b.core.next_deadline()
    assert deadline is not None
    b.now = deadline
    b.core.on_time(deadline)
    assert b.view("c").draining_for == "a"  # the least demanded busy model, not b
    (stop,) = stops(b.release(rare))
    assert stop.cause == StopCause(StopReason.DRAIN, "a")
    assert [s.model for s in spawns(b.finish_stop(stop))] == ["a"]


def test_a_hold_for_a_model_that_is_still_loading_ends_with_the_drain_timer() -> None:
    # c (rare) takes long to load; a (popular) is idle. b waits: a is kept while c may
    # go once done, but not past the bound: then a goes, as upstream would at once.
    b = Bench(models_max=2, drain_after=1.0)
    b.bring_up("a")
    for _ in range(10):
        b.release(b.lease("a"))
    assert [s.model for s in spawns(b.acquire(b.rid(), "c"))] == ["c"]  # the free slot
    b.spawned("c")  # ... and it loads, slowly
    for _ in range(4):
        b.acquire(b.rid(), "b")
    assert b.view("a").stopping is False  # held: c, still loading, can go instead
    deadline = b.core.next_deadline()
    assert deadline is not None
    (stop,) = stops(b.on_time(deadline))
    assert stop == Stop(
        "a", b.gen["a"], kill=False, cause=StopCause(StopReason.LRU, "b"), save_slots=True
    )


def prefetches(b: Bench, effects: list[Effect]) -> list[str]:
    return [e.model for e in [*effects, *b.extra] if isinstance(e, Prefetch)]


def test_a_model_waiting_for_a_slot_has_its_files_read_ahead_once_per_wait() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    busy = b.lease("a")
    assert prefetches(b, b.acquire(b.rid(), "b")) == ["b"]  # waits for a: read b meanwhile
    assert prefetches(b, b.acquire(b.rid(), "b")) == []  # the same wait: once
    (stop,) = stops(b.release(busy))
    b.finish_stop(stop)
    b.spawned("b")
    b.ready("b")
    assert prefetches(b, b.acquire(b.rid(), "a")) == ["a"]  # a later wait: again


def test_a_model_with_a_free_slot_is_not_read_ahead_its_child_reads_it() -> None:
    b = Bench(models_max=2)
    out = b.acquire(b.rid(), "a")
    assert [s.model for s in spawns(out)] == ["a"]
    assert prefetches(b, out) == []
