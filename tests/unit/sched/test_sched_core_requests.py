"""`SchedulerCore.acquire`/`release`: the autoload wait and the admission queue."""

from __future__ import annotations

from schedcore_kit import (
    Bench,
    answered,
    failure_of,
    grant_of,
    replies,
    reply_to,
    spawns,
    stops,
)

from troupe.sched import Failure, Grant, ModelConfig, Spawn, Status, Stop
from troupe.sched.reasons import StopCause, StopReason


def test_loaded_model_is_granted_at_once() -> None:
    b = Bench()
    gen = b.bring_up("a")
    rid = b.rid()
    out = b.acquire(rid, "a")
    assert len(out) == 1  # only the reply: no spawn, no event
    assert grant_of(out, rid) == Grant("a", b.port["a"], gen, waited=False)
    assert b.view("a").in_flight == 1


def test_sleeping_model_is_granted_at_once_without_a_spawn() -> None:
    b = Bench()
    gen = b.bring_up("a")
    b.state("a", "sleeping", {})
    rid = b.rid()
    out = b.acquire(rid, "a")
    assert spawns(out) == []
    assert grant_of(out, rid) == Grant("a", b.port["a"], gen, waited=False)


def test_three_waiters_for_a_missing_model_cause_one_spawn_and_three_grants() -> None:
    b = Bench()
    rids = [b.rid() for _ in range(3)]
    out = b.acquire(rids[0], "a")
    assert spawns(out) == [Spawn("a", 1, 0.0)]
    assert replies(out) == []
    for rid in rids[1:]:
        out = b.acquire(rid, "a")
        assert out == []
    # upstream sets "loading" as it spawns; later arrivals wait on it without queueing
    assert b.view("a").status is Status.LOADING
    assert replies(b.spawned("a")) == []
    assert replies(b.state("a", "loading", {"value": 0.5})) == []
    out = b.ready("a")
    assert answered(out) == set(rids)
    for rid in rids:
        assert grant_of(out, rid) == Grant("a", b.port["a"], 1, waited=True)
    assert b.view("a").in_flight == 3
    assert b.core.snapshot().queue == ()


def test_busy_model_is_evicted_only_once_idle_and_the_next_spawns_after_its_exit() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    lease_a = b.lease("a")
    waiter = b.rid()
    out = b.acquire(waiter, "b")
    assert out == []  # a is busy: nothing can go yet
    assert b.view("b").queue_position == 1
    out = b.release(lease_a)
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.LRU, "b"), save_slots=True)
    ]
    assert spawns(out) == []
    assert b.view("a").last_eviction == "lru for b"
    # the stopping model still holds the only slot
    assert spawns(b.on_time(b.tick())) == []
    out = b.exited("a", 0)
    assert spawns(out) == [Spawn("b", 1, 0.0)]
    b.spawned("b")
    grant = grant_of(b.ready("b"), waiter)
    assert grant.model == "b"
    assert grant.waited


def test_models_queued_behind_a_busy_one_load_in_arrival_order() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    lease_a = b.lease("a")
    wb, wc = b.rid(), b.rid()
    assert b.acquire(wb, "b") == []
    assert b.acquire(wc, "c") == []
    assert b.core.snapshot().queue == (("b", 1), ("c", 1))
    (stop_a,) = stops(b.release(lease_a))
    assert stop_a.cause == StopCause(StopReason.LRU, "b")
    out = b.finish_stop(stop_a)
    assert [s.model for s in spawns(out)] == ["b"]  # only the head loads
    b.spawned("b")
    assert grant_of(b.ready("b"), wb).model == "b"
    assert b.core.snapshot().queue == (("c", 1),)
    (stop_b,) = stops(b.release(wb))
    assert stop_b == Stop("b", 1, kill=False, cause=StopCause(StopReason.LRU, "c"), save_slots=True)
    out = b.finish_stop(stop_b)
    assert [s.model for s in spawns(out)] == ["c"]
    b.spawned("c")
    assert grant_of(b.ready("c"), wc).model == "c"


