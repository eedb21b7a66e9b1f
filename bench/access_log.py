"""What the access log costs the relay: troupe with ``--access-log off`` and ``on``,
side by side, in alternating rounds (a change in machine load hits both alike), on the
real engine and bench/proxy.py's tiny model and requests.

Prints, per scenario, the median over the rounds of troupe's CPU time per request and
of req/s for each, and the ratio on/off (the median of each round's ratio; 1.00: free).
The request record, the ring and the per-model metrics are built with the log off too:
on/off measures the log line.

    .venv/bin/python bench/access_log.py [--rounds 5] [--seconds 2] [--connections 1,8]
        [--baseline /path/to/other/checkout/src] [--sse-child]

``--baseline SRC`` adds troupe run from another source tree (main, before the access
record existed), so the table shows off/baseline and on/baseline too: the whole cost
of the record, without and with the log line. The CPU figure is troupe's own
utime+stime (/proc) over the requests of a round, so a loaded machine moves it far
less than req/s. ``--sse-child``: the child is bench/_sse_engine.py (answers at once,
so troupe's own work is most of each request) instead of the real engine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import _relay
import proxy
from _util import print_child_flags
from proxy import BASELINE, LOGGED, _process_stack, measure, scenarios, start_targets
from troupe.engine import find_engine


def paired(a: list[float], b: list[float]) -> float:
    """The median of round-by-round ratios (each round measures both back to back)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--connections", type=lambda t: [int(c) for c in t.split(",")], default=[1, 8])
    ap.add_argument("--baseline", type=Path, help="src/ of another checkout, measured too")
    ap.add_argument("--sse-child", action="store_true", help="bench/_sse_engine.py as child")
    args = ap.parse_args()
    print_child_flags(proxy.CHILD_ARGS)
    tmp = Path(tempfile.mkdtemp(prefix="troupe-bench-access-"))
    engine = _relay.write_engine(tmp) if args.sse_child else find_engine()[0]
    cpu: dict[tuple[str, str], list[float]] = {}
    rps: dict[tuple[str, str], list[float]] = {}
    chosen = [sc for sc in scenarios(args.connections) if sc.connections in args.connections]
    try:
        with _process_stack() as procs:
            targets = start_targets(
                procs,
                engine,
                tmp,
                False,
                access_log=True,
                only=frozenset({"troupe", LOGGED, BASELINE}),
                baseline=args.baseline,
            )
            for r in range(args.rounds):
                order = targets if r % 2 == 0 else targets[::-1]
                for sc in chosen:
                    for t in order:
                        f = measure(
                            t, sc, args.seconds, 0.5, use_wrk=shutil.which("wrk") is not None
                        )
                        cpu.setdefault((sc.label, t.name), []).append(
                            f.per_request_us(f.proxy_cpu_s)
                        )
                        rps.setdefault((sc.label, t.name), []).append(f.load.rps)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    child = "bench/_sse_engine.py" if args.sse_child else "the real engine"
    print(f"access log off vs on, median of {args.rounds} alternating rounds of {args.seconds:g} s"
          f", child: {child}; CPU: troupe's utime+stime per request")  # fmt: skip
    header = ["scenario", "CPU us/req off", "on", "on/off", "req/s off", "on", "on/off"]
    if args.baseline:
        header += ["CPU us/req baseline", "off/baseline", "on/baseline", "req/s baseline",
                   "on/baseline"]  # fmt: skip
    rows = []
    for sc in chosen:
        c_off = statistics.median(cpu[(sc.label, "troupe")])
        c_on = statistics.median(cpu[(sc.label, LOGGED)])
        r_off = statistics.median(rps[(sc.label, "troupe")])
        r_on = statistics.median(rps[(sc.label, LOGGED)])
        cpu_off, cpu_on = cpu[(sc.label, "troupe")], cpu[(sc.label, LOGGED)]
        rps_off, rps_on = rps[(sc.label, "troupe")], rps[(sc.label, LOGGED)]
        row = [sc.label, f"{c_off:.0f}", f"{c_on:.0f}", f"{paired(cpu_on, cpu_off):.3f}",
               f"{r_off:.0f}", f"{r_on:.0f}", f"{paired(rps_on, rps_off):.3f}"]  # fmt: skip
        if args.baseline:
            c_base = statistics.median(cpu[(sc.label, BASELINE)])
            r_base = statistics.median(rps[(sc.label, BASELINE)])
            cpu_base, rps_base = cpu[(sc.label, BASELINE)], rps[(sc.label, BASELINE)]
            row += [f"{c_base:.0f}", f"{paired(cpu_off, cpu_base):.3f}",
                    f"{paired(cpu_on, cpu_base):.3f}", f"{r_base:.0f}",
                    f"{paired(rps_on, rps_base):.3f}"]  # fmt: skip
        rows.append(row)
    proxy._table(rows, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
