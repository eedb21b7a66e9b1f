"""What must hold after every scenario, checked from outside the router.

* every request answered exactly once, none hung past its bound (the `Ledger`);
* ``/health`` green and a real completion still served;
* nothing left running once every model is unloaded: no descendant of the router,
  no process carrying the scenario's tag (an orphan), no unreaped zombie;
* troupe's own facts (``GET /models`` -> ``troupe``): no request in flight or waiting,
  no queue entry, nothing stopping, for every unloaded model;
* the router's descriptors and RSS back to the baseline taken before the scenario.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil
import trio

from chaos.client import DOUBLE, GARBLED, HUNG, OK, Answer
from chaos.procs import alive, children_of, describe, tagged
from chaos.routers import Router

FD_SLACK = 8  # descriptors: a log file reopened, an SSE subscriber, the odd cache
RSS_SLACK_MIB = 24.0  # an allocator's high-water mark is not returned at once
RSS_SLACK_RATIO = 0.25
NEVER = (HUNG, DOUBLE, GARBLED)  # not acceptable for any request, in any scenario


@dataclass
class Record:
    group: str
    model: str | None
    answer: Answer


@dataclass
class Ledger:
    """Every request a scenario made, and what became of it."""

    records: list[Record] = field(default_factory=list)

    def add(self, group: str, answer: Answer, model: str | None = None) -> Answer:
        self.records.append(Record(group, model, answer))
        return answer

    def group(self, name: str) -> list[Answer]:
        return [r.answer for r in self.records if r.group == name]

    def count(self, name: str) -> Counter[str]:
        return Counter(a.kind for a in self.group(name))

    def summary(self, name: str) -> str:
        counts = self.count(name)
        return "/".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"

    def worst_s(self, name: str, kinds: Iterable[str] = (OK,)) -> float:
        wanted = set(kinds)
        return max((a.elapsed for a in self.group(name) if a.kind in wanted), default=0.0)

    def violations(self, name: str, allowed: Iterable[str]) -> list[str]:
        """Reasons, one per kind of answer not in ``allowed`` (NEVER kinds are reported by
        `never`, for every group)."""
        ok = set(allowed)
        bad: Counter[str] = Counter()
        example: dict[str, Answer] = {}
        for a in self.group(name):
            if a.kind not in ok and a.kind not in NEVER:
                bad[a.kind] += 1
                example.setdefault(a.kind, a)
        out = []
        for kind, n in bad.items():
            a = example[kind]
            what = f" {a.status}" if a.status else ""
            hint = a.error_message()[:70] if a.status else a.detail[:70]
            out.append(f"{name}: {n} {kind}{what} ({hint})")
        return out

    def never(self) -> list[str]:
        """Across all groups: hung, answered twice, or not HTTP."""
        out = []
        for group in sorted({r.group for r in self.records}):
            hits = [a for a in self.group(group) if a.kind in NEVER]
            if hits:
                kinds = Counter(a.kind for a in hits)
                bound = max(a.elapsed for a in hits)
                text = ", ".join(f"{n} {k}" for k, n in kinds.items())
                out.append(f"{group}: {text} (after {bound:.1f} s)")
        return out


@dataclass
class Baseline:
    fds: int
    rss: int


def baseline(router: Router) -> Baseline:
    return Baseline(router.fds(), router.rss())


def mib(n: int) -> float:
    return n / (1 << 20)


async def serving(router: Router, model: str, bound: float) -> list[str]:
    """``/health`` green and a real completion of ``model`` within ``bound``."""
    out = []
    health = await router.client.call("GET", "/health", bound=5)
    if health.kind != OK or health.json() != {"status": "ok"}:
        out.append(f"/health: {health.brief()} {health.body[:60]!r}")
    done = await router.client.completion(model, bound=bound, n=4)
    if done.kind != OK:
        out.append(f"completion after the scenario: {done.brief()} {done.error_message()[:60]}")
    return out


def troupe_facts(models: dict[str, dict[str, object]]) -> list[str]:
    """In-flight counts, waiters, queue entries and stops, for every unloaded model."""
    out = []
    for name, item in models.items():
        extra = item.get("troupe")
        status = item.get("status")
        if not isinstance(extra, dict) or not isinstance(status, dict):
            continue
        if status.get("value") != "unloaded":
            continue
        for key, zero in (("in_flight", 0), ("waiting", 0), ("queue_position", None),
                          ("stopping", False)):  # fmt: skip
            if key in extra and extra[key] != zero:
                out.append(f"{name}: {key}={extra[key]} while unloaded")
        memory = extra.get("memory")
        held = memory.get("held_bytes") if isinstance(memory, dict) else None
        if held:
            out.append(f"{name}: memory ledger holds {held} while unloaded")
    return out


def leftovers(router: Router) -> list[str]:
    """Descendants still alive, zombies unreaped, tagged processes outside the tree."""
    out = []
    router.tracker.sample()
    zombies: list[int] = []
    live: list[int] = []
    for pid in children_of(router.pid):
        try:
            status = psutil.Process(pid).status()
        except psutil.Error:
            continue
        (zombies if status == psutil.STATUS_ZOMBIE else live).append(pid)
    if zombies:
        out.append(f"{len(zombies)} unreaped zombie children")
    stragglers = [s.pid for s in router.tracker.survivors()]
    if stragglers:
        out.append(f"still running after unload: {describe(stragglers)}")
    orphans = [p for p in tagged(router.tag, exclude=[router.pid, *stragglers])]
    if orphans:
        out.append(f"orphans: {describe(orphans)}")
    return out


async def settle_fds(router: Router, base: Baseline, within: float) -> int:
    """The descriptor count, once it is back within the slack or ``within`` has passed."""
    deadline = time.monotonic() + within
    while True:
        fds = router.fds()
        if fds <= base.fds + FD_SLACK or time.monotonic() > deadline:
            return fds
        await trio.sleep(0.1)


def resources(base: Baseline, fds: int, rss: int) -> list[str]:
    out = []
    if fds > base.fds + FD_SLACK:
        out.append(f"descriptors {base.fds} -> {fds}")
    limit = base.rss + max(RSS_SLACK_MIB * (1 << 20), base.rss * RSS_SLACK_RATIO)
    if rss > limit:
        out.append(f"RSS {mib(base.rss):.0f} -> {mib(rss):.0f} MiB")
    return out


def orphans_after_exit(router: Router) -> list[str]:
    """Once the router has exited: nothing of it may remain."""
    router.tracker.sample()
    left = [s.pid for s in router.tracker.survivors() if s.pid != router.pid]
    left += [p for p in tagged(router.tag) if p not in left and p != router.pid]
    return [f"left running after the router exited: {describe(left)}"] if left else []


def still_alive(pids: Iterable[tuple[int, float | None]]) -> list[int]:
    return [pid for pid, created in pids if alive(pid, created)]
