"""The scheduler core's cost per event on the hot path: a lease taken and released on a
loaded model (the common case), with nobody waiting.

Pure core, no I/O: ``SchedulerCore.acquire`` + ``release`` in a loop, and a settle
alone on the same quiet table, timed in CPU time (``time.process_time``, best of
``--rounds``: on a shared machine wall time measures the neighbours); reports microseconds per
acquire+release pair, per settle, and how many settle rules ran per release
(``Settler.rules_run``, when the core counts them).

    .venv/bin/python bench/settle.py [--models N] [--pairs N] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from troupe.sched import ModelConfig, SchedulerCore


def loaded_core(models: int, *, fair: bool) -> SchedulerCore:
    core = SchedulerCore(
        [ModelConfig(f"m{i}") for i in range(models)],
        models,
        drain_after=30.0 if fair else None,
    )
    now = 1.0
    for i in range(models):
        core.load(10_000 + i, f"m{i}", now)
        m = core.table.models[f"m{i}"]
        core.spawned(m.name, m.gen, 20_000 + i, 30_000 + i, now)
        core.child_state(m.name, m.gen, "ready", {}, now)
    return core


def settles(core: SchedulerCore, n: int) -> float:
    """Seconds per settle of a quiet table (loaded models, nobody waiting)."""
    t0 = time.process_time()
    for _ in range(n):
        core.settler.settle(2.0)
    return (time.process_time() - t0) / n


def pairs(core: SchedulerCore, n: int, models: int) -> float:
    """Seconds per acquire + release on loaded models."""
    rid = 1
    t0 = time.process_time()
    for i in range(n):
        now = 2.0 + i * 1e-3
        core.acquire(rid, f"m{i % models}", now)
        core.release(rid, now)
        rid += 1
    return (time.process_time() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for fair in (False, True):
        times, alone = [], []
        per = ""
        for _ in range(args.rounds):
            core = loaded_core(args.models, fair=fair)
            before = getattr(core.settler, "rules_run", None)
            times.append(pairs(core, args.pairs, args.models))
            if before is not None:
                ran = core.settler.rules_run - before
                per = f", {ran / args.pairs:.2f} rules run per release"
            alone.append(settles(core, args.pairs))
        print(
            f"{'fair' if fair else 'upstream'} admission, {args.models} loaded models: "
            f"{min(times) * 1e6:.2f} us per acquire+release (median "
            f"{statistics.median(times) * 1e6:.2f}), {min(alone) * 1e6:.2f} us per quiet "
            f"settle (median {statistics.median(alone) * 1e6:.2f}){per}"
        )


if __name__ == "__main__":
    main()
