"""CPU placement in the core: a child alone gets every core, children beside each other
get disjoint lanes, a newcomer never waits for a lane while a child wider than its lane
is re-planned (stopped or drained, started again narrower), explicit CPU flags are left
as given and counted."""

from __future__ import annotations

from schedcore_kit import Bench, grant_of, reply_to, spawns, stops

from troupe.sched import ModelConfig, Phase, Spawn, Status, StopCause, StopReason
from troupe.sched.cpu import CpuCore, CpuLedger, CpuRequest, CpuTopology, lane_widths
from troupe.sched.placement import WIDEN_AFTER


def ledger(cores: int = 2) -> CpuLedger:
    return CpuLedger(CpuTopology(tuple(CpuCore((i,)) for i in range(cores))))


def bench(models: list[str | ModelConfig], cores: int = 2, models_max: int = 2) -> Bench:
    return Bench(models, models_max=models_max, cpu=ledger(cores))


def lane(spawn: Spawn) -> tuple[tuple[int, ...], int]:
    assert spawn.cpu is not None, spawn
    return spawn.cpu.cpus, spawn.cpu.threads


def test_lanes_split_the_cores_evenly() -> None:
    assert lane_widths(8, 3) == [3, 3, 2]
    assert lane_widths(2, 5) == [1, 1]  # never more lanes than cores
    assert lane_widths(4, 1) == [4]


def test_a_model_alone_gets_every_core_even_with_others_in_the_catalog() -> None:
    b = bench(["a", "b", "c"], cores=4, models_max=3)
    (spawn,) = spawns(b.acquire(b.rid(), "a"))
    assert lane(spawn) == ((0, 1, 2, 3), 4)


def test_a_second_model_starts_at_once_and_the_idle_wide_one_is_started_again_narrower() -> None:
    b = bench(["a", "b"])
    b.bring_up("a")
    wb = b.rid()
    out = b.acquire(wb, "b")
    # b never waits for a lane: it takes the core a gives up (shared until a is narrowed)
    assert {s.model: (lane(s), s.cpu.shared) for s in spawns(out) if s.cpu} == {
        "b": (((1,), 1), True)
    }
    (stop,) = stops(out)
    assert stop.cause == StopCause(StopReason.REPLAN, "b")
    b.spawned("b")
    grant_of(b.ready("b"), wb)
    (again,) = spawns(b.finish_stop(stop))
    assert lane(again) == ((0,), 1)  # disjoint from b's
    assert again.cpu is not None
    assert not again.cpu.shared
    b.spawned("a")
    b.ready("a")
    assert b.view("a").cpu is not None
    assert set(b.view("a").cpu.cpus).isdisjoint(b.view("b").cpu.cpus)


def test_a_busy_wide_model_finishes_its_requests_before_it_is_narrowed() -> None:
    b = bench(["a", "b"])
    b.bring_up("a")
    busy = b.lease("a")
    wb, wa = b.rid(), b.rid()
    out = b.acquire(wb, "b")
    assert stops(out) == []
    assert [s.model for s in spawns(out)] == ["b"]  # a long answer on a holds b back not
    assert b.view("a").phase is Phase.DRAINING
    assert b.acquire(wa, "a") == []  # a takes no new request meanwhile: it waits
    b.spawned("b")
    grant_of(b.ready("b"), wb)
    (stop,) = stops(b.release(busy))
    assert stop.cause == StopCause(StopReason.REPLAN, "b")
    (again,) = spawns(b.finish_stop(stop))
    assert lane(again) == ((0,), 1)
    b.spawned("a")
    grant_of(b.ready("a"), wa)  # a's own waiter is served by its narrower child


def test_a_drain_for_a_lane_is_called_off_when_the_model_that_took_it_is_gone() -> None:
    b = bench(["a", "b"])
    b.bring_up("a")
    busy = b.lease("a")
    wb = b.rid()
    b.acquire(wb, "b")
    assert b.view("a").phase is Phase.DRAINING
    b.spawned("b")
    b.exited("b", 1, expected=False)  # b died as it loaded: a keeps every core
    assert b.view("a").phase is Phase.LOADED
    assert stops(b.release(busy)) == []


def test_a_wide_child_still_loading_is_narrowed_once_ready() -> None:
    b = bench(["a", "b"])
    wa = b.rid()
    spawns(b.acquire(wa, "a"))
    b.spawned("a")  # loading, its first request waiting for it
    out = b.acquire(b.rid(), "b")
    assert [s.model for s in spawns(out)] == ["b"]
    assert stops(out) == []  # its load is not thrown away
    grant_of(b.ready("a"), wa)  # its waiter is served by the wide child...
    assert b.view("a").phase is Phase.DRAINING  # ...which is narrowed after
    (stop,) = stops(b.release(wa))
    assert stop.cause == StopCause(StopReason.REPLAN, "b")


def test_more_models_than_cores_share_one_core_lanes_with_one_thread() -> None:
    b = bench(["a", "b", "c"], cores=2, models_max=3)
    b.bring_up("a")
    out = b.acquire(b.rid(), "b")
    out += b.finish_stop(stops(out)[0])  # a is narrowed for b
    for s in spawns(out):
        b.spawned(s.model)
        b.ready(s.model)
    (spawn,) = spawns(b.acquire(b.rid(), "c"))
    assert spawn.cpu is not None
    assert (spawn.cpu.threads, spawn.cpu.shared) == (1, True)


def test_explicit_cpu_flags_are_left_as_given_and_counted() -> None:
    fixed = ModelConfig("a", cpu=CpuRequest(threads=1))
    b = bench([fixed, "b"])
    (spawn,) = spawns(b.acquire(b.rid(), "a"))
    assert spawn.cpu is None  # its flags stand
    b.spawned("a")
    b.ready("a")
    (other,) = spawns(b.acquire(b.rid(), "b"))
    assert lane(other)[1] == 1  # the core a's one thread takes is not given away


