"""GET /metrics, read with prometheus_client's own parser, after loads, evictions and crashes
of real (fake-engine) children."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from troupe_rig.router import RouterFactory

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def names(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for n, labels in samples if n == name]


async def scrape(http: httpx.AsyncClient) -> Samples:
    resp = await http.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(resp.text)


def completion(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hi", "n_predict": 3}).encode()


async def test_counters_after_loads_an_eviction_and_crashes(
    fake_router: RouterFactory, tiny_model_dir: Path
) -> None:
    presets = {
        # A real GGUF file: the fake engine does not read it, but troupe estimates its need.
        "a": {"model": str(tiny_model_dir / "tiny-a.gguf")},
        "b": {},
        "c": {"fake-load-crash": "3"},
        "d": {"fake-oom": "true"},
    }
    # The KV store off: it steers each completion to a slot (``id_slot`` added to the
    # body the child gets), and this test counts the bytes relayed to children exactly.
    async with (
        fake_router(presets, "--models-max", "1", "--kv-store", "off") as router,
        router.client() as http,
    ):
        sent = 0
        for model in ("a", "b", "c", "d", "a"):
            body = completion(model)
            resp = await http.post(
                "/completion", content=body, headers={"content-type": "application/json"}
            )
            assert resp.status_code == (200 if model in "ab" else 500), resp.text
            sent += len(body) if model in "ab" else 0
        got = await scrape(http)
        reserved = dict(router.snapshot.models["a"].memory_reserved or {})

    assert value(got, "troupe_model_loads_total", model="a", result="loaded") == 2
    assert value(got, "troupe_model_loads_total", model="b", result="loaded") == 1
    assert value(got, "troupe_model_loads_total", model="c", result="failed") == 1
    assert value(got, "troupe_model_loads_total", model="d", result="failed") == 1
    assert value(got, "troupe_model_load_duration_seconds_count", model="a") == 2
    assert value(got, "troupe_model_load_duration_seconds_count", model="c") is None
    # b's load evicted a, c's load evicted b; nothing was up when d and a loaded again.
    assert sorted(
        (d["model"], d["reason"], value(got, "troupe_model_evictions_total", **d))
        for d in names(got, "troupe_model_evictions_total")
    ) == [("a", "lru", 1), ("b", "lru", 1)]
    assert value(got, "troupe_model_crashes_total", model="c") == 1
    assert value(got, "troupe_model_crashes_total", model="d") == 1
    assert names(got, "troupe_model_oom_total") == [{"model": "d"}]
    assert value(got, "troupe_model_oom_total", model="d") == 1
    assert value(got, "troupe_proxied_requests_total", route="/completion", status="200") == 3
    assert value(got, "troupe_relayed_bytes_total", route="/completion", direction="request") == (
        sent
    )
    assert value(got, "troupe_relayed_bytes_total", route="/completion", direction="response")
    for model, outcome, count in [("a", "granted", 2), ("c", "failed", 1), ("d", "failed", 1)]:
        assert value(got, "troupe_queue_wait_seconds_count", model=model, outcome=outcome) == count
    assert value(got, "troupe_swaps_per_minute") == 2  # a and b evicted (within a minute)

    # Gauges from the snapshot: a is up again, the rest are down.
    assert value(got, "troupe_model_status", model="a", status="loaded") == 1
    assert value(got, "troupe_model_status", model="a", status="unloaded") == 0
    assert value(got, "troupe_model_status", model="c", status="unloaded") == 1
    assert value(got, "troupe_models_running") == 1
    assert value(got, "troupe_models_max") == 1
    assert value(got, "troupe_model_in_flight", model="a") == 0
    assert value(got, "troupe_queue_depth") == 0
    last = value(got, "troupe_model_last_load_seconds", model="a")
    assert last is not None
    assert last > 0
    # Memory: a's need (its GGUF estimate) before it loads; once up, admission counts what
    # it was seen to hold (the true-up); its child is read again at the scrape.
    need = value(got, "troupe_model_memory_need_bytes", model="a", device="host")
    assert need
    assert reserved["host"]
    assert (
        value(got, "troupe_model_memory_reserved_bytes", model="a", device="host")
        == (reserved["host"])
    )
    assert value(got, "troupe_memory_reserved_bytes", device="host") == reserved["host"]
    assert value(got, "troupe_model_memory_reserved_bytes", model="b", device="host") is None
    observed = value(got, "troupe_model_memory_observed_bytes", model="a", device="host")
    assert observed
    assert observed > 1 << 20  # a Python process's RSS
    total = value(got, "troupe_device_memory_total_bytes", device="host")
    free = value(got, "troupe_device_memory_free_bytes", device="host")
    assert total
    assert free
    assert 0 < free < total
    assert value(got, "troupe_memory_margin_bytes") == 1024 << 20
    assert value(got, "process_open_fds")  # troupe's own process
    # The fake engine has no --metrics: asked, but not up, and none of its series.
    assert value(got, "troupe_child_metrics_up", model="a") == 0


async def test_with_model_it_is_the_childs_and_the_key_is_needed(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--api-key", "k1") as router, router.client() as http:
        assert (await http.get("/metrics")).status_code == 401
        key = {"Authorization": "Bearer k1"}
        resp = await http.get("/metrics", params={"model": "a"}, headers=key)
        # Proxied: the fake, like llama-server without --metrics, answers 501 itself.
        assert resp.status_code == 501
        assert "--metrics" in resp.json()["error"]["message"]
        resp = await http.get("/metrics", params={"model": "nope"}, headers=key)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "model 'nope' not found"
        got = parse((await http.get("/metrics", headers=key)).text)
        # GET /metrics?model= does not count as use, but it is relayed and counted.
        assert value(got, "troupe_proxied_requests_total", route="/metrics", status="501") == 1
        assert value(got, "troupe_model_status", model="a", status="loaded") == 1
