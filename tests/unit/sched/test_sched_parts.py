"""The core's parts, each alone: the lifecycle table, crash holds, fair admission's clock,
memory admission's verdict, catalog changes, queue reports, stop causes, wire shapes."""

from __future__ import annotations

import pytest

from troupe.sched import Phase, Status, StopCause, StopReason
from troupe.sched.admission import Admit, Evict, MemoryAdmission, Wait
from troupe.sched.children import CrashRecord, lift_hold
from troupe.sched.drain import SWAP_WINDOW, DrainClock
from troupe.sched.effects import Emit, SampleMemory
from troupe.sched.events import QueueChanged, StatusChanged, StopRequested
from troupe.sched.memory import DeviceMemory, MemoryLedger, MemorySample
from troupe.sched.outbox import Outbox
from troupe.sched.phase import RESTARTS, TRANSITIONS, IllegalTransition, Restart
from troupe.sched.queue import AdmissionQueue
from troupe.sched.reloads import CatalogChanges
from troupe.sched.table import ModelConfig, ModelState, ModelTable
from troupe.sched.views import QueueReporter, shown_phase, status_of

MiB = 1 << 20

# ----- the lifecycle ---------------------------------------------------------------------


def test_every_phase_has_its_moves_and_is_reachable_from_unloaded() -> None:
    assert set(TRANSITIONS) == set(Phase)
    seen, todo = {Phase.UNLOADED}, [Phase.UNLOADED]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(Phase)


def test_every_phase_with_a_child_can_end_and_every_phase_can_come_back_to_rest() -> None:
    for phase in Phase:
        if phase.is_running:
            assert {Phase.UNLOADED, Phase.HELD} <= TRANSITIONS[phase], phase
    assert Phase.UNLOADED in TRANSITIONS[Phase.HELD]
    for restart, sources in RESTARTS.items():
        assert sources, restart
        assert all(p.is_running for p in sources), restart


def test_the_lifecycle_stays_small_what_else_is_known_is_data() -> None:
    """Issue 31: a failure, a spawn's delay, a pending restart and a stop before the
    process started are data beside the phase, not phases of their own."""
    assert len(Phase) <= 9, [p.name for p in Phase]


def test_a_pending_restart_is_set_by_a_move_from_where_it_may_come_and_called_off_by_any() -> None:
    table = ModelTable([ModelConfig("a")])
    m = table.models["a"]
    m.move(Phase.STARTING)
    m.move(Phase.LOADING)
    with pytest.raises(IllegalTransition, match=r"LOADING -> UNLOADED \(REPLAN\)"):
        m.move(Phase.UNLOADED, Restart.REPLAN)  # only a stop for a narrower lane re-plans
    with pytest.raises(IllegalTransition, match=r"LOADING -> HELD \(OOM\)"):
        m.move(Phase.HELD, Restart.OOM)  # a restart is pending only without a child
    assert (m.phase, m.restart) == (Phase.LOADING, None)
    m.move(Phase.UNLOADED, Restart.OOM)  # died of OOM while loading
    assert (m.phase, m.restart, table.pending(Restart.OOM)) == (Phase.UNLOADED, Restart.OOM, True)
    assert not table.in_phase(Phase.LOADING)
    assert table.in_phase(Phase.UNLOADED)
    m.move(Phase.UNLOADED)  # called off (an unload, a shutdown)
    assert (m.restart, table.pending(Restart.OOM)) == (None, False)
    m.move(Phase.STARTING)
    m.move(Phase.STOPPING)
    m.move(Phase.UNLOADED, Restart.REPLAN)
    assert table.pending(Restart.REPLAN)
    m.move(Phase.STARTING)  # the restart is under way: no longer pending
    assert (m.restart, table.pending(Restart.REPLAN)) == (None, False)