def test_without_a_ledger_nothing_is_placed() -> None:
    b = Bench(["a", "b"], models_max=2)
    b.bring_up("a")
    (spawn,) = spawns(b.acquire(b.rid(), "b"))
    assert spawn.cpu is None
    assert stops(b.acquire(b.rid(), "b")) == []


def test_a_narrowed_child_left_alone_and_idle_is_started_again_on_every_core() -> None:
    b = bench(["a", "b"])
    b.bring_up("a")
    out = b.acquire(b.rid(), "b")
    out += b.finish_stop(stops(out)[0])
    for s in spawns(out):
        b.spawned(s.model)
        b.ready(s.model)
    lease = next(iter(b.core.requests.leases))
    b.release(lease)
    (gone,) = stops(b.unload(b.rid(), "b"))
    b.finish_stop(gone)
    assert b.view("a").cpu.threads == 1  # alone now, but narrow
    deadline = b.core.next_deadline()
    assert deadline is not None
    assert deadline >= b.now + WIDEN_AFTER - 3  # counted from when its last request ended
    assert stops(b.on_time(deadline - 0.001)) == []
    (stop,) = stops(b.on_time(deadline))
    assert stop.cause == StopCause(StopReason.REPLAN)
    (again,) = spawns(b.finish_stop(stop))
    assert lane(again) == ((0, 1), 2)


def _load_beside(b: Bench, model: str) -> None:
    """POST /models/load of ``model`` beside the one running child, which is narrowed for
    it (stopped at once, idle) and started again on its new lane; both end up ready."""
    rid = b.rid()
    out = b.load(rid, model)
    assert reply_to(out, rid) is None, out
    (stop,) = stops(out)
    assert stop.cause == StopCause(StopReason.REPLAN, model)
    b.spawned(model)
    b.ready(model)
    (again,) = spawns(b.finish_stop(stop))
    assert again.model == stop.model
    b.spawned(again.model)
    b.ready(again.model)


def test_a_replan_restart_keeps_the_model_s_place_in_the_lru_order() -> None:
    # llama.cpp's test_router_models_max_evicts_lru: --models-max 2, load a, b, then c;
    # a is the least recently used and goes, though loading b restarted it narrower.
    b = bench(["a", "b", "c"])
    b.bring_up("a")
    used = b.view("a").last_used
    _load_beside(b, "b")
    assert b.view("a").last_used == used  # its restart was no use of it
    assert b.view("b").last_used > used
    out = b.load(b.rid(), "c")
    assert [(s.model, s.cause) for s in stops(out)] == [("a", StopCause(StopReason.LRU, "c"))]


def test_a_replan_restart_keeps_the_model_s_demand_and_place_with_fair_admission() -> None:
    # Fair admission evicts the least demand first, the least recently used among equals:
    # loads alone add no demand, so a, loaded first, is the one to go for a request's c.
    b = Bench(["a", "b", "c"], models_max=2, cpu=ledger(2), drain_after=30.0)
    b.bring_up("a")
    a = b.core.table.models["a"]
    before = (a.demand, a.demand_at, a.last_used)
    _load_beside(b, "b")
    assert (a.demand, a.demand_at, a.last_used) == before
    out = b.acquire(b.rid(), "c")
    assert [(s.model, s.cause) for s in stops(out)] == [("a", StopCause(StopReason.LRU, "c"))]


def test_a_model_started_again_narrower_shows_loaded_and_a_load_judges_it_once_back() -> None:
    b = bench(["a", "b", "c"])
    b.bring_up("a")
    out = b.load(b.rid(), "b")
    (stop,) = stops(out)
    b.spawned("b")
    b.ready("b")
    assert b.view("a").api_status is Status.LOADED  # its old child stops
    b.finish_stop(stop)
    assert b.view("a").api_status is Status.LOADED  # started again: llama.cpp's API
    assert b.view("a").status is Status.LOADING  # shows no restart; troupe's view does
    b.spawned("a")
    wc = b.rid()
    assert stops(b.load(wc, "c")) == []  # a's place in the LRU order is judged once it is up
    (evict,) = stops(b.ready("a"))
    assert (evict.model, evict.cause) == ("a", StopCause(StopReason.LRU, "c"))
    assert reply_to(b.finish_stop(evict), wc) is None


def test_a_load_that_waited_for_a_restart_called_off_picks_its_victim_at_once() -> None:
    # A POST /models/load waits while a narrowed model is started again (it may be the
    # victim); when a queued request takes that slot instead, the restart is called off
    # and the load picks its LRU victim in the same event, not at some later one.
    b = Bench(["a", "b", "c", "d"], models_max=2, cpu=ledger(2), fake_timing=True)
    b.load(b.rid(), "a")
    b.on_time(b.now + 2.0)  # upstream's load() sleeps 2 s first
    b.spawned("a")
    b.ready("a")
    b.load(b.rid(), "b")
    (replan,) = stops(b.on_time(b.now + 2.0))
    assert replan.cause == StopCause(StopReason.REPLAN, "b")
    b.spawned("b")
    b.ready("b")
    wc = b.rid()
    assert b.load(wc, "c") == []  # asleep for 2 s
    due = b.now + 2.0
    b.acquire(b.rid(), "d")  # queued: no slot
    b.now = due - 1.0
    out = b.finish_stop(replan)  # at the load's wake-up: d takes a's slot, a stays down
    assert [s.model for s in spawns(out)] == ["d"], out
    assert b.view("a").phase is Phase.UNLOADED
    assert [(s.model, s.cause) for s in stops(out)] == [("b", StopCause(StopReason.LRU, "c"))]
