"""Reload, removal and the drain as the core carries them out: each is one message, and
whatever the asker does afterwards (it may be gone) the core finishes the job."""

from __future__ import annotations

from schedcore_kit import Bench, Sse, answered, emits, failure_of, grant_of, reply_to, spawns, stops

from troupe.sched import Failure, ModelConfig, RestartKey, Spawn, Status, Stop
from troupe.sched.effects import DeleteFiles, Reloaded
from troupe.sched.reasons import StopCause, StopReason

CONFIGS = [ModelConfig(n) for n in ("a", "b", "c")]
CHANGED = RestartKey("another preset")


def changed(*names: str) -> list[ModelConfig]:
    """The catalog with ``names``' presets changed."""
    return [ModelConfig(n, restart_key=CHANGED if n in names else RestartKey()) for n in "abc"]


def test_a_reload_with_nothing_to_restart_is_done_at_once() -> None:
    b = Bench()
    rid = b.rid()
    out = b.core.reload(rid, CONFIGS, b.tick())
    assert Reloaded(rid, (rid,)) in out
    assert Sse("*", "models_reload") in emits(out)
    assert reply_to(out, rid) is None


def test_loads_wait_for_the_models_a_reload_stops_and_go_on_with_the_new_catalog() -> None:
    b = Bench(models_max=2)
    b.bring_up("a")
    rid, w = b.rid(), b.rid()
    out = b.core.reload(rid, changed("a"), b.tick())
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.RELOAD), save_slots=False)
    ]
    assert b.acquire(w, "b") == []  # held: the catalog is being swapped
    out = b.core.exited("a", 1, 0, b.tick(), expected=True)
    kinds = [type(e).__name__ for e in out if isinstance(e, Reloaded | Spawn)]
    assert kinds == ["Reloaded", "Spawn"]  # the swap comes before any new child
    assert rid in answered(out)


def test_a_reload_asked_for_meanwhile_is_folded_in_and_both_are_answered() -> None:
    b = Bench()
    b.bring_up("a")
    b.bring_up("b")
    r1, r2 = b.rid(), b.rid()
    b.core.reload(r1, changed("a"), b.tick())
    newer = [
        ModelConfig("a", restart_key=CHANGED),
        ModelConfig("b", pin=True, restart_key=CHANGED),
        ModelConfig("c"),
    ]
    out = b.core.reload(r2, newer, b.tick())
    assert stops(out) == [
        Stop("b", 1, kill=False, cause=StopCause(StopReason.RELOAD), save_slots=False)
    ]
    b.core.exited("a", 1, 0, b.tick(), expected=True)  # b still runs: not done yet
    out = b.core.exited("b", 1, 0, b.tick(), expected=True)
    assert Reloaded(r2, (r1, r2)) in out  # the later catalog wins
    assert answered(out) == {r1, r2}
    assert b.view("b").pin


def test_a_model_removed_and_added_again_never_reuses_a_generation() -> None:
    b = Bench()
    gen = b.bring_up("a")
    stale = b.lease("a")
    rid = b.rid()
    b.core.reload(rid, [ModelConfig("b")], b.tick())
    b.exited("a", 0)
    assert "a" not in b.core.snapshot().models
    b.core.reload(b.rid(), CONFIGS, b.tick())
    assert b.bring_up("a") > gen
    fresh = b.lease("a")
    b.release(stale)  # a lease on the old child must not count against the new one
    assert b.view("a").in_flight == 1
    b.release(fresh)
    assert b.view("a").in_flight == 0


def test_remove_stops_the_model_then_asks_for_its_files_to_go() -> None:
    b = Bench()
    b.bring_up("a")
    rid, w = b.rid(), b.rid()
    out = b.core.remove(rid, "a", b.tick())
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.REMOVE), save_slots=False)
    ]
    assert DeleteFiles(rid, "a") not in out  # not while its child runs
    out = b.acquire(w, "a")  # a request meanwhile: the model is on its way out
    assert failure_of(out, w) == Failure.server_error("model name=a is not found")
    out = b.core.exited("a", 1, 0, b.tick(), expected=True)
    assert DeleteFiles(rid, "a") in out
    assert "a" not in b.core.snapshot().models
    assert rid not in answered(out)  # answered by the reload that follows the deletion
    out = b.core.reload(rid, [ModelConfig("b"), ModelConfig("c")], b.tick())
    assert reply_to(out, rid) is None


