"""Each tenant's rate limits and token budget: the pure accountant (no Trio, no I/O).

Per tenant (its `Limits`): requests per minute, tokens per minute, tokens per UTC day.
``max_parallel`` is the scheduler core's (fair queuing), not counted here.

**Windows: token buckets.** Each per-minute limit is a bucket holding up to the limit,
refilled continuously at limit/60 per second, so a tenant idle for a minute may send a
burst of the whole limit, and after that one request every 60/limit seconds. Why a
bucket and not a sliding log: its state is two numbers (level, when), so the check is
O(1) and the counters persist in a few bytes; it has no edge where a fixed window lets
twice the limit through; ``Retry-After`` is exact ((need - level) / rate); and it is
what OpenAI's own ``x-ratelimit-reset-*`` headers describe (the time until the bucket
is full again). The daily budget is a plain counter per UTC day (day number =
epoch seconds // 86400).

**Tokens are reserved at admission and settled at the answer's end.** A request's cost
is estimated from its body (`estimate`): the most it may generate (``max_tokens``,
``max_completion_tokens``, ``n_predict``, Ollama's ``num_predict``; else the class's
``default_max_tokens``; times ``n``) plus its prompt, taken as a quarter of the body's
bytes plus a few tokens per message for the chat template (cheap, and for most text at
or above what a tokenizer counts: the JSON around the prompt is counted too). `admit`
checks and takes the reservation in one call, with no await around it (the HTTP edge
runs in one Trio thread), so 50 concurrent requests of one tenant cannot admit beyond
its budget. `settle` replaces the reservation with what the engine counted (its
``usage``/``timings``); when the answer gave no count (a cut stream) the reservation
stays charged. Where the engine counts more than was reserved (a prompt denser than
the estimate, a request with no ``max_tokens`` that generates past the class default),
the difference is charged at settlement: the bucket goes below zero and the next
admission waits for it.

The clock is passed in: wall-clock seconds (``time.time()``), since the buckets and the
day survive a restart (`Budgets.to_json`, `Budgets.from_json`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from troupe.tenants.model import Limits

__all__ = [
    "DAY",
    "MINUTE",
    "Admitted",
    "Budgets",
    "Cost",
    "Quota",
    "Refusal",
    "Reservation",
    "counts_tokens",
    "estimate",
    "limited",
    "rate_headers",
]

MINUTE = 60.0
DAY = 86_400

# The fields that bound what a request generates, in the APIs troupe serves.
_MAX_FIELDS = re.compile(
    rb'"(?:max_tokens|max_completion_tokens|max_output_tokens|n_predict|num_predict)"'
    rb"\s*:\s*(-?\d+)"
)
_CHOICES = re.compile(rb'"n"\s*:\s*(\d+)')
BYTES_PER_TOKEN = 4  # the prompt's estimate: body bytes / 4 ...
TEMPLATE_TOKENS = 8  # ... plus this per message (``"role"``) and once for the request


@dataclass(frozen=True, slots=True)
class Cost:
    """What a request may spend: its prompt (estimated) and the most it may generate."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def estimate(body: bytes, default_max_tokens: int) -> Cost:
    """The cost of a request with JSON ``body`` (OpenAI's, llama.cpp's or Ollama's),
    read with two scans of the bytes (no parse). Several bound fields: the largest (a
    client cannot reserve less by naming a small one somewhere nested). A negative one
    (llama.cpp's -1: until the context is full) counts as absent."""
    bounds = [int(m) for m in _MAX_FIELDS.findall(body)]
    most = max((b for b in bounds if b >= 0), default=-1)
    completion = most if most >= 0 else default_max_tokens
    choices = max((int(m) for m in _CHOICES.findall(body)), default=1)
    completion *= max(1, choices)
    prompt = math.ceil(len(body) / BYTES_PER_TOKEN) + TEMPLATE_TOKENS * (1 + body.count(b'"role"'))
    return Cost(prompt, completion)


