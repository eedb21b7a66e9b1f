"""A request's ``keep_alive`` (the Ollama API) in the core: the child's TTL or pin, for
that child only, seen by the TTL, the eviction choice and the views like a preset's."""

from __future__ import annotations

import math

from schedcore_kit import Bench, answered, reply_to, spawns, stops

from troupe.sched import Effect, ModelConfig
from troupe.sched.reasons import StopCause, StopReason


def test_zero_unloads_once_the_last_request_ends() -> None:
    b = Bench()
    b.bring_up("a")
    lease = b.lease("a")
    b.core.keep_alive("a", b.gen["a"], 0.0, b.now)
    assert b.on_time(b.tick(100)) == []  # in flight: no TTL runs
    b.tick()
    b.release(lease)
    deadline = b.core.next_deadline()
    assert deadline == b.now  # due at once
    # Logged and shown as what it is: an unload a client asked for, not the preset's ttl.
    assert [s.cause for s in stops(b.on_time(b.now))] == [StopCause(StopReason.KEEP_ALIVE)]
    assert b.view("a").last_eviction == "unload asked by a client (keep_alive)"


def test_a_duration_is_the_idle_timeout_and_the_next_child_forgets_it() -> None:
    b = Bench([ModelConfig("a", ttl=30.0)])
    gen = b.bring_up("a")
    b.core.keep_alive("a", gen, 600.0, b.now)
    assert b.view("a").ttl == 600.0
    assert b.core.next_deadline() == b.now + 600.0
    assert [s.cause for s in stops(b.on_time(b.now + 600))] == [StopCause(StopReason.KEEP_ALIVE)]
    b.exited("a", 0)
    assert b.view("a").ttl == 30.0  # its preset's again
    b.bring_up("a")
    assert b.view("a").ttl == 30.0


def test_forever_pins_against_eviction_and_the_ttl() -> None:
    b = Bench([ModelConfig("a", ttl=5.0), "b"], models_max=1)
    gen = b.bring_up("a")
    b.core.keep_alive("a", gen, math.inf, b.now)
    view = b.view("a")
    assert (view.pin, view.ttl) == (True, None)
    assert b.core.next_deadline() is None
    w = b.rid()
    out = b.acquire(w, "b")  # no slot: a is pinned, so nothing is evicted for b
    assert stops(out) == []
    assert spawns(out) == []
    out = b.core.keep_alive("a", gen, 0.0, b.now)  # a later request says otherwise
    assert [s.model for s in stops(out)] == ["a"]  # evicted for b at once


def test_a_preset_pin_beats_a_request_and_a_stale_child_is_left_alone() -> None:
    b = Bench([ModelConfig("a", pin=True), "b", "c"])
    gen = b.bring_up("a")
    b.core.keep_alive("a", gen, 0.0, b.now)
    assert b.view("a").pin
    assert b.on_time(b.now + 1) == []
    b.bring_up("b")
    b.core.keep_alive("b", b.gen["b"] + 7, 0.0, b.now)  # not its child
    assert b.view("b").ttl is None
    b.core.keep_alive("c", None, 0.0, b.now)  # not running: nothing to do
    assert b.view("c").ttl is None
    b.bring_up("c")
    assert b.view("c").ttl is None  # a new child: nothing was kept for it


# ----- keep_alive 0 with nothing to generate: answered once the child is gone -----------------


def _unload(b: Bench, rid: int, model: str) -> list[Effect]:
    return b.core.keep_alive(model, None, 0.0, b.tick(), rid=rid, until_gone=True)


def test_keep_alive_zero_is_answered_once_the_busy_child_is_gone() -> None:
    b = Bench()
    b.bring_up("a")
    lease = b.lease("a")
    rid = b.rid()
    assert rid not in answered(_unload(b, rid, "a"))  # a request is in flight
    out = b.release(lease)
    out += b.on_time(b.now)  # its TTL (0) is due at once
    assert [s.cause for s in stops(out)] == [StopCause(StopReason.KEEP_ALIVE)]
    assert rid not in answered(out)  # told to stop, not gone yet
    out = b.core.exited("a", b.gen["a"], 0, b.tick(), expected=True)
    assert reply_to(out, rid) is None


def test_keep_alive_zero_is_answered_at_once_when_nothing_goes() -> None:
    b = Bench([ModelConfig("a", pin=True), "b"])
    b.bring_up("a")
    rid = b.rid()
    out = _unload(b, rid, "a")  # its preset pins it: it stays
    assert reply_to(out, rid) is None
    assert stops(out) == []
    rid = b.rid()
    assert reply_to(_unload(b, rid, "b"), rid) is None  # nothing runs


def test_keep_alive_zero_from_a_client_that_left_is_carried_out_and_answers_nobody() -> None:
    b = Bench()
    b.bring_up("a")
    rid = b.rid()
    out = _unload(b, rid, "a")
    assert (b.core.next_deadline() or math.inf) <= b.now  # idle: its TTL (0) is due at once
    out += b.on_time(b.now)
    assert [s.cause for s in stops(out)] == [StopCause(StopReason.KEEP_ALIVE)]
    b.release(rid)  # the client left
    out = b.core.exited("a", b.gen["a"], 0, b.tick(), expected=True)
    assert rid not in answered(out)


def test_a_plain_keep_alive_with_a_rid_is_answered_at_once() -> None:
    b = Bench()
    b.bring_up("a")
    lease = b.lease("a")
    rid = b.rid()
    out = b.core.keep_alive("a", b.gen["a"], 0.0, b.tick(), rid=rid)
    assert reply_to(out, rid) is None  # in effect: the release that follows sees it
    b.release(lease)
