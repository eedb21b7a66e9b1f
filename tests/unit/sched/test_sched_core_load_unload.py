"""`POST /models/load` / `POST /models/unload` in the core (as upstream)."""

from __future__ import annotations

from schedcore_kit import Bench, answered, failure_of, grant_of, reply_to, spawns, stops

from troupe.sched import Failure, ModelConfig, Spawn, Status, Stop
from troupe.sched.reasons import StopCause, StopReason


def test_load_unknown_model_is_404() -> None:
    b = Bench()
    rid = b.rid()
    out = b.load(rid, "nope")
    assert reply_to(out, rid) == Failure(404, "model is not found", "not_found_error")
    assert spawns(out) == []


def test_load_with_a_free_slot_spawns_and_succeeds() -> None:
    b = Bench(models_max=2)
    rid = b.rid()
    out = b.load(rid, "a")
    assert reply_to(out, rid) is None
    assert spawns(out) == [Spawn("a", 1, 0.0)]


def test_load_does_not_use_the_admission_queue() -> None:
    b = Bench(models_max=0)
    b.acquire(b.rid(), "a")  # a is the head and claims
    b.acquire(b.rid(), "b")  # b is queued behind it
    rid = b.rid()
    out = b.load(rid, "c")
    assert reply_to(out, rid) is None
    assert [s.model for s in spawns(out)] == ["c"]


def _already_running(b: Bench, rid: int, model: str) -> None:
    out = b.load(rid, model)
    assert reply_to(out, rid) == Failure(400, "model is already running", "invalid_request_error")
    assert spawns(out) == []
    assert stops(out) == []


def test_load_of_a_loading_model_is_400_already_running() -> None:
    b = Bench()
    b.load(b.rid(), "a")
    b.spawned("a")
    _already_running(b, b.rid(), "a")


def test_load_of_a_loaded_model_is_400_already_running() -> None:
    b = Bench()
    b.bring_up("a")
    _already_running(b, b.rid(), "a")


def test_load_of_a_sleeping_model_is_400_already_running() -> None:
    b = Bench()
    b.bring_up("a")
    b.state("a", "sleeping", {})
    _already_running(b, b.rid(), "a")


def test_load_of_a_stopping_model_is_400_already_running() -> None:
    b = Bench()
    b.bring_up("a")
    b.unload(b.rid(), "a")
    assert b.view("a").stopping
    _already_running(b, b.rid(), "a")


def test_load_when_every_model_is_busy_is_500_model_limit_reached() -> None:
    b = Bench(models_max=2)
    b.bring_up("a")
    b.bring_up("b")
    b.lease("a")
    b.lease("b")
    rid = b.rid()
    out = b.load(rid, "c")
    assert reply_to(out, rid) == Failure(
        500, "model limit reached, try again later", "server_error"
    )
    assert spawns(out) == []
    assert stops(out) == []


def test_load_when_only_pinned_models_remain_is_500_model_limit_reached() -> None:
    b = Bench([ModelConfig("a", pin=True), "b"], models_max=1)
    b.bring_up("a")
    rid = b.rid()
    assert failure_of(b.load(rid, "b"), rid).status == 500


def test_load_evicts_the_lru_model_and_spawns_only_after_the_victim_exits() -> None:
    b = Bench(models_max=2)
    b.bring_up("a")
    b.bring_up("b")
    rid = b.rid()
    out = b.load(rid, "c")
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.LRU, "c"), save_slots=True)
    ]
    assert spawns(out) == []
    assert rid not in answered(out)  # it blocks until the victim is gone
    # the victim's progress does not unblock it; only its exit does
    assert spawns(b.state("a", "sleeping", {})) == []
    assert spawns(b.on_time(b.tick())) == []
    out = b.exited("a", 0)
    assert reply_to(out, rid) is None
    assert spawns(out) == [Spawn("c", 1, 0.0)]


def test_load_blocked_on_a_victim_fails_if_the_slot_is_taken_meanwhile() -> None:
    # Upstream re-checks capacity under the lock after unload_lru and throws.
    b = Bench(models_max=1)
    b.bring_up("a")
    rid = b.rid()
    (stop,) = stops(b.load(rid, "b"))
    waiter = b.rid()
    assert b.acquire(waiter, "a") == []  # a request for the stopping model queues
    out = b.finish_stop(stop)
    assert [s.model for s in spawns(out)] == ["a"]  # the queued request got the slot
    assert reply_to(out, rid) == Failure(
        500, "model limit reached, try again later", "server_error"
    )