def test_an_illegal_move_raises_and_leaves_the_phase_as_it_was() -> None:
    m = ModelState(ModelConfig("a"))
    with pytest.raises(IllegalTransition, match="UNLOADED -> LOADED"):
        m.move(Phase.LOADED)  # a child must be started first
    assert m.phase is Phase.UNLOADED
    m.move(Phase.STARTING)
    m.move(Phase.LOADING)
    m.move(Phase.LOADED)
    m.move(Phase.STOPPING)
    with pytest.raises(IllegalTransition):
        m.move(Phase.LOADED)  # a stopping child never serves again
    with pytest.raises(IllegalTransition):
        m.move(Phase.STARTING)  # nor is it spawned again before it is gone
    m.move(Phase.UNLOADED)


def test_the_status_readers_see_is_derived_and_a_stopping_child_shows_what_it_was() -> None:
    def state(phase: Phase, **data: object) -> ModelState:
        return ModelState(ModelConfig("a"), phase=phase, **data)  # type: ignore[arg-type]

    starting = state(Phase.STARTING, reported=Phase.LOADING, spawn_pending=True)
    assert (status_of(starting), shown_phase(starting)) == (Status.LOADING, "starting")
    delayed = state(Phase.STARTING, spawn_pending=True, delay_until=2.0)
    assert (status_of(delayed), shown_phase(delayed)) == (Status.UNLOADED, "delayed")
    aborting = state(Phase.STOPPING, spawn_pending=True, delay_until=2.0)
    assert (status_of(aborting), shown_phase(aborting)) == (Status.UNLOADED, "aborting")
    held = state(Phase.HELD, exit_code=1, held_until=5.0)
    assert (status_of(held), shown_phase(held)) == (Status.UNLOADED, "held")
    for data, word in [
        ({}, "unloaded"),
        ({"exit_code": 1}, "failed"),
        ({"exit_code": 1, "restart": Restart.OOM}, "retrying"),
        ({"restart": Restart.REPLAN}, "replanning"),
    ]:
        m = state(Phase.UNLOADED, **data)
        assert (status_of(m), shown_phase(m)) == (Status.UNLOADED, word)
    for reported, status in [
        (Phase.LOADING, Status.LOADING),
        (Phase.LOADED, Status.LOADED),
        (Phase.SLEEPING, Status.SLEEPING),
    ]:
        assert status_of(state(reported, reported=reported)) is status
        for phase in (Phase.DRAINING, Phase.STOPPING):
            assert status_of(state(phase, reported=reported)) is status
            assert shown_phase(state(phase, reported=reported)) == phase.value
    assert [p for p in Phase if p.serves] == [Phase.LOADED, Phase.SLEEPING]
    assert [p for p in Phase if p.is_stopping] == [Phase.STOPPING]
    running = {p for p in Phase if p.is_running}
    assert running == set(Phase) - {Phase.UNLOADED, Phase.HELD}


def test_the_table_forgets_a_retiring_model_for_requests_and_never_repeats_a_generation() -> None:
    table = ModelTable([ModelConfig("a"), ModelConfig("b")])
    a = table.models["a"]
    a.gen = table.next_gen(a)
    table.retire("a")
    assert table.known("a") is None
    assert table.get("a") is a  # kept until its child is gone
    table.drop("a")
    again = table.add(ModelConfig("a"))  # a reload brings it back
    assert table.next_gen(again) == 2  # a stale event from generation 1 cannot match
    assert table.known("a") is again


# ----- crash holds -------------------------------------------------------------------------


def test_crashes_within_the_window_hold_a_model_back_until_the_oldest_leaves_it() -> None:
    record = CrashRecord(limit=3, window=60.0)
    m = ModelState(ModelConfig("a"), exit_code=1)
    assert not record.crashed(m, 10.0)
    assert not record.crashed(m, 80.0)  # the first left the window
    assert not record.crashed(m, 90.0)
    assert record.crashed(m, 100.0)
    assert m.held_until == 80.0 + 60.0
    m.phase = Phase.HELD
    assert record.held_back(m, 139.0)
    assert "crashed 3 times in 60 s and is held back for 1 s more" in record.message(m, 139.0)
    assert not record.held_back(m, 140.0)
    assert (m.phase, m.held_until, m.failed) == (Phase.UNLOADED, None, True)  # still failed