def test_remove_of_a_model_not_running_deletes_at_once() -> None:
    b = Bench()
    rid = b.rid()
    assert DeleteFiles(rid, "b") in b.core.remove(rid, "b", b.tick())


def test_drain_answers_waiters_kills_loads_and_lets_leases_finish() -> None:
    b = Bench(["a", "b", "c"], models_max=2)
    b.bring_up("a")
    lease = b.lease("a")
    wb, wc = b.rid(), b.rid()
    assert [s.model for s in spawns(b.acquire(wb, "b"))] == ["b"]  # loading
    b.spawned("b")
    b.acquire(wc, "c")  # queued: no slot
    out = b.core.begin_shutdown(b.tick())
    assert failure_of(out, wb) == Failure.unavailable("server is shutting down")
    assert failure_of(out, wc) == Failure.unavailable("server is shutting down")
    assert stops(out) == [
        Stop("b", 1, kill=True, cause=StopCause(StopReason.SHUTDOWN), save_slots=False)
    ]  # nobody waits for it
    assert b.status("a") is Status.LOADED  # its request may finish
    w = b.rid()
    assert failure_of(b.acquire(w, "a"), w).status == 503  # but nothing new starts
    assert spawns(b.release(lease)) == []
    assert (
        spawns(
            b.finish_stop(
                Stop("b", 1, kill=True, cause=StopCause(StopReason.SHUTDOWN), save_slots=False)
            )
        )
        == []
    )


def test_ready_only_leases_never_wait_and_never_load() -> None:
    b = Bench()
    w = b.rid()
    out = b.acquire(w, "a", ready_only=True)
    assert failure_of(out, w).status == 404
    assert spawns(out) == []
    b.bring_up("a")
    w = b.rid()
    assert grant_of(b.acquire(w, "a", ready_only=True), w).model == "a"


def test_a_reload_restarts_exactly_the_running_models_whose_restart_key_changed() -> None:
    b = Bench()
    b.bring_up("a")
    b.bring_up("b")  # c is not running: a change to it restarts nothing
    rid = b.rid()
    out = b.core.reload(rid, changed("b", "c"), b.tick())
    assert [(s.model, s.cause.reason) for s in stops(out)] == [("b", StopReason.RELOAD)]
    out = b.core.exited("b", 1, 0, b.tick(), expected=True)
    assert reply_to(out, rid) is None
    # The new key is now the running one's: the same catalog again restarts nothing.
    b.bring_up("b")
    rid = b.rid()
    out = b.core.reload(rid, changed("b", "c"), b.tick())
    assert stops(out) == []
    assert reply_to(out, rid) is None


def test_a_reload_restarts_a_running_model_it_drops() -> None:
    b = Bench()
    b.bring_up("a")
    out = b.core.reload(b.rid(), [ModelConfig("b"), ModelConfig("c")], b.tick())
    assert [(s.model, s.cause.reason) for s in stops(out)] == [("a", StopReason.RELOAD)]


def test_a_preset_that_restarts_at_every_reload_does() -> None:
    # upstream compares the running side without reserved options, the fresh one with
    always = RestartKey("same", always=True)
    b = Bench([ModelConfig("a", restart_key=RestartKey("same"))])
    b.bring_up("a")
    out = b.core.reload(b.rid(), [ModelConfig("a", restart_key=always)], b.tick())
    assert [s.model for s in stops(out)] == ["a"]
    b.core.exited("a", 1, 0, b.tick(), expected=True)
    b.bring_up("a")
    out = b.core.reload(b.rid(), [ModelConfig("a", restart_key=always)], b.tick())
    assert [s.model for s in stops(out)] == ["a"]  # again
    b.core.exited("a", 2, 0, b.tick(), expected=True)
    b.bring_up("a")
    out = b.core.reload(b.rid(), [ModelConfig("a", restart_key=RestartKey("same"))], b.tick())
    assert stops(out) == []  # the reserved option taken out again: as it ran
