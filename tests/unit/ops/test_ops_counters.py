"""RouterMetrics fed scheduler events by hand, with a clock the test moves; the merge of
children's metrics; the route and reason labels."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from troupe.ops.children import merge_families
from troupe.ops.metrics import RouterMetrics, eviction_reason, route_label


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def event(model: str, kind: str, **data: Any) -> dict[str, Any]:
    return {"model": model, "event": kind, "data": data}


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_load_is_timed_from_spawn_to_ready_and_a_wake_is_not_a_load() -> None:
    clock = Clock()
    m = RouterMetrics(clock=clock)
    m.on_event(event("a", "model_status", status="loading"))
    clock.now += 2.5
    m.on_event(event("a", "status_change", status="loading", progress={"value": 0.5}))
    m.on_event(event("a", "status_change", status="loaded"))
    m.on_event(event("a", "status_change", status="sleeping"))
    m.on_event(event("a", "status_change", status="loading"))  # waking up
    m.on_event(event("a", "status_change", status="loaded"))
    assert sample(m, "troupe_model_loads_total", model="a", result="loaded") == 1
    assert sample(m, "troupe_model_load_duration_seconds_sum", model="a") == 2.5
    assert sample(m, "troupe_model_load_duration_seconds_bucket", model="a", le="2.0") == 0
    assert sample(m, "troupe_model_load_duration_seconds_bucket", model="a", le="5.0") == 1


def test_exits_a_stopped_load_a_crash_and_an_oom() -> None:
    m = RouterMetrics(clock=Clock())
    m.on_event(event("a", "model_status", status="loading"))
    m.on_event(event("a", "troupe_exit", exit_code=1, expected=True, oom=False))
    m.on_event(event("b", "model_status", status="loading"))
    m.on_event(event("b", "troupe_exit", exit_code=1, expected=False, oom=True))
    m.on_event(event("c", "model_status", status="loading"))
    m.on_event(event("c", "status_change", status="loaded"))
    m.on_event(event("c", "troupe_exit", exit_code=139, expected=False, oom=False))
    m.on_event(event("c", "troupe_exit", exit_code=0, expected=True, oom=False))
    assert sample(m, "troupe_model_loads_total", model="a", result="cancelled") == 1
    assert sample(m, "troupe_model_crashes_total", model="a") is None
    assert sample(m, "troupe_model_loads_total", model="b", result="failed") == 1
    assert sample(m, "troupe_model_crashes_total", model="b") == 1
    assert sample(m, "troupe_model_oom_total", model="b") == 1
    assert sample(m, "troupe_model_crashes_total", model="c") == 1  # the later stop is not
    assert sample(m, "troupe_model_loads_total", model="c", result="failed") is None


def test_evictions_by_reason_and_odd_events_are_ignored() -> None:
    m = RouterMetrics(clock=Clock())
    for reason in ("lru for b", "ttl", "memory for c", "memory"):
        m.on_event(event("a", "troupe_evict", reason=reason))
    m.on_event({"model": "a", "event": "troupe_evict", "data": None})
    m.on_event({"event": "status_change"})
    m.on_event(event("a", "troupe_queue", waiting=1, position=1))
    assert sample(m, "troupe_model_evictions_total", model="a", reason="lru") == 1
    assert sample(m, "troupe_model_evictions_total", model="a", reason="ttl") == 1
    assert sample(m, "troupe_model_evictions_total", model="a", reason="memory") == 2
    assert sample(m, "troupe_model_evictions_total", model="a", reason="other") == 1
    assert eviction_reason("unload request") == "other"


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