def test_loads_of_different_models_run_in_parallel_when_slots_allow() -> None:
    # Upstream lets only the head of the queue load, so one load that never ends (a
    # child stopped while loading) blocks every other model. Here the first entry not
    # loading yet takes a free slot: b loads while a is still loading.
    b = Bench(models_max=0)
    wa, wb = b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(wa, "a"))] == ["a"]
    assert [s.model for s in spawns(b.acquire(wb, "b"))] == ["b"]
    b.spawned("b")
    assert grant_of(b.ready("b"), wb).model == "b"
    b.spawned("a")
    assert grant_of(b.ready("a"), wa).model == "a"


def test_parallel_claims_keep_arrival_order_when_slots_run_out() -> None:
    b = Bench(["a", "b", "c", "d"], models_max=2)
    wa, wb, wc, wd = b.rid(), b.rid(), b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(wa, "a"))] == ["a"]
    assert [s.model for s in spawns(b.acquire(wb, "b"))] == ["b"]
    assert b.acquire(wc, "c") == []  # no slot: both are loading (never evicted)
    assert b.acquire(wd, "d") == []
    out = b.exited("a", 1, expected=False)  # a's load fails: its slot goes to c, not d
    assert failure_of(out, wa).status == 500
    assert [s.model for s in spawns(out)] == ["c"]
    assert b.core.snapshot().queue == (("b", 1), ("c", 1), ("d", 1))


def test_queued_waiter_that_leaves_before_its_load_causes_no_eviction() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    lease_a = b.lease("a")
    waiter = b.rid()
    assert b.acquire(waiter, "b") == []
    assert b.release(waiter) == []
    assert b.core.snapshot().queue == ()
    out = b.release(lease_a)
    assert out == []
    assert b.status("a") is Status.LOADED
    assert not b.view("a").stopping


def test_slot_freed_for_a_departed_waiter_goes_to_the_next_entry() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    wb, wc = b.rid(), b.rid()
    (stop_a,) = stops(b.acquire(wb, "b"))
    assert stop_a.cause == StopCause(StopReason.LRU, "b")
    assert b.acquire(wc, "c") == []
    assert b.release(wb) == []  # b's waiter gives up; the eviction is already under way
    out = b.finish_stop(stop_a)
    assert [s.model for s in spawns(out)] == ["c"]
    b.spawned("c")
    assert grant_of(b.ready("c"), wc).model == "c"
    assert wb not in answered(out)


def test_failed_load_answers_every_waiter_500_failed_to_load() -> None:
    b = Bench()
    w1, w2 = b.rid(), b.rid()
    b.acquire(w1, "a")
    b.acquire(w2, "a")
    b.spawned("a")
    b.state("a", "loading", {"value": 0.1})
    out = b.exited("a", 1, expected=False)
    for rid in (w1, w2):
        f = failure_of(out, rid)
        assert f.status == 500
        assert f.type == "server_error"
        assert f.message.startswith("model name=a failed to load")
    view = b.view("a")
    assert view.status is Status.UNLOADED
    assert view.failed
    assert view.exit_code == 1
    assert b.core.snapshot().queue == ()


def test_failed_load_message_carries_the_last_error() -> None:
    b = Bench()
    w = b.rid()
    b.acquire(w, "a")
    b.spawned("a")
    out = b.exited("a", 1, expected=False, detail="out of memory")
    assert failure_of(out, w).message == "model name=a failed to load: out of memory"


def test_acquire_after_a_failed_load_spawns_again() -> None:
    b = Bench()
    w1 = b.rid()
    b.acquire(w1, "a")
    b.spawned("a")
    b.exited("a", 1, expected=False)
    w2 = b.rid()
    out = b.acquire(w2, "a")
    assert spawns(out) == [Spawn("a", 2, 0.0)]
    b.spawned("a")
    assert grant_of(b.ready("a"), w2).gen == 2
    assert not b.view("a").failed