def test_lifting_a_hold_of_a_clean_exit_leaves_the_model_unloaded() -> None:
    m = ModelState(ModelConfig("a"), phase=Phase.HELD, held_until=5.0)
    lift_hold(m)
    assert (m.phase, m.held_until) == (Phase.UNLOADED, None)


# ----- fair admission's clock ----------------------------------------------------------------


def test_the_drain_clock_starts_when_the_queue_starves_and_a_futile_drain_stops_it() -> None:
    clock = DrainClock(drain_after=2.0)
    assert clock.fair
    assert clock.demand_now(7.0) == 7.0
    clock.observe(1.0, starving=True, quiet=True)
    clock.observe(2.0, starving=True, quiet=True)  # still since 1.0
    assert clock.deadline() == 3.0
    assert not clock.due(2.9)
    assert clock.due(3.0)
    clock.drained(found=False)  # only pinned models hold the slots
    clock.observe(4.0, starving=True, quiet=True)
    assert clock.deadline() is None  # no timer again...
    clock.lease_taken()  # ...until a model newly busy may be one a drain can take
    clock.observe(5.0, starving=True, quiet=True)
    assert clock.deadline() == 7.0
    clock.observe(6.0, starving=True, quiet=False)  # a reload, a shutdown, a drain under way
    assert clock.deadline() is None


def test_without_drain_after_it_is_upstream_recency_and_no_timer() -> None:
    clock = DrainClock(drain_after=None)
    assert not clock.fair
    assert clock.demand_now(7.0) is None
    clock.observe(1.0, starving=True, quiet=True)
    assert clock.deadline() is None


def test_swaps_are_counted_over_the_last_minute() -> None:
    clock = DrainClock(drain_after=1.0)
    for t in (0.0, 10.0, 30.0):
        clock.swapped(t)
    assert clock.recent_swaps(SWAP_WINDOW + 5.0) == (10.0, 30.0)


# ----- memory admission ------------------------------------------------------------------------


def reading(free: int) -> MemorySample:
    return MemorySample((DeviceMemory("host", 1000 * MiB, free),))


def admission(needs: dict[str, int | None], margin: int = 0) -> MemoryAdmission:
    ledger = MemoryLedger(margin)
    for name, need in needs.items():
        ledger.set_estimate(name, None if need is None else {"host": need})
    return MemoryAdmission(ledger)


def test_an_unknown_need_loads_without_the_check() -> None:
    memory = admission({"a": None})
    assert memory.verdict("a", {}, stopping=False, victim=lambda _on: None) == (Admit(), False)


def test_without_a_reading_the_load_waits_for_one_and_one_is_asked_at_a_time() -> None:
    memory = admission({"a": 100 * MiB})
    assert memory.verdict("a", {}, stopping=False, victim=lambda _on: None) == (Wait(), True)
    first = memory.ask((4, 5))
    assert first == SampleMemory((4, 5), 0)
    assert memory.ask((4, 5)) is None  # one under way already
    memory.took(reading(500 * MiB), first.version, [])
    assert memory.fresh()
    assert memory.verdict("a", {}, stopping=False, victim=lambda _on: None) == (Admit(), False)


def test_a_reading_that_failed_lets_the_load_go_on_and_says_so() -> None:
    memory = admission({"a": 100 * MiB})
    effect = memory.ask(())
    assert effect is not None
    memory.could_not_read(effect.version)
    verdict, read = memory.verdict("a", {}, stopping=False, victim=lambda _on: None)
    assert verdict == Admit("loading without the memory check: memory could not be read")
    assert not read


def test_a_reading_from_before_an_exit_still_admits_what_fitted_then() -> None:
    memory = admission({"a": 100 * MiB})
    memory.took(reading(500 * MiB), 0, [])
    memory.changed(released=True)  # a child exited since: memory only came back
    assert not memory.fresh()
    assert memory.conservative()
    assert memory.verdict("a", {}, stopping=False, victim=lambda _on: None) == (Admit(), False)
    memory.changed()  # a child started since: the reading no longer says enough
    assert memory.verdict("a", {}, stopping=False, victim=lambda _on: None) == (Wait(), True)


