"""The out-of-memory retry (troupe's own): a load that dies of OOM while idle models are
resident evicts them and is tried once more. The retry must obey everything else a
spawn obeys: shutdown, reloads, and one child per model."""

from __future__ import annotations

from schedcore_kit import Bench, answered, reply_to, spawns, stops

from troupe.sched import ModelConfig, RestartKey, Spawn, Stop
from troupe.sched.effects import Reloaded
from troupe.sched.reasons import StopCause, StopReason


def _oom_while_b_idle(b: Bench) -> int:
    """b is up and idle; a request for a loads it and a dies of OOM: b is evicted."""
    b.bring_up("b")
    w = b.rid()
    b.acquire(w, "a")
    b.spawned("a")
    out = b._seen(b.core.exited("a", b.gen["a"], 1, b.tick(), expected=False, oom=True))
    assert stops(out) == [
        Stop("b", 1, kill=False, cause=StopCause(StopReason.MEMORY, "a"), save_slots=True)
    ]
    assert w not in answered(out)  # it waits for the second try
    return w


def test_oom_retry_spawns_again_once_the_evictions_are_done() -> None:
    b = Bench(["a", "b"])
    w = _oom_while_b_idle(b)
    out = b.exited("b", 0)
    assert spawns(out) == [Spawn("a", 2, 0.0)]
    b.spawned("a")
    assert reply_to(b.ready("a"), w) is not None


def test_oom_retry_never_spawns_during_shutdown() -> None:
    b = Bench(["a", "b"])
    _oom_while_b_idle(b)
    done = b.rid()
    b.stop_all(done)
    out = b.exited("b", 0)
    assert spawns(out) == []
    assert reply_to(out, done) is None  # nothing runs: shutdown is complete


def test_oom_retry_waits_for_a_reload_to_finish() -> None:
    b = Bench(["a", "b"])
    _oom_while_b_idle(b)
    rid = b.rid()
    configs = [ModelConfig("a"), ModelConfig("b", restart_key=RestartKey("b changed"))]
    assert spawns(b._seen(b.core.reload(rid, configs, b.tick()))) == []
    out = b.core.exited("b", b.gen["b"], 0, b.tick(), expected=True)
    # The reload waited for b; only then, with the new catalog in, is a tried again.
    assert [e for e in out if isinstance(e, Reloaded | Spawn)] == [
        Reloaded(rid, (rid,)),
        Spawn("a", 2, 0.0),
    ]


def test_oom_retry_does_not_start_a_second_child_after_an_explicit_load() -> None:
    b = Bench(["a", "b"])
    _oom_while_b_idle(b)
    rid = b.rid()
    out = b.load(rid, "a")  # POST /models/load while the retry waits for b
    assert reply_to(out, rid) is None
    assert spawns(out) == [Spawn("a", 2, 0.0)]
    out = b.exited("b", 0)
    assert spawns(out) == []  # a already has a child (gen 2); a gen 3 would orphan it