def test_clean_exit_while_loading_answers_400_not_running() -> None:
    # Upstream ensure_model_ready: a spawn came back down with exit 0 -> "not running".
    b = Bench()
    w = b.rid()
    b.acquire(w, "a")
    b.spawned("a")
    f = failure_of(b.exited("a", 0, expected=False), w)
    assert (f.status, f.message) == (400, "model name=a is not running")


def test_signal_death_is_recorded_with_the_code_the_actor_reports() -> None:
    # The actor maps a signal death to 1 (as upstream); the core stores whatever code it gets.
    b = Bench()
    b.bring_up("a")
    b.exited("a", 1, expected=False)
    view = b.view("a")
    assert (view.status, view.exit_code, view.failed) == (Status.UNLOADED, 1, True)
    b.bring_up("a")
    b.exited("a", 0, expected=True)
    assert (b.view("a").exit_code, b.view("a").failed) == (0, False)


def test_stale_events_from_an_older_generation_are_ignored() -> None:
    b = Bench()
    b.bring_up("a")
    b.exited("a", 0)
    gen = b.bring_up("a")
    assert gen == 2
    lease = b.lease("a")
    port = b.port["a"]
    before = b.core.snapshot()
    assert b.spawned("a", gen=1) == []
    assert b.state("a", "loading", {"value": 0.0}, gen=1) == []
    assert b.state("a", "sleeping", {}, gen=1) == []
    assert b.ready("a", gen=1) == []
    assert b.exited("a", 1, expected=False, gen=1) == []
    assert b.exited("a", 1, expected=False, gen=3) == []  # from no child at all
    after = b.core.snapshot()
    assert after.models == before.models
    assert after.models["a"].in_flight == 1
    assert after.models["a"].port == port
    assert stops(b.release(lease)) == []


def test_stale_lease_release_does_not_touch_the_new_generation() -> None:
    b = Bench()
    b.bring_up("a")
    old = b.lease("a")
    b.exited("a", 1, expected=False)  # crash under the request
    assert b.view("a").in_flight == 0
    b.bring_up("a")
    new = b.lease("a")
    assert b.view("a").in_flight == 1
    b.release(old)
    assert b.view("a").in_flight == 1
    b.release(new)
    assert b.view("a").in_flight == 0


def test_autoload_off_unloaded_model_is_400_model_is_not_loaded() -> None:
    b = Bench()
    rid = b.rid()
    out = b.acquire(rid, "a", autoload=False)
    assert spawns(out) == []
    assert reply_to(out, rid) == Failure(400, "model is not loaded", "invalid_request_error")


def test_autoload_off_running_model_is_granted_even_while_loading() -> None:
    b = Bench()
    b.load(b.rid(), "a")
    b.spawned("a")
    rid = b.rid()
    out = b.acquire(rid, "a", autoload=False)
    assert grant_of(out, rid) == Grant("a", b.port["a"], 1, waited=False)


def test_autoload_off_stopping_model_is_still_proxied() -> None:
    # Upstream proxy_request only checks is_running(); the stopping set is not consulted.
    b = Bench()
    b.bring_up("a")
    b.unload(b.rid(), "a")
    rid = b.rid()
    assert isinstance(reply_to(b.acquire(rid, "a", autoload=False), rid), Grant)


def test_unknown_model_is_500_not_found() -> None:
    b = Bench()
    rid = b.rid()
    f = failure_of(b.acquire(rid, "nope"), rid)
    assert (f.status, f.message) == (500, "model name=nope is not found")


def test_request_for_a_stopping_model_waits_for_the_next_instance() -> None:
    b = Bench()
    b.bring_up("a")
    (stop,) = stops(b.unload(b.rid(), "a"))
    w = b.rid()
    assert b.acquire(w, "a") == []
    assert b.view("a").queue_position == 1
    out = b.finish_stop(stop)
    assert spawns(out) == [Spawn("a", 2, 0.0)]
    b.spawned("a")
    assert grant_of(b.ready("a"), w).gen == 2