@dataclass(slots=True)
class _Bucket:
    """A token bucket: ``level`` units at ``stamp`` (wall-clock seconds)."""

    level: float
    stamp: float

    def refill(self, capacity: int, now: float) -> None:
        if now > self.stamp:
            self.level = min(float(capacity), self.level + (now - self.stamp) * capacity / MINUTE)
            self.stamp = now
        elif self.level > capacity:  # the limit was lowered by a reload
            self.level = float(capacity)

    def wait_for(self, need: float, capacity: int) -> float:
        """Seconds until the bucket holds ``need``."""
        return max(0.0, (need - self.level) * MINUTE / capacity)

    def until_full(self, capacity: int) -> float:
        return self.wait_for(capacity, capacity)


@dataclass(slots=True)
class _TenantState:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    day: int = 0
    day_used: int = 0  # settled tokens of ``day``
    day_reserved: int = 0  # reserved by requests not yet settled (carried over midnight)


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's limits and what is left of them, for the ``x-ratelimit-*`` headers
    (None: that limit is not set)."""

    limit_requests: int | None = None
    remaining_requests: int = 0
    reset_requests: float = 0.0  # seconds until the bucket is full again
    limit_tokens: int | None = None
    remaining_tokens: int = 0
    reset_tokens: float = 0.0
    limit_day: int | None = None
    remaining_day: int = 0
    reset_day: float = 0.0  # seconds until the next UTC midnight


@dataclass(frozen=True, slots=True)
class Reservation:
    tenant: str
    tokens: int  # reserved against the per-minute and daily token limits (0: none)


@dataclass(frozen=True, slots=True)
class Admitted:
    reservation: Reservation
    quota: Quota


# Why a request was refused: the metric's label, OpenAI's error type and code.
REASONS = {
    "requests_per_minute": ("requests", "rate_limit_exceeded"),
    "tokens_per_minute": ("tokens", "rate_limit_exceeded"),
    "in_flight": ("tokens", "rate_limit_exceeded"),
    "too_large": ("tokens", "rate_limit_exceeded"),
    "tokens_per_day": ("insufficient_quota", "insufficient_quota"),
}


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # a key of REASONS
    message: str
    retry_after: float
    quota: Quota
    retry: bool = True  # False: retrying cannot help soon (too large, the day is spent)

    @property
    def type(self) -> str:
        return REASONS[self.reason][0]

    @property
    def code(self) -> str:
        return REASONS[self.reason][1]


def limited(limits: Limits) -> bool:
    """The tenant has a rate limit or a budget (else nothing is counted for it here)."""
    return (
        limits.requests_per_minute is not None
        or limits.tokens_per_minute is not None
        or limits.tokens_per_day is not None
    )


def counts_tokens(limits: Limits) -> bool:
    """The tenant has a token limit: its requests' costs must be estimated."""
    return limits.tokens_per_minute is not None or limits.tokens_per_day is not None


