"""RouterMetrics fed scheduler events by hand, with a clock the test moves; the merge of
children's metrics; the route and reason labels."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from troupe.ops.children import merge_families
from troupe.ops.metrics import RouterMetrics, route_label
from troupe.sched import Status, StopCause, StopReason
from troupe.sched.events import (
    ChildExited,
    ModelStatusSet,
    QueueChanged,
    StatusChanged,
    StopRequested,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_load_is_timed_from_spawn_to_ready_and_a_wake_is_not_a_load() -> None:
    clock = Clock()
    m = RouterMetrics(clock=clock)
    m.on_event(ModelStatusSet("a", Status.LOADING))
    clock.now += 2.5
    m.on_event(StatusChanged("a", Status.LOADING, progress={"value": 0.5}))
    m.on_event(StatusChanged("a", Status.LOADED))
    m.on_event(StatusChanged("a", Status.SLEEPING))
    m.on_event(StatusChanged("a", Status.LOADING))  # waking up
    m.on_event(StatusChanged("a", Status.LOADED))
    assert sample(m, "troupe_model_loads_total", model="a", result="loaded") == 1
    assert sample(m, "troupe_model_load_duration_seconds_sum", model="a") == 2.5
    assert sample(m, "troupe_model_load_duration_seconds_bucket", model="a", le="2.0") == 0
    assert sample(m, "troupe_model_load_duration_seconds_bucket", model="a", le="5.0") == 1


def test_exits_a_stopped_load_a_crash_and_an_oom() -> None:
    m = RouterMetrics(clock=Clock())
    m.on_event(ModelStatusSet("a", Status.LOADING))
    m.on_event(ChildExited("a", 1, expected=True, oom=False))
    m.on_event(ModelStatusSet("b", Status.LOADING))
    m.on_event(ChildExited("b", 1, expected=False, oom=True))
    m.on_event(ModelStatusSet("c", Status.LOADING))
    m.on_event(StatusChanged("c", Status.LOADED))
    m.on_event(ChildExited("c", 139, expected=False, oom=False))
    m.on_event(ChildExited("c", 0, expected=True, oom=False))
    assert sample(m, "troupe_model_loads_total", model="a", result="cancelled") == 1
    assert sample(m, "troupe_model_crashes_total", model="a") is None
    assert sample(m, "troupe_model_loads_total", model="b", result="failed") == 1
    assert sample(m, "troupe_model_crashes_total", model="b") == 1
    assert sample(m, "troupe_model_oom_total", model="b") == 1
    assert sample(m, "troupe_model_crashes_total", model="c") == 1  # the later stop is not
    assert sample(m, "troupe_model_loads_total", model="c", result="failed") is None


def test_every_stop_is_counted_by_its_reason_and_evictions_apart() -> None:
    m = RouterMetrics(clock=Clock())
    causes = [
        StopCause(StopReason.LRU, "b"),
        StopCause(StopReason.TTL),
        StopCause(StopReason.MEMORY, "c"),
        StopCause(StopReason.MEMORY, "d"),
        StopCause(StopReason.DRAIN, "b"),
        StopCause(StopReason.UNLOAD),
        StopCause(StopReason.SHUTDOWN),
    ]
    for cause in causes:
        m.on_event(StopRequested("a", cause))
    m.on_event(QueueChanged("a", 1, 1, "loading"))  # not a counter's business
    evicted = {
        r: sample(m, "troupe_model_evictions_total", model="a", reason=r) for r in StopReason
    }
    assert evicted == {
        **dict.fromkeys(StopReason),
        StopReason.LRU: 1,
        StopReason.TTL: 1,
        StopReason.MEMORY: 2,
        StopReason.DRAIN: 1,
    }
    stopped = {r: sample(m, "troupe_model_stops_total", model="a", reason=r) for r in StopReason}
    assert stopped == {
        **dict.fromkeys(StopReason),
        StopReason.LRU: 1,
        StopReason.TTL: 1,
        StopReason.MEMORY: 2,
        StopReason.DRAIN: 1,
        StopReason.UNLOAD: 1,
        StopReason.SHUTDOWN: 1,
    }


def test_route_labels_are_bounded() -> None:
    assert route_label("/v1/chat/completions", "") == "/v1/chat/completions"
    assert route_label("/api/v1/completions", "/api") == "/v1/completions"
    assert route_label("/slots/12", "") == "/slots/:id"
    assert route_label("/v1/whatever/" + "x" * 50, "") == "other"


CHILD = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing{model="theirs"} 1
"""
OTHER = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 30
# TYPE llamacpp:requests_processing_total counter
llamacpp:requests_processing_total 4
"""


def test_children_are_merged_into_one_family_per_name_labelled_by_model() -> None:
    merged = merge_families(
        {
            "b": list(text_string_to_metric_families(OTHER)),
            "a": list(text_string_to_metric_families(CHILD)),
        }
    )

    class Registry:
        def collect(self) -> list[Any]:
            return merged

    text = generate_latest(Registry()).decode()
    assert text.count("# TYPE llamacpp:prompt_tokens_total counter") == 1
    again = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert again == {
        ("llamacpp:prompt_tokens_total", (("model", "a"),)): 12,
        ("llamacpp:prompt_tokens_total", (("model", "b"),)): 30,
        # the child's own model label is replaced; b's family of another type is left out
        ("llamacpp:requests_processing", (("model", "a"),)): 1,
    }