def test_pinned_model_is_never_chosen_as_victim() -> None:
    b = Bench([ModelConfig("a", pin=True), "b", "c"], models_max=2)
    b.bring_up("a")  # used longest ago
    b.bring_up("b")
    w = b.rid()
    (stop,) = stops(b.acquire(w, "c"))
    assert stop.model == "b"
    assert stop.cause == StopCause(StopReason.LRU, "c")


def test_waiters_wait_when_only_pinned_or_busy_models_remain() -> None:
    b = Bench([ModelConfig("a", pin=True), "b", "c"], models_max=2)
    b.bring_up("a")
    b.bring_up("b")
    lease_b = b.lease("b")
    w = b.rid()
    assert b.acquire(w, "c") == []
    assert b.acquire(b.rid(), "c") == []
    assert b.core.snapshot().queue == (("c", 2),)
    (stop,) = stops(b.release(lease_b))
    assert stop.model == "b"


def test_least_recently_used_model_is_the_victim() -> None:
    b = Bench(["a", "b", "c"], models_max=2)
    b.bring_up("a")
    b.bring_up("b")
    b.release(b.lease("a"))  # a used more recently than b
    (stop,) = stops(b.acquire(b.rid(), "c"))
    assert stop.model == "b"


def test_get_style_request_does_not_refresh_last_used() -> None:
    b = Bench(["a", "b", "c"], models_max=2)
    b.bring_up("a")
    b.bring_up("b")
    rid = b.rid()
    grant_of(b.acquire(rid, "a", update_last_used=False), rid)
    b.release(rid)
    (stop,) = stops(b.acquire(b.rid(), "c"))
    assert stop.model == "a"


def test_sleeping_model_can_be_evicted() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    b.state("a", "sleeping", {})
    (stop,) = stops(b.acquire(b.rid(), "b"))
    assert stop == Stop("a", 1, kill=False, cause=StopCause(StopReason.LRU, "b"), save_slots=True)


def test_models_still_loading_are_never_evicted() -> None:
    b = Bench(models_max=1)
    wa = b.rid()
    b.acquire(wa, "a")
    b.spawned("a")
    wb = b.rid()
    assert stops(b.acquire(wb, "b")) == []
    out = b.ready("a")
    assert grant_of(out, wa).model == "a"
    assert stops(out) == []  # a is busy now
    (stop,) = stops(b.release(wa))
    assert stop.cause == StopCause(StopReason.LRU, "b")


def test_waiter_release_is_silent_and_never_answered_later() -> None:
    b = Bench()
    w1, w2 = b.rid(), b.rid()
    b.acquire(w1, "a")
    b.acquire(w2, "a")
    assert b.release(w1) == []
    b.spawned("a")
    out = b.ready("a")
    assert answered(out) == {w2}


def test_claimer_leaving_does_not_stop_the_load_for_the_others() -> None:
    b = Bench()
    w1, w2 = b.rid(), b.rid()
    b.acquire(w1, "a")
    b.acquire(w2, "a")
    b.spawned("a")
    assert b.release(w1) == []
    assert grant_of(b.ready("a"), w2).model == "a"


def test_a_request_that_may_not_load_is_refused_by_the_core_alone() -> None:
    # not_loaded is the answer acquire(autoload=False) gives, and a door that must refuse
    # before it takes the client on asks it instead of reading the snapshot.
    not_loaded = Failure.bad_request("model is not loaded")
    b = Bench()
    assert b.core.not_loaded("a") == not_loaded
    rid = b.rid()
    assert failure_of(b.acquire(rid, "a", autoload=False), rid) == not_loaded
    b.load(b.rid(), "a")  # spawn issued: running, not started yet
    assert b.core.not_loaded("a") is None
    rid = b.rid()
    assert failure_of(b.acquire(rid, "a", autoload=False), rid) == Failure.unavailable(
        "Loading model"
    )
    b.spawned("a")
    b.ready("a")
    rid = b.rid()
    grant_of(b.acquire(rid, "a", autoload=False), rid)
    b.release(rid)
    b.unload(b.rid(), "a")  # stopping: still running until it is gone
    assert b.core.not_loaded("a") is None
    b.exited("a", 0)
    assert b.core.not_loaded("a") == not_loaded
