"""The budgets' pure accountant (`troupe.tenants.budget`): token buckets per minute, the
UTC day's budget, reservations taken in one step and settled from the engine's counts,
Retry-After, the x-ratelimit-* headers, and the counters' JSON across a restart."""

from __future__ import annotations

import pytest

from troupe.tenants.budget import (
    DAY,
    Admitted,
    Budgets,
    Cost,
    Refusal,
    estimate,
    rate_headers,
)
from troupe.tenants.model import Limits

T0 = 1_700_000_000.0  # some wall-clock second (2023-11-14T22:13:20Z)


def test_fifty_at_once_never_admit_beyond_the_minutes_tokens() -> None:
    budgets, limits = Budgets(), Limits(tokens_per_minute=1000)
    verdicts = [budgets.admit("a", limits, Cost(20, 10), T0) for _ in range(50)]
    admitted = [v for v in verdicts if isinstance(v, Admitted)]
    assert len(admitted) == 33  # 33 * 30 = 990 <= 1000 < 34 * 30
    assert sum(v.reservation.tokens for v in admitted) <= 1000
    refused = [v for v in verdicts if isinstance(v, Refusal)]
    assert {r.reason for r in refused} == {"tokens_per_minute"}
    # 10 tokens left, 30 needed, refilled at 1000/60 per second: 1.2 s.
    assert refused[0].retry_after == pytest.approx(1.2)
    assert (refused[0].type, refused[0].code) == ("tokens", "rate_limit_exceeded")


def test_requests_per_minute_refill_continuously() -> None:
    budgets, limits = Budgets(), Limits(requests_per_minute=2)
    assert isinstance(budgets.admit("a", limits, None, T0), Admitted)
    assert isinstance(budgets.admit("a", limits, None, T0), Admitted)
    refused = budgets.admit("a", limits, None, T0)
    assert isinstance(refused, Refusal)
    assert refused.reason == "requests_per_minute"
    assert refused.retry_after == pytest.approx(30.0)
    assert isinstance(budgets.admit("a", limits, None, T0 + 29.9), Refusal)
    assert isinstance(budgets.admit("a", limits, None, T0 + 30.0), Admitted)
    # Another tenant has its own buckets.
    assert isinstance(budgets.admit("b", limits, None, T0), Admitted)


def test_settling_gives_back_what_the_engine_did_not_use() -> None:
    budgets, limits = Budgets(), Limits(tokens_per_minute=100, tokens_per_day=1000)
    first = budgets.admit("a", limits, Cost(40, 60), T0)
    assert isinstance(first, Admitted)
    assert first.quota.remaining_tokens == 0
    assert isinstance(budgets.admit("a", limits, Cost(1, 1), T0), Refusal)
    budgets.settle(first.reservation, 30, limits, T0)
    quota = budgets.quota("a", limits, T0)
    assert (quota.remaining_tokens, quota.remaining_day) == (70, 970)
    # Unknown usage (a cut stream): the reservation stays charged.
    second = budgets.admit("a", limits, Cost(30, 40), T0)
    assert isinstance(second, Admitted)
    budgets.settle(second.reservation, None, limits, T0)
    assert budgets.quota("a", limits, T0).remaining_day == 900
    # More than reserved: charged, the bucket goes below zero and the next waits.
    third = budgets.admit("a", limits, Cost(0, 1), T0 + 60)
    assert isinstance(third, Admitted)
    budgets.settle(third.reservation, 150, limits, T0 + 60)
    refused = budgets.admit("a", limits, Cost(0, 1), T0 + 60)
    assert isinstance(refused, Refusal)
    assert refused.retry_after == pytest.approx(51 * 0.6)


