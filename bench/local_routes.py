"""The routers' own routes: ``GET /health`` and ``GET /models``, troupe vs the C++ router.

These are answered by the router itself (no child): a health checker polls the
first, a dashboard or a client listing models the second. Both routers run as
separate processes over the same two tiny models (none loaded); for each route and
concurrency the two are measured back to back, in turns (``--rounds``), so a change
in machine load hits both alike. Printed: req/s, p50 and p99 of each, and the ratio
troupe / C++ router (a range over the rounds).

    .venv/bin/python bench/local_routes.py [--seconds S] [--connections 1,8] [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path

from _pair import ROUTERS, start_pair
from _util import HttpRequest, LoadResult, run_load, run_wrk
from troupe.engine import find_engine

ROUTES = ("/health", "/models")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine, _ = find_engine()
    use_wrk = shutil.which("wrk") is not None
    runner = run_wrk if use_wrk else run_load
    conns = [int(c) for c in args.connections.split(",")]
    results: dict[tuple[str, int, str], list[LoadResult]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        pair = start_pair(stack, engine, Path(tmp))
        for _ in range(args.rounds):
            for route in ROUTES:
                for c in conns:
                    for name in ROUTERS:
                        _, url = pair[name]
                        load = runner(url, HttpRequest("GET", route), c, args.seconds, 1.0)
                        results.setdefault((route, c, name), []).append(load)
    print(f"client: {'wrk' if use_wrk else 'built-in epoll client'}, {args.seconds:g} s each,"
          f" {args.rounds} rounds in turns")  # fmt: skip
    print(f"{'route':10} {'c':>3} {'router':11} {'req/s':>16} {'p50 ms':>7} {'p99 ms':>7}"
          f" {'errors':>6}")  # fmt: skip
    for route in ROUTES:
        for c in conns:
            for name in ROUTERS:
                runs = results[(route, c, name)]
                rps = sorted(r.rps for r in runs)
                best = max(runs, key=lambda r: r.rps)
                errors = sum(r.errors for r in runs)
                p50, p99 = best.p50_s * 1e3, best.p99_s * 1e3
                print(f"{route:10} {c:>3} {name:11} {rps[0]:>7.0f}-{rps[-1]:<8.0f}"
                      f" {p50:>7.2f} {p99:>7.2f} {errors:>6}")  # fmt: skip
            ours = [r.rps for r in results[(route, c, "troupe")]]
            theirs = [r.rps for r in results[(route, c, "C++ router")]]
            ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True) if b)
            if ratios:
                print(f"{'':15} troupe / C++ router: {ratios[0]:.2f}-{ratios[-1]:.2f}x")


if __name__ == "__main__":
    main()