@dataclass
class Budgets:
    """Every tenant's buckets and daily counter; the one writer is the HTTP edge's
    thread (`troupe.lease.Lease` admits, the end of the answer settles)."""

    _state: dict[str, _TenantState] = field(default_factory=dict)
    changed: bool = False  # since the last `to_json` (the writer saves only then)

    def admit(
        self, tenant: str, limits: Limits, cost: Cost | None, now: float
    ) -> Admitted | Refusal:
        """Check every limit of ``tenant`` and, if all admit, take one request and
        ``cost`` (None: the tenant has no token limit) from them, in one step."""
        state = self._refreshed(tenant, limits, now)
        need = cost.total if cost is not None else 0
        rpm, tpm, tpd = limits.requests_per_minute, limits.tokens_per_minute, limits.tokens_per_day
        if rpm is not None and state.requests is not None and state.requests.level < 1:
            wait = state.requests.wait_for(1, rpm)
            return self._refusal(
                "requests_per_minute", state, limits, now, wait,
                f"Rate limit reached for tenant '{tenant}' on requests per min (RPM): "
                f"Limit {rpm}, Remaining 0. Please try again in {_duration(wait)}.",
            )  # fmt: skip
        if tpm is not None and state.tokens is not None and need:
            if need > tpm:
                return self._refusal(
                    "too_large", state, limits, now, MINUTE,
                    f"Request too large for tenant '{tenant}' on tokens per min (TPM): "
                    f"Limit {tpm}, Requested {need} (the prompt's estimate plus max_tokens). "
                    "Ask for fewer tokens (max_tokens).",
                    retry=False,
                )  # fmt: skip
            if state.tokens.level < need:
                wait = state.tokens.wait_for(need, tpm)
                left = max(0, math.floor(state.tokens.level))
                return self._refusal(
                    "tokens_per_minute", state, limits, now, wait,
                    f"Rate limit reached for tenant '{tenant}' on tokens per min (TPM): "
                    f"Limit {tpm}, Remaining {left}, Requested {need}. "
                    f"Please try again in {_duration(wait)}.",
                )  # fmt: skip
        if tpd is not None and need:
            if state.day_used + need > tpd:
                wait = (state.day + 1) * DAY - now
                return self._refusal(
                    "tokens_per_day", state, limits, now, wait,
                    f"You exceeded your current quota: tenant '{tenant}' has used "
                    f"{state.day_used} of its {tpd} tokens for today (UTC); this request "
                    f"needs {need}. The budget renews at 00:00 UTC.",
                    retry=False,
                )  # fmt: skip
            if state.day_used + state.day_reserved + need > tpd:
                return self._refusal(
                    "in_flight", state, limits, now, 1.0,
                    f"Rate limit reached for tenant '{tenant}' on tokens per day: "
                    f"{state.day_reserved} tokens are reserved by requests in flight; "
                    f"Limit {tpd}, Used {state.day_used}, Requested {need}. "
                    "Please try again when they end.",
                )  # fmt: skip
        # Every limit admits: take them all (no await between the checks and this).
        if state.requests is not None:
            state.requests.level -= 1
        if need:
            if state.tokens is not None:
                state.tokens.level -= need
            if tpd is not None:
                state.day_reserved += need
        self.changed = True
        return Admitted(Reservation(tenant, need), self._quota(state, limits, now))

    def settle(
        self, reservation: Reservation, used: int | None, limits: Limits, now: float
    ) -> None:
        """The request ended: ``used`` tokens (prompt + generated, as the engine counted
        them) replace the reservation; None (unknown) keeps the reservation charged."""
        if not reservation.tokens:
            return
        state = self._refreshed(reservation.tenant, limits, now)
        spent = reservation.tokens if used is None else used
        if state.tokens is not None and limits.tokens_per_minute is not None:
            state.tokens.level = min(
                float(limits.tokens_per_minute), state.tokens.level + reservation.tokens - spent
            )
        state.day_reserved = max(0, state.day_reserved - reservation.tokens)
        state.day_used += spent
        self.changed = True

    def quota(self, tenant: str, limits: Limits, now: float) -> Quota:
        return self._quota(self._refreshed(tenant, limits, now), limits, now)

    # -- persistence -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The counters, to survive a restart. Tokens reserved by requests still in
        flight count as used (a crash charges them; a clean stop settled them first)."""
        self.changed = False
        out: dict[str, Any] = {}
        for name, state in self._state.items():
            entry: dict[str, Any] = {
                "day": state.day,
                "day_used": state.day_used + state.day_reserved,
            }
            if state.requests is not None:
                entry["requests"] = [state.requests.level, state.requests.stamp]
            if state.tokens is not None:
                entry["tokens"] = [state.tokens.level, state.tokens.stamp]
            out[name] = entry
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Budgets:
        """What `to_json` wrote; an entry that does not read is left out (a fresh start
        for that tenant, never a refusal to start)."""
        budgets = cls()
        for name, entry in data.items():
            try:
                state = _TenantState(day=int(entry["day"]), day_used=int(entry["day_used"]))
                if "requests" in entry:
                    state.requests = _Bucket(*(float(v) for v in entry["requests"]))
                if "tokens" in entry:
                    state.tokens = _Bucket(*(float(v) for v in entry["tokens"]))
            except (KeyError, TypeError, ValueError):
                continue
            budgets._state[str(name)] = state
        return budgets

    # -- inside ------------------------------------------------------------------------

    def _refreshed(self, tenant: str, limits: Limits, now: float) -> _TenantState:
        """``tenant``'s state brought to ``now`` under its current limits (a limit added
        by a reload starts full; one removed is dropped)."""
        state = self._state.get(tenant)
        if state is None:
            state = self._state[tenant] = _TenantState(day=int(now // DAY))
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if rpm is None:
            state.requests = None
        elif state.requests is None:
            state.requests = _Bucket(float(rpm), now)
        else:
            state.requests.refill(rpm, now)
        if tpm is None:
            state.tokens = None
        elif state.tokens is None:
            state.tokens = _Bucket(float(tpm), now)
        else:
            state.tokens.refill(tpm, now)
        today = int(now // DAY)
        if today > state.day:  # a new UTC day: in-flight reservations carry over
            state.day, state.day_used = today, 0
            self.changed = True
        return state

    def _quota(self, state: _TenantState, limits: Limits, now: float) -> Quota:
        rpm, tpm, tpd = limits.requests_per_minute, limits.tokens_per_minute, limits.tokens_per_day
        requests, tokens = state.requests, state.tokens
        return Quota(
            limit_requests=rpm,
            remaining_requests=max(0, math.floor(requests.level)) if requests else 0,
            reset_requests=requests.until_full(rpm) if requests and rpm else 0.0,
            limit_tokens=tpm,
            remaining_tokens=max(0, math.floor(tokens.level)) if tokens else 0,
            reset_tokens=tokens.until_full(tpm) if tokens and tpm else 0.0,
            limit_day=tpd,
            remaining_day=max(0, tpd - state.day_used - state.day_reserved) if tpd else 0,
            reset_day=(state.day + 1) * DAY - now,
        )

    def _refusal(
        self, reason: str, state: _TenantState, limits: Limits, now: float, wait: float,
        message: str, *, retry: bool = True,
    ) -> Refusal:  # fmt: skip
        return Refusal(reason, message, wait, self._quota(state, limits, now), retry)


def _duration(seconds: float) -> str:
    """OpenAI's way of writing a reset time: ``20ms``, ``1.5s``, ``6m0s``, ``2h3m0s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