def test_a_model_that_does_not_fit_evicts_one_idle_model_at_a_time() -> None:
    memory = admission({"a": 300 * MiB, "b": 400 * MiB}, margin=50 * MiB)
    memory.took(reading(200 * MiB), 0, [])
    holders = {"b": 0}
    verdict = memory.verdict("a", holders, stopping=False, victim=lambda _on: "b")
    assert verdict == (Evict("b"), False)
    assert memory.verdict("a", holders, stopping=True, victim=lambda _on: "b") == (Wait(), False)
    # Busy or pinned models hold it: wait for one to go idle.
    assert memory.verdict("a", holders, stopping=False, victim=lambda _on: None) == (Wait(), False)


def test_a_model_alone_that_does_not_fit_loads_anyway_and_says_by_how_much() -> None:
    memory = admission({"a": 300 * MiB}, margin=50 * MiB)
    memory.took(reading(200 * MiB), 0, [])
    verdict, _ = memory.verdict("a", {}, stopping=False, victim=lambda _on: None)
    assert verdict == Admit("loading without enough memory (host: 150 MiB short)")


def test_a_true_up_reading_is_due_a_moment_after_a_child_came_up() -> None:
    memory = admission({"a": 100 * MiB})
    memory.changed()
    memory.came_up(10.0)
    assert memory.deadline() == 10.5
    assert not memory.true_up_due(10.4)
    assert memory.true_up_due(10.5)
    assert memory.deadline() is None


# ----- the rest ----------------------------------------------------------------------------


def test_a_reload_asked_for_during_one_is_folded_into_it_and_the_later_catalog_wins() -> None:
    changes = CatalogChanges()
    first = changes.fold(1, ["a"], [ModelConfig("a")])
    later = changes.fold(2, ["b"], [ModelConfig("b")])
    assert later is first
    assert (later.rid, later.rids, later.restart) == (2, [1, 2], {"a", "b"})
    assert later.models == (ModelConfig("b"),)
    assert changes.reloading


def test_queue_reports_only_say_what_changed() -> None:
    queue = AdmissionQueue()
    reporter, out = QueueReporter(), Outbox()
    queue.join("a").reason = "waiting for memory"
    reporter.report(queue, out)
    reporter.report(queue, out)  # nothing changed: nothing said
    queue.join("a").reason = "waiting for memory"  # the same reason recorded again
    reporter.report(queue, out)
    queue.leave("a")
    reporter.report(queue, out)  # one waiter fewer
    queue.leave("a")
    reporter.report(queue, out)
    assert [e.event for e in out.take() if isinstance(e, Emit)] == [
        QueueChanged("a", 1, 1, "waiting for memory"),
        QueueChanged("a", 2, 1, "waiting for memory"),
        QueueChanged("a", 1, 1, "waiting for memory"),
        QueueChanged("a", 0, None, None),
    ]


def test_a_stop_cause_in_words_and_on_the_wire() -> None:
    assert StopCause(StopReason.LRU, "b").describe() == "lru for b"
    assert StopCause(StopReason.DRAIN, "c").describe() == "drain for c"
    assert str(StopCause(StopReason.UNLOAD)) == "unload request"
    assert {r for r in StopReason if r.is_eviction} == {"lru", "memory", "drain", "ttl", "replan"}
    assert StopCause(StopReason.REPLAN, "b").describe() == "replan for b"
    assert {r for r in StopReason if r.is_swap} == {"lru", "memory", "drain"}
    evicted = StopRequested("a", StopCause(StopReason.TTL)).to_json()
    assert evicted == {
        "model": "a",
        "event": "troupe_evict",
        "data": {"reason": "ttl", "kind": "ttl"},
    }
    stopped = StopRequested("a", StopCause(StopReason.SHUTDOWN)).to_json()
    assert stopped["event"] == "troupe_stop"
    assert StatusChanged("a", Status.LOADING, progress={}).to_json()["data"] == {
        "status": "loading",
        "progress": {},  # an empty payload is still the child's
    }
