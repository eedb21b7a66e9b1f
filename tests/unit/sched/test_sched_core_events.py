"""SSE `Emit`s: upstream's event names and data shapes (``/models/sse``)."""

from __future__ import annotations

from schedcore_kit import Bench, Sse, emits

PROGRESS = {"stages": ["text_model"], "current": "text_model", "value": 0.25}
INFO = {"id": "a", "object": "model", "owned_by": "llamacpp"}


def test_spawn_emits_model_status_loading_once() -> None:
    # Upstream emits it in load(), as it spawns; the core may do so with the Spawn or
    # when the child is up, but once, and before any status_change.
    b = Bench()
    out = b.acquire(b.rid(), "a") + b.spawned("a")
    assert emits(out) == [Sse("a", "model_status", {"status": "loading"})]


def test_loading_payload_is_sent_as_progress() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    b.spawned("a")
    assert emits(b.state("a", "loading", PROGRESS)) == [
        Sse("a", "status_change", {"status": "loading", "progress": PROGRESS})
    ]
    assert b.view("a").progress == PROGRESS


def test_loading_without_payload_has_no_progress() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    b.spawned("a")
    assert emits(b.state("a", "loading", None)) == [
        Sse("a", "status_change", {"status": "loading"})
    ]


def test_ready_with_a_payload_carries_info() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    b.spawned("a")
    assert emits(b.state("a", "ready", INFO)) == [
        Sse("a", "status_change", {"status": "loaded", "info": INFO})
    ]
    assert b.view("a").loaded_info == INFO


def test_ready_after_a_wake_has_no_info_and_keeps_the_old_one() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    b.spawned("a")
    b.state("a", "ready", INFO)
    assert emits(b.state("a", "sleeping", {})) == [
        Sse("a", "status_change", {"status": "sleeping"})
    ]
    assert emits(b.state("a", "loading", PROGRESS)) == [
        Sse("a", "status_change", {"status": "loading", "progress": PROGRESS})
    ]
    for payload in ({}, None):
        assert emits(b.state("a", "ready", payload)) == [
            Sse("a", "status_change", {"status": "loaded"})
        ]
    assert b.view("a").loaded_info == INFO


def test_exit_emits_unloaded_with_its_exit_code() -> None:
    b = Bench()
    b.bring_up("a")
    assert emits(b.exited("a", 1, expected=False)) == [
        Sse("a", "status_change", {"status": "unloaded", "exit_code": 1})
    ]
    b.bring_up("a")
    assert emits(b.exited("a", 0)) == [
        Sse("a", "status_change", {"status": "unloaded", "exit_code": 0})
    ]


def test_exit_code_appears_only_with_unloaded() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    out = b.spawned("a")
    out += b.state("a", "loading", PROGRESS)
    out += b.state("a", "ready", INFO)
    out += b.state("a", "sleeping", {})
    out += b.exited("a", 0)
    for e in emits(out):
        assert e.data is not None
        assert ("exit_code" in e.data) == (e.data["status"] == "unloaded")
        assert ("progress" in e.data) <= (e.data["status"] == "loading")
        assert ("info" in e.data) <= (e.data["status"] == "loaded")


def test_spawn_that_never_started_reads_as_a_failed_load() -> None:
    # Upstream's spawn is synchronous: a failure is a 500 to load()'s caller and no event.
    # Here the child is started after the answer, so whatever SSE said must be closed:
    # a "loading" is followed by "unloaded" with the exit code, and the model is failed.
    b = Bench()
    out = b.acquire(b.rid(), "a")
    out += b.exited("a", 1, expected=False)
    said = emits(out)
    if said:
        assert said == [
            Sse("a", "model_status", {"status": "loading"}),
            Sse("a", "status_change", {"status": "unloaded", "exit_code": 1}),
        ]
    assert b.view("a").failed


def test_unknown_child_state_is_ignored() -> None:
    b = Bench()
    b.acquire(b.rid(), "a")
    b.spawned("a")
    assert b.state("a", "dancing", {}) == []


def test_emits_carry_the_model_name() -> None:
    b = Bench()
    b.acquire(b.rid(), "b")
    out = b.spawned("b") + b.ready("b") + b.exited("b", 0)
    assert {e.model for e in emits(out)} == {"b"}