def rate_headers(quota: Quota) -> list[tuple[bytes, bytes]]:
    """OpenAI's ``x-ratelimit-*`` headers for the limits ``quota`` has (and troupe's
    ``x-ratelimit-*-tokens-day`` for the daily budget)."""
    out: list[tuple[bytes, bytes]] = []
    if quota.limit_requests is not None:
        out += [
            (b"x-ratelimit-limit-requests", b"%d" % quota.limit_requests),
            (b"x-ratelimit-remaining-requests", b"%d" % quota.remaining_requests),
            (b"x-ratelimit-reset-requests", _duration(quota.reset_requests).encode()),
        ]
    if quota.limit_tokens is not None:
        out += [
            (b"x-ratelimit-limit-tokens", b"%d" % quota.limit_tokens),
            (b"x-ratelimit-remaining-tokens", b"%d" % quota.remaining_tokens),
            (b"x-ratelimit-reset-tokens", _duration(quota.reset_tokens).encode()),
        ]
    if quota.limit_day is not None:
        out += [
            (b"x-ratelimit-limit-tokens-day", b"%d" % quota.limit_day),
            (b"x-ratelimit-remaining-tokens-day", b"%d" % quota.remaining_day),
            (b"x-ratelimit-reset-tokens-day", _duration(quota.reset_day).encode()),
        ]
    return out