def test_load_lifts_nothing_when_a_queued_request_started_it_meanwhile() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    rid = b.rid()
    (stop,) = stops(b.load(rid, "b"))
    waiter = b.rid()
    b.acquire(waiter, "b")
    out = b.finish_stop(stop)
    assert [s.model for s in spawns(out)] == ["b"]  # once, by the queue
    assert reply_to(out, rid) is None


def test_load_waiter_that_leaves_is_never_answered() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    rid = b.rid()
    (stop,) = stops(b.load(rid, "b"))
    assert b.release(rid) == []
    out = b.finish_stop(stop)
    assert rid not in answered(out)
    assert spawns(out) == []


def test_unload_unknown_model_is_400_not_found() -> None:
    b = Bench()
    rid = b.rid()
    assert reply_to(b.unload(rid, "nope"), rid) == Failure(
        400, "model is not found", "invalid_request_error"
    )


def test_unload_of_an_unloaded_model_is_400_not_running() -> None:
    b = Bench()
    rid = b.rid()
    out = b.unload(rid, "a")
    assert reply_to(out, rid) == Failure(400, "model is not running", "invalid_request_error")
    assert stops(out) == []


def test_unload_of_a_loading_model_kills_it() -> None:
    b = Bench()
    b.load(b.rid(), "a")
    b.spawned("a")
    rid = b.rid()
    out = b.unload(rid, "a")
    assert reply_to(out, rid) is None
    assert stops(out) == [
        Stop("a", 1, kill=True, cause=StopCause(StopReason.UNLOAD), save_slots=False)
    ]
    b.exited("a", 1)  # SIGKILL is reported as 1
    assert b.view("a").failed


def test_unload_of_a_loaded_model_stops_it_gracefully() -> None:
    b = Bench()
    b.bring_up("a")
    rid = b.rid()
    out = b.unload(rid, "a")
    assert reply_to(out, rid) is None  # answered without waiting for the exit
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.UNLOAD), save_slots=True)
    ]
    assert b.view("a").stopping
    assert b.status("a") is Status.LOADED


def test_unload_of_a_sleeping_model_stops_it_gracefully() -> None:
    b = Bench()
    b.bring_up("a")
    b.state("a", "sleeping", {})
    assert stops(b.unload(b.rid(), "a")) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.UNLOAD), save_slots=True)
    ]


def test_unload_of_a_busy_model_stops_it_anyway() -> None:
    b = Bench()
    b.bring_up("a")
    b.lease("a")
    assert stops(b.unload(b.rid(), "a")) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.UNLOAD), save_slots=True)
    ]


def test_stop_is_idempotent() -> None:
    b = Bench()
    b.bring_up("a")
    r1, r2 = b.rid(), b.rid()
    out1 = b.unload(r1, "a")
    out2 = b.unload(r2, "a")
    assert len(stops(out1)) == 1
    assert stops(out2) == []
    assert reply_to(out2, r2) is None
    assert stops(b.stop_all(b.rid())) == []  # shutdown does not stop it twice either


def test_stopping_model_is_not_granted_new_requests() -> None:
    b = Bench()
    b.bring_up("a")
    b.unload(b.rid(), "a")
    w = b.rid()
    assert b.acquire(w, "a") == []


def test_unload_right_after_load_stops_the_model() -> None:
    # Upstream's load() has set `loading` and spawned before the 200 goes out, so an
    # unload that follows the 200 finds the model running and kills it (as upstream).
    b = Bench()
    rid = b.rid()
    out = b.load(rid, "a")
    if rid not in answered(out):
        out = b.spawned("a")  # the core may answer the load once the child is up
    assert reply_to(out, rid) is None
    r2 = b.rid()
    out = b.unload(r2, "a")
    assert reply_to(out, r2) is None
    assert stops(out) == [
        Stop("a", 1, kill=True, cause=StopCause(StopReason.UNLOAD), save_slots=False)
    ]


def test_load_during_shutdown_is_refused() -> None:
    b = Bench()
    b.bring_up("a")
    done = b.rid()
    (stop,) = stops(b.stop_all(done))
    rid = b.rid()
    out = b.load(rid, "b")
    assert spawns(out) == []
    assert failure_of(out, rid).status == 503
    out = b.finish_stop(stop)
    assert reply_to(out, done) is None


def test_explicit_load_then_queued_requests_are_granted_when_ready() -> None:
    b = Bench(models_max=1)
    b.load(b.rid(), "a")
    b.spawned("a")
    w = b.rid()
    assert b.acquire(w, "a") == []
    assert grant_of(b.ready("a"), w).model == "a"