def test_the_daily_budget_ends_at_utc_midnight() -> None:
    day_start = (T0 // DAY) * DAY
    budgets, limits = Budgets(), Limits(tokens_per_day=100)
    now = day_start + 3600
    admitted = budgets.admit("a", limits, Cost(50, 30), now)
    assert isinstance(admitted, Admitted)
    # Reserved by a request in flight: a short wait, the SDK may retry.
    in_flight = budgets.admit("a", limits, Cost(10, 20), now)
    assert isinstance(in_flight, Refusal)
    assert in_flight.reason == "in_flight"
    assert in_flight.retry
    budgets.settle(admitted.reservation, 80, limits, now)
    spent = budgets.admit("a", limits, Cost(10, 20), now)
    assert isinstance(spent, Refusal)
    assert spent.reason == "tokens_per_day"
    assert (spent.type, spent.code, spent.retry) == (
        "insufficient_quota",
        "insufficient_quota",
        False,
    )
    assert spent.retry_after == pytest.approx(DAY - 3600)
    assert isinstance(budgets.admit("a", limits, Cost(10, 20), day_start + DAY), Admitted)


def test_a_request_larger_than_a_minute_is_refused_for_good() -> None:
    refused = Budgets().admit("a", Limits(tokens_per_minute=100), Cost(50, 51), T0)
    assert isinstance(refused, Refusal)
    assert refused.reason == "too_large"
    assert not refused.retry


def test_counters_survive_a_restart_and_in_flight_counts_as_used() -> None:
    limits = Limits(requests_per_minute=10, tokens_per_minute=100, tokens_per_day=500)
    budgets = Budgets()
    done = budgets.admit("a", limits, Cost(20, 20), T0)
    assert isinstance(done, Admitted)
    budgets.settle(done.reservation, 25, limits, T0)
    assert isinstance(budgets.admit("a", limits, Cost(20, 20), T0), Admitted)  # in flight
    again = Budgets.from_json(budgets.to_json())
    quota = again.quota("a", limits, T0)
    assert (quota.remaining_requests, quota.remaining_tokens) == (8, 35)
    assert quota.remaining_day == 500 - 25 - 40
    # A broken entry is a fresh start for that tenant only.
    assert (
        Budgets.from_json({"x": {"day": "?"}, "a": budgets.to_json()["a"]})
        .quota("x", limits, T0)
        .remaining_day
        == 500
    )


def test_a_reload_that_lowers_a_limit_caps_the_bucket() -> None:
    budgets = Budgets()
    assert isinstance(budgets.admit("a", Limits(requests_per_minute=100), None, T0), Admitted)
    quota = budgets.quota("a", Limits(requests_per_minute=5), T0 + 1)
    assert quota.remaining_requests == 5


def test_the_cost_estimate_reads_the_bound_fields_of_every_api() -> None:
    body = b'{"model":"m","prompt":"hello","max_tokens":16}'
    assert estimate(body, 1024) == Cost(-(-len(body) // 4) + 8, 16)
    ollama = b'{"model":"m","messages":[{"role":"user","content":"x"}],"options":{"num_predict":7}}'
    assert estimate(ollama, 1024).completion == 7
    assert estimate(ollama, 1024).prompt == -(-len(ollama) // 4) + 16
    assert estimate(b'{"n_predict": -1}', 300).completion == 300  # -1: the class default
    assert estimate(b'{"max_completion_tokens": 5, "n": 3}', 300).completion == 15
    assert estimate(b'{"prompt":"\\"max_tokens\\": 1"}', 300).completion == 300  # in a string
    assert estimate(b'{"max_tokens": 1, "x": {"max_tokens": 90}}', 300).completion == 90


def test_rate_headers_are_openais() -> None:
    budgets = Budgets()
    limits = Limits(requests_per_minute=60, tokens_per_minute=6000, tokens_per_day=10)
    admitted = budgets.admit("a", limits, Cost(2, 3), T0)
    assert isinstance(admitted, Admitted)
    headers = dict(rate_headers(admitted.quota))
    assert headers[b"x-ratelimit-limit-requests"] == b"60"
    assert headers[b"x-ratelimit-remaining-requests"] == b"59"
    assert headers[b"x-ratelimit-reset-requests"] == b"1s"
    assert headers[b"x-ratelimit-limit-tokens"] == b"6000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"5995"
    assert headers[b"x-ratelimit-reset-tokens"] == b"50ms"
    assert headers[b"x-ratelimit-remaining-tokens-day"] == b"5"
    assert rate_headers(Budgets().quota("b", Limits(), T0)) == []
