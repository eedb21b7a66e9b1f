"""Measurement jobs as the core orders them: one at a time, the model about to load
first, a failure settled with the estimate, stale figures dropped on reload."""

from __future__ import annotations

from schedcore_kit import Bench, spawns

from troupe.sched import ModelConfig
from troupe.sched.effects import CancelMeasure, Effect, Measure, SampleMemory
from troupe.sched.measuring import ANSWER_WITHIN
from troupe.sched.memory import DeviceMemory, MemoryLedger, MemorySample

GIB = 1 << 30


def bench(**kw: object) -> Bench:
    configs = [ModelConfig(n, fingerprint=f"fp-{n}", need={"host": GIB}) for n in ("a", "b", "c")]
    return Bench(configs, memory=MemoryLedger(0), measure=True, **kw)  # type: ignore[arg-type]


def measures(effects: list[Effect]) -> list[Measure]:
    return [e for e in effects if isinstance(e, Measure)]


def plenty() -> MemorySample:
    return MemorySample((DeviceMemory("host", 64 * GIB, 60 * GIB),))


def test_one_job_at_a_time_and_the_model_about_to_load_goes_first() -> None:
    b = bench()
    out = b.acquire(b.rid(), "c")  # c is about to load: measured before a and b
    assert measures(b.extra) == [Measure("c", "fp-c")]
    assert spawns(out) == []  # c waits for its measurement
    b.acquire(b.rid(), "b")  # b too, but one job runs at a time
    assert measures(b.extra) == []
    out = b.core.measured("c", "fp-c", {"host": GIB // 2}, {"host": GIB}, b.tick())
    assert measures(out) == [Measure("b", "fp-b")]  # b next: it waits, a does not
    assert b.view("c").memory_source == "engine"
    assert b.view("c").memory_need == {"host": GIB // 2}
    assert b.view("c").memory_high == {"host": GIB}
    sample = [e for e in out if isinstance(e, SampleMemory)]
    assert sample  # c is admitted against a fresh reading of memory
    out = b._seen(b.core.memory_sampled(plenty(), sample[0].version, b.tick()))
    assert [s.model for s in spawns(out)] == ["c"]
    out = b.core.measured("b", "fp-b", {"host": GIB}, None, b.tick())
    assert measures(out) == [Measure("a", "fp-a")]


def test_a_failed_measurement_falls_back_to_the_estimate_and_is_tried_after_a_load() -> None:
    b = bench()
    w = b.rid()
    b.acquire(w, "a")
    out = b.core.measure_failed("a", "fp-a", "the engine printed no projection", b.tick())
    assert b.view("a").memory_source == "estimate"
    sample = next(e for e in out if isinstance(e, SampleMemory))
    out = b._seen(b.core.memory_sampled(plenty(), sample.version, b.tick()))
    assert [s.model for s in spawns(out)] == ["a"]
    b.spawned("a")
    b.ready("a")
    assert "a" in b.core.measure.todo  # type: ignore[union-attr]  # tried once more


def test_a_stale_result_is_ignored_and_a_changed_model_is_measured_again() -> None:
    b = bench()
    b.acquire(b.rid(), "b")  # the first job: b
    assert b.core.measured("a", "fp-old", {"host": 9 * GIB}, None, b.tick()) is not None
    assert b.view("a").memory_need == {"host": GIB}  # not the stale figure
    b.core.measured("a", "fp-a", {"host": 2 * GIB}, None, b.tick())  # not a's turn: ignored
    assert b.view("a").memory_source == "estimate"
    changed = [ModelConfig("a", fingerprint="fp-a2", need={"host": GIB}), ModelConfig("c")]
    out = b.core.reload(b.rid(), changed, b.tick())
    assert CancelMeasure("b") in out  # b left the catalog while measured
    assert b.view("a").memory_source == "estimate"  # its old projection does not hold
    assert b.core.measure.pending("a")  # type: ignore[union-attr]


def test_projections_start_when_the_scheduler_starts_not_at_the_first_request() -> None:
    b = bench()
    out = b.core.start(b.tick())
    assert measures(out) == [Measure("a", "fp-a")]  # in name order, one at a time
    out = b.core.measured("a", "fp-a", {"host": GIB}, None, b.tick())
    assert measures(out) == [Measure("b", "fp-b")]
    b.acquire(b.rid(), "c")  # c now waits on the job under way, then goes next
    out = b.core.measured("b", "fp-b", {"host": GIB}, None, b.tick())
    assert measures(out) == [Measure("c", "fp-c")]


def test_a_job_that_never_answers_is_given_up_and_the_load_goes_on_with_the_estimate() -> None:
    # Its engine's own limit (60 s) runs from the process's start: a spawn that never
    # returns would hold the loads waiting for it for ever.
    b = bench()
    b.acquire(b.rid(), "a")
    assert measures(b.extra) == [Measure("a", "fp-a")]
    started = b.now
    assert b.core.next_deadline() == started + ANSWER_WITHIN
    out = b.core.on_time(started + ANSWER_WITHIN - 1)
    assert spawns(out) == []  # not yet
    assert CancelMeasure("a") not in out
    out = b.core.on_time(started + ANSWER_WITHIN)
    assert CancelMeasure("a") in out
    assert measures(out) == [Measure("b", "fp-b")]  # the next job
    assert b.view("a").memory_source == "estimate"
    sample = next(e for e in out if isinstance(e, SampleMemory))
    out = b._seen(b.core.memory_sampled(plenty(), sample.version, b.tick()))
    assert [s.model for s in spawns(out)] == ["a"]
    # Its answer, should it come after all, is stale.
    b.core.measured("a", "fp-a", {"host": 9 * GIB}, None, b.tick())
    assert b.view("a").memory_need == {"host": GIB}
